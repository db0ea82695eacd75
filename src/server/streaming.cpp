#include "server/streaming.h"

#include <chrono>
#include <thread>

#include "core/machine.h"

namespace dsv4 {

namespace {

// Waits for events of any of the choices; false when nothing came within
// `timeout` seconds.
bool wait_any(Choices& choices, std::vector<std::vector<TokenEvent>>& events, double timeout) {
  bool any = false;
  const double slice = choices.size() > 1 ? 0.02 : timeout;
  double deadline = now_seconds() + timeout;
  do {
    for (size_t i = 0; i < choices.size(); ++i)
      if (!choices[i]->finished() && choices[i]->handle().wait(events[i], choices.size() > 1 ? 0.0 : slice)) any = true;
    if (any) return true;
    if (choices.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (now_seconds() < deadline);
  return any;
}

bool all_finished(const Choices& choices) {
  for (auto& c : choices)
    if (!c->finished()) return false;
  return true;
}

void record(ServerMetrics& metrics, ChoiceStream& c, bool aborted) {
  metrics.observe_request(c.handle().times(), c.completion_tokens(), aborted);
}

// The client went away (or a write failed): its requests stop taking engine
// time at once.
void cancel_all(ServerMetrics& metrics, Choices& choices) {
  for (auto& c : choices) c->handle().cancel();
  for (auto& c : choices) record(metrics, *c, true);
}

}  // namespace

void stream_events(HttpResponse& res, std::shared_ptr<Choices> shared, std::shared_ptr<SseFormatter> format,
                   ServerMetrics& metrics, double keepalive_seconds) {
  res.set_stream("text/event-stream", [shared, format, &metrics, keepalive_seconds](ResponseStream& sink) {
    Choices& choices = *shared;
    double last_write = now_seconds();
    const SseFormatter::Send send = [&](const ojson& j) {
      const std::string s = format->frame(j);
      if (!sink.write(s)) return false;
      last_write = now_seconds();
      return true;
    };
    if (!format->open(send)) return cancel_all(metrics, choices);
    std::vector<std::vector<TokenEvent>> events(choices.size());
    while (!all_finished(choices)) {
      const bool got = wait_any(choices, events, 0.5);
      if (!sink.alive()) return cancel_all(metrics, choices);
      // An SSE comment when nothing was written for keepalive_seconds, so
      // that clients and proxies do not time out during a long prefill.
      if (!got && now_seconds() - last_write >= keepalive_seconds) {
        if (!sink.write(format->keepalive())) return cancel_all(metrics, choices);
        last_write = now_seconds();
      }
      for (size_t i = 0; i < choices.size(); ++i) {
        if (events[i].empty()) continue;
        if (!format->events(i, *choices[i], events[i], send)) return cancel_all(metrics, choices);
        events[i].clear();
        // wait_any skips finished choices, so this runs once per choice.
        if (choices[i]->finished()) record(metrics, *choices[i], choices[i]->reason() == FinishReason::Abort);
      }
    }
    format->close(send);
    const std::string end = format->done();
    if (!end.empty()) sink.write(end);
  });
}

// The body goes out once every choice is done, but through a chunked
// response: while waiting, a space (JSON whitespace) goes out every second,
// so a client that went away is noticed by the failing write and its
// requests are cancelled at once.
void respond_when_done(HttpResponse& res, std::shared_ptr<Choices> shared, std::function<ojson(Choices&)> build,
                       ServerMetrics& metrics) {
  res.set_stream("application/json", [shared, build, &metrics](ResponseStream& sink) {
    Choices& choices = *shared;
    std::vector<std::vector<TokenEvent>> events(choices.size());
    double last_ping = now_seconds();
    while (!all_finished(choices)) {
      wait_any(choices, events, 0.25);
      for (size_t i = 0; i < choices.size(); ++i) {
        for (auto& e : events[i]) choices[i]->apply(e);
        events[i].clear();
      }
      if (now_seconds() - last_ping >= 1.0 && !all_finished(choices)) {
        if (!sink.write(" ") || !sink.alive()) {
          for (auto& c : choices) c->handle().cancel(), record(metrics, *c, true);
          return;
        }
        last_ping = now_seconds();
      }
    }
    for (auto& c : choices) record(metrics, *c, c->reason() == FinishReason::Abort);
    std::string body;
    try {
      body = dump(build(choices));
    } catch (const std::exception& e) {
      body = dump(error_body(500, e.what()));
    }
    sink.write(body);
  });
}

}  // namespace dsv4
