// Delivering generated choices over HTTP: one server-sent-events loop for
// every streaming route (waiting on the engine, keep-alive comments,
// cancelling on disconnect, metrics, [DONE]), with a per-route formatter
// that turns engine events into that route's chunks; and the non-streaming
// answer sent once every choice is done.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/http_common.h"
#include "server/metrics.h"

namespace dsv4 {

using Choices = std::vector<std::unique_ptr<ChoiceStream>>;

// One route's wire format for a stream.
class SseFormatter {
 public:
  // Sends one `data: <json>` event; false once the client is gone.
  using Send = std::function<bool(const ojson&)>;
  virtual ~SseFormatter() = default;
  // Chunks before any token (chat's role chunks).
  virtual bool open(const Send&) { return true; }
  // The events of choice i that arrived since the last call (never empty);
  // applies them to `choice` and sends its chunks.
  virtual bool events(size_t i, ChoiceStream& choice, const std::vector<TokenEvent>& events, const Send& send) = 0;
  // After every choice finished, before [DONE] (a usage chunk).
  virtual void close(const Send&) {}
  // The wire text of one event, of a keep-alive, and of the end of the
  // stream (OpenAI's: `data:` lines, an SSE comment, `data: [DONE]`; empty
  // writes nothing).
  virtual std::string frame(const ojson& j) const { return "data: " + dump(j) + "\n\n"; }
  virtual std::string keepalive() const { return ": keep-alive\n\n"; }
  virtual std::string done() const { return "data: [DONE]\n\n"; }
};

void stream_events(HttpResponse& res, std::shared_ptr<Choices> choices, std::shared_ptr<SseFormatter> format,
                   ServerMetrics& metrics, double keepalive_seconds);

// Non-streaming answer: build(choices) once every choice is done.
void respond_when_done(HttpResponse& res, std::shared_ptr<Choices> choices, std::function<ojson(Choices&)> build,
                       ServerMetrics& metrics);

}  // namespace dsv4
