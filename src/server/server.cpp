#include "server/server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/machine.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "text/request_parsing.h"
#include "text/utf8.h"

namespace dsv4 {
using ojson = nlohmann::ordered_json;

namespace {

// A request the client got wrong: HTTP 400 (or `status`) with this message.
struct BadRequest : std::runtime_error {
  int status;
  explicit BadRequest(const std::string& m, int s = 400) : std::runtime_error(m), status(s) {}
};

// How much of an oversize request body is read and thrown away before the
// connection is closed, so that ordinary clients get to read the 413.
uint64_t drain_limit_bytes(const ServerOptions& opt) {
  const uint64_t limit = uint64_t(opt.max_request_bytes);
  return limit > UINT64_MAX / 4 ? UINT64_MAX : limit * 4;
}

const char* error_type(int status) {
  switch (status) {
    case 400: return "BadRequest";
    case 401: return "Unauthorized";
    case 404: return "NotFound";
    case 413: return "PayloadTooLarge";
    case 503: return "ServiceUnavailable";
    default: return status >= 500 ? "InternalServerError" : "BadRequest";
  }
}

ojson error_body(int status, const std::string& message, const std::string& param = "") {
  // OpenAI's error shape.
  return {{"error", {{"message", message}, {"type", error_type(status)},
                     {"param", param.empty() ? ojson() : ojson(param)}, {"code", status}}}};
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(dump(error_body(status, message)), "application/json");
}

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(digits[rng() & 15]);
  return s;
}

int64_t unix_time() { return int64_t(std::time(nullptr)); }

// ---- request field readers (type errors become 400s naming the field) ----

double number_field(const ojson& j, const char* key, double fallback, double lo, double hi) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) throw BadRequest(std::string("'") + key + "' must be a number");
  double v = j[key].get<double>();
  if (!(v >= lo && v <= hi))
    throw BadRequest(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v;
}

int64_t int_field(const ojson& j, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer()) throw BadRequest(std::string("'") + key + "' must be an integer");
  int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi)
    throw BadRequest(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v;
}

bool bool_field(const ojson& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw BadRequest(std::string("'") + key + "' must be a boolean");
  return j[key].get<bool>();
}

std::vector<std::string> stop_field(const ojson& j) {
  std::vector<std::string> out;
  if (!j.contains("stop") || j["stop"].is_null()) return out;
  const ojson& s = j["stop"];
  if (s.is_string()) out.push_back(s.get<std::string>());
  else if (s.is_array()) {
    for (auto& v : s) {
      if (!v.is_string()) throw BadRequest("'stop' must be a string or a list of strings");
      out.push_back(v.get<std::string>());
    }
  } else {
    throw BadRequest("'stop' must be a string or a list of strings");
  }
  if (out.size() > 16) throw BadRequest("'stop' may hold at most 16 strings");
  return out;
}

std::vector<int32_t> id_list(const ojson& v, const char* what, int64_t vocab) {
  if (!v.is_array()) throw BadRequest(std::string("'") + what + "' must be a list of token ids");
  std::vector<int32_t> ids;
  for (auto& x : v) {
    if (!x.is_number_integer()) throw BadRequest(std::string("'") + what + "' must be a list of token ids");
    int64_t id = x.get<int64_t>();
    if (id < 0 || id >= vocab) throw BadRequest("token id " + std::to_string(id) + " in '" + what + "' is outside the vocabulary");
    ids.push_back(int32_t(id));
  }
  return ids;
}

}  // namespace

// ---------------------------------------------------------------- Impl ---

struct Server::Impl {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  text::EncoderProfile profile;
  text::RenderOptions render_options;
  ServerOptions opt;
  httplib::Server http;
  ServerMetrics metrics;
  std::atomic<uint64_t> request_counter{0};
  std::atomic<bool> ready{false};
  int listen_fd = -1;  // the socket httplib bound, to widen its accept queue

  std::string model_name() const { return opt.served_model_name; }

  void log(const std::string& level, const std::string& msg) {
    static const char* order[] = {"debug", "info", "warning", "error"};
    auto rank = [&](const std::string& l) {
      for (int i = 0; i < 4; ++i)
        if (l == order[i]) return i;
      return 1;
    };
    if (rank(level) < rank(opt.log_level)) return;
    std::fprintf(stderr, "[dsv4 %s] %s\n", level.c_str(), msg.c_str());
  }

  // Sampling parameters common to the OpenAI routes.
  SamplingParams sampling_from(const ojson& j, int64_t default_max_tokens) {
    SamplingParams p;
    p.temperature = float(number_field(j, "temperature", 1.0, 0.0, 100.0));
    p.top_p = float(number_field(j, "top_p", 1.0, 0.0, 1.0));
    if (j.contains("top_p") && j["top_p"].is_number() && p.top_p <= 0) throw BadRequest("'top_p' must be in (0, 1]");
    p.top_k = int_field(j, "top_k", -1, -1, int64_t(1) << 31);
    p.min_p = float(number_field(j, "min_p", 0.0, 0.0, 1.0));
    p.presence_penalty = float(number_field(j, "presence_penalty", 0.0, -2.0, 2.0));
    p.frequency_penalty = float(number_field(j, "frequency_penalty", 0.0, -2.0, 2.0));
    p.repetition_penalty = float(number_field(j, "repetition_penalty", 1.0, 0.01, 10.0));
    p.min_new_tokens = int_field(j, "min_tokens", 0, 0, int64_t(1) << 40);
    p.ignore_eos = bool_field(j, "ignore_eos", false);
    if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null())
      p.stop_token_ids = id_list(j["stop_token_ids"], "stop_token_ids", engine->model().config().vocab_size);
    p.max_new_tokens = default_max_tokens;
    if (j.contains("seed") && !j["seed"].is_null()) {
      if (!j["seed"].is_number_integer()) throw BadRequest("'seed' must be an integer");
      p.seed = j["seed"].get<uint64_t>();
    } else {
      // Deterministic mode: the same request gives the same tokens; otherwise
      // a fresh seed per request (still reproducible from --random-seed).
      p.seed = opt.deterministic ? 42 : opt.random_seed ^ (0x9E3779B97F4A7C15ull * ++request_counter);
    }
    return p;
  }

  int64_t max_tokens_from(const ojson& j, const char* key, int64_t prompt_len, int64_t fallback) {
    const int64_t ctx = engine->context_length();
    int64_t v = int_field(j, key, fallback, 1, int64_t(1) << 40);
    if (v > ctx) throw BadRequest(std::string(key) + " (" + std::to_string(v) + ") is too large: the context length is " +
                                  std::to_string(ctx) + " tokens");
    return std::min(v, std::max<int64_t>(1, ctx - prompt_len));
  }

  std::shared_ptr<RequestHandle> submit(const std::string& id, const std::vector<int32_t>& prompt,
                                        const SamplingParams& p) {
    try {
      return engine->submit(id, prompt, p);
    } catch (const QueueFullError& e) {
      throw BadRequest(e.what(), 503);
    } catch (const Error& e) {
      throw BadRequest(e.what());
    }
  }

  ojson parse_body(const std::string& body) {
    if (body.empty()) throw BadRequest("the request body is empty; expected a JSON object");
    if (!text::utf8::is_valid(body)) throw BadRequest("the request body is not valid UTF-8");
    ojson j;
    try {
      j = ojson::parse(body);
    } catch (const std::exception& e) {
      throw BadRequest(std::string("malformed JSON: ") + e.what());
    }
    if (!j.is_object()) throw BadRequest("the request body must be a JSON object");
    return j;
  }

  // The API key is checked inside the handlers, not in httplib's pre-routing
  // hook: that hook answers before httplib reads the request body, and the
  // unread body stays in the socket, where the next request of the kept-alive
  // connection is parsed from it (a 400 "request failed"). Node 18's fetch
  // sends a body in its own segment after the headers, so a wrong-key request
  // followed by a right-key one on the same connection failed that way.
  bool authorized(const httplib::Request& req) const {
    if (opt.api_key.empty() || req.path == "/health" || req.path == "/health_generate" || req.path == "/metrics")
      return true;
    return req.get_header_value("Authorization") == "Bearer " + opt.api_key;
  }

  static void send_unauthorized(httplib::Response& res) {
    send_error(res, 401, "Unauthorized: a valid API key is required (Authorization: Bearer ...)");
  }

  // Wraps a handler: errors become JSON error responses, never crashes.
  template <class F>
  httplib::Server::Handler guarded(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req)) return send_unauthorized(res);
      try {
        f(req, res);
      } catch (const BadRequest& e) {
        if (e.status == 503) res.set_header("Retry-After", "1");
        send_error(res, e.status, e.what());
      } catch (const text::EncoderError& e) {
        send_error(res, 400, e.what());
      } catch (const std::exception& e) {
        log("error", std::string("internal error on ") + req.path + ": " + e.what());
        send_error(res, 500, std::string("internal error: ") + e.what());
      }
    };
  }

  // POST routes read their body themselves, so that a body past the size
  // limit is refused while it arrives (chunked uploads included) instead of
  // being buffered whole. An oversize body is still read to its end and
  // discarded, up to drain_limit_bytes(): closing while the client is still
  // writing makes it fail with EPIPE/ECONNRESET before it ever reads the 413.
  // A declared length past that is answered at once without reading it
  // (draining gigabytes would tie up an HTTP thread).
  template <class F>
  httplib::Server::HandlerWithContentReader guarded_body(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      auto refuse = [&](int status, const std::string& message) {
        send_error(res, status, message);
        res.set_header("Connection", "close");
      };
      const std::string too_large_message =
          "the request body is too large (limit " + std::to_string(opt.max_request_bytes) + " bytes)";
      const std::string declared = req.get_header_value("Content-Length");
      const uint64_t declared_bytes = declared.empty() ? 0 : std::strtoull(declared.c_str(), nullptr, 10);
      // Without the right key the body is drained unread (never buffered),
      // so that the connection stays usable for the client's next request.
      const bool allowed = authorized(req);
      if (declared_bytes > drain_limit_bytes(opt)) {
        if (allowed) return refuse(413, too_large_message);
        send_unauthorized(res);
        res.set_header("Connection", "close");
        return;
      }
      std::string body;
      bool too_large = declared_bytes > uint64_t(opt.max_request_bytes);
      uint64_t received = 0;
      const bool complete = reader([&](const char* data, size_t len) {
        received += len;
        if (!allowed) return received <= drain_limit_bytes(opt);
        if (too_large || body.size() + len > size_t(opt.max_request_bytes)) {
          too_large = true;
          body.clear();
          body.shrink_to_fit();
          return received <= drain_limit_bytes(opt);
        }
        body.append(data, len);
        return true;
      });
      if (!allowed) {
        send_unauthorized(res);
        if (!complete) res.set_header("Connection", "close");
        return;
      }
      if (!complete && !too_large)
        return refuse(400, "the request body could not be read (connection closed or malformed chunked encoding)");
      if (too_large) return refuse(413, too_large_message);
      guarded([&](const httplib::Request&, httplib::Response& r) { f(body, r); })(req, res);
    };
  }

  // ---- streaming plumbing ----

  // Waits for events of any of the choices; false when nothing came within
  // `timeout` seconds.
  static bool wait_any(std::vector<std::unique_ptr<ChoiceStream>>& choices,
                       std::vector<std::vector<TokenEvent>>& events, double timeout) {
    bool any = false;
    const double slice = choices.size() > 1 ? 0.02 : timeout;
    double deadline = now_seconds() + timeout;
    do {
      for (size_t i = 0; i < choices.size(); ++i)
        if (!choices[i]->finished() && choices[i]->handle().wait(events[i], choices.size() > 1 ? 0.0 : slice))
          any = true;
      if (any) return true;
      if (choices.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } while (now_seconds() < deadline);
    return any;
  }

  // SSE comment line when nothing was written for keepalive_seconds, so that
  // clients and proxies do not time out during a long prefill.
  bool keep_alive(httplib::DataSink& sink, bool got_events, double& last_write) {
    if (got_events || now_seconds() - last_write < opt.keepalive_seconds) return true;
    static const char line[] = ": keep-alive\n\n";
    if (!sink.write(line, sizeof line - 1)) return false;
    last_write = now_seconds();
    return true;
  }

  static bool end_stream(httplib::DataSink& sink) {
    static const char done[] = "data: [DONE]\n\n";
    sink.write(done, sizeof done - 1);
    sink.done();
    return true;
  }

  static bool all_finished(const std::vector<std::unique_ptr<ChoiceStream>>& choices) {
    for (auto& c : choices)
      if (!c->finished()) return false;
    return true;
  }

  void record(const ChoiceStream& c, bool aborted) {
    RequestTimes t = const_cast<ChoiceStream&>(c).handle().times();
    metrics.observe_request(t, c.completion_tokens(), aborted);
  }

  using Choices = std::vector<std::unique_ptr<ChoiceStream>>;

  // Non-streaming answer. The body is sent once every choice is done, but
  // through a chunked response: while waiting, a space (JSON whitespace) goes
  // out every second, so a client that went away is noticed by the failing
  // write and its requests are cancelled at once.
  void respond_when_done(httplib::Response& res, std::shared_ptr<Choices> shared,
                         std::function<ojson(Choices&)> build) {
    res.set_chunked_content_provider("application/json", [this, shared, build](size_t, httplib::DataSink& sink) {
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
          if (!sink.write(" ", 1) || !sink.is_writable()) {
            for (auto& c : choices) c->handle().cancel(), record(*c, true);
            return false;
          }
          last_ping = now_seconds();
        }
      }
      for (auto& c : choices) record(*c, c->reason() == FinishReason::Abort);
      std::string body;
      try {
        body = dump(build(choices));
      } catch (const std::exception& e) {
        body = dump(error_body(500, e.what()));
      }
      sink.write(body.data(), body.size());
      sink.done();
      return true;
    });
  }

  // ---- chat completions ----

  ojson chat_logprobs(const std::vector<SampledToken>& tokens) {
    ojson content = ojson::array();
    auto entry = [&](int32_t id, float lp) {
      std::string bytes(tokenizer->token_bytes(id));
      ojson b = ojson::array();
      for (unsigned char ch : bytes) b.push_back(int(ch));
      return ojson{{"token", text::utf8::to_valid_lossy(bytes)}, {"logprob", lp}, {"bytes", b}};
    };
    for (auto& t : tokens) {
      ojson e = entry(t.token, t.logprob);
      ojson top = ojson::array();
      for (auto& [id, lp] : t.top) top.push_back(entry(id, lp));
      e["top_logprobs"] = top;
      content.push_back(e);
    }
    return {{"content", content}};
  }

  static std::string finish_reason_for(const ChoiceStream& c, const std::string& parser_reason) {
    if (c.reason() == FinishReason::Length) return "length";
    if (c.reason() == FinishReason::Abort || c.reason() == FinishReason::Error) return "abort";
    if (parser_reason == "tool_calls") return "tool_calls";
    return "stop";
  }

  static text::StopReason parser_stop(const ChoiceStream& c) {
    switch (c.reason()) {
      case FinishReason::Length: return text::StopReason::Length;
      case FinishReason::Abort: case FinishReason::Error: return text::StopReason::Abort;
      default: return text::StopReason::Stop;
    }
  }

  ojson matched_stop(const ChoiceStream& c) {
    if (c.matched_stop_string) return *c.matched_stop_string;
    if (c.matched_stop_token) return *c.matched_stop_token;
    return nullptr;
  }

  ojson usage_json(int64_t prompt, int64_t completion, int64_t cached) {
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  void chat_completions(const std::string& raw, httplib::Response& res) {
    ojson body = parse_body(raw);
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      throw BadRequest("'messages' must be a non-empty list");
    for (auto& m : body["messages"])
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw BadRequest("every message must be an object with a string 'role'");
    if (body.contains("model") && !body["model"].is_string()) throw BadRequest("'model' must be a string");
    const std::string model = body.value("model", model_name());
    const int64_t n = int_field(body, "n", 1, 1, 16);
    const bool stream = bool_field(body, "stream", false);
    bool include_usage = false;
    if (body.contains("stream_options") && body["stream_options"].is_object())
      include_usage = bool_field(body["stream_options"], "include_usage", false);
    const bool want_logprobs = bool_field(body, "logprobs", false);
    const int64_t top_logprobs = int_field(body, "top_logprobs", 0, 0, 20);
    if (top_logprobs > 0 && !want_logprobs) throw BadRequest("'top_logprobs' requires 'logprobs': true");
    // tool_choice checks (serving.md §2.7).
    const bool has_tools = body.contains("tools") && body["tools"].is_array() && !body["tools"].empty();
    if (body.contains("tools") && !body["tools"].is_null() && !body["tools"].is_array())
      throw BadRequest("'tools' must be a list");
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
      const ojson& tc = body["tool_choice"];
      if (tc.is_string()) {
        std::string v = tc.get<std::string>();
        if (v != "none" && v != "auto" && v != "required") throw BadRequest("'tool_choice' must be none, auto, required or a function");
        if (v == "required" && !has_tools) throw BadRequest("Tools cannot be empty if tool choice is set to required.");
      } else if (tc.is_object()) {
        std::string name = tc.contains("function") && tc["function"].is_object() ? tc["function"].value("name", "") : "";
        bool found = false;
        if (has_tools)
          for (auto& t : body["tools"])
            if (t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].value("name", "") == name) found = true;
        if (!found) throw BadRequest("tool_choice names function '" + name + "', which is not in 'tools'");
      } else {
        throw BadRequest("'tool_choice' must be a string or an object");
      }
    }

    text::RenderedPrompt rendered = text::render_chat_request(body, profile, render_options);
    for (auto& w : rendered.warnings) log("warning", w);
    std::vector<int32_t> prompt = tokenizer->encode(rendered.prompt);
    const int64_t ctx = engine->context_length();
    if (int64_t(prompt.size()) >= ctx)
      throw BadRequest("The input (" + std::to_string(prompt.size()) + " tokens) is longer than the model's context length (" +
                       std::to_string(ctx) + " tokens).");
    const char* max_key = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                              ? "max_completion_tokens" : "max_tokens";
    SamplingParams params = sampling_from(body, max_tokens_from(body, max_key, int64_t(prompt.size()), ctx));
    params.top_logprobs = want_logprobs ? top_logprobs : 0;
    const std::vector<std::string> stops = stop_field(body);
    text::ParserConfig parser_cfg = text::parser_config_for_request(
        body, profile, rendered.starts_in_reasoning, opt.reasoning_parser, opt.tool_call_parser);

    const std::string id = body.contains("rid") && body["rid"].is_string() ? body["rid"].get<std::string>()
                                                                            : "chatcmpl-" + random_hex(24);
    std::vector<std::unique_ptr<ChoiceStream>> choices;
    std::vector<text::OutputParser> parsers;
    for (int64_t i = 0; i < n; ++i) {
      SamplingParams pi = params;
      pi.seed = params.seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;  // choice i: its own stream
      std::string rid = n == 1 ? id : id + "-" + std::to_string(i);
      auto handle = submit(rid, prompt, pi);
      choices.push_back(std::make_unique<ChoiceStream>(handle, tokenizer, stops, false));
      parsers.emplace_back(parser_cfg);
    }
    const int64_t created = unix_time();
    const int64_t prompt_tokens = int64_t(prompt.size());

    if (!stream) {
      respond_when_done(res, std::make_shared<Choices>(std::move(choices)),
                        [this, parser_cfg, n, want_logprobs, id, created, model, prompt_tokens](Choices& choices) {
        ojson out_choices = ojson::array();
        int64_t completion = 0, cached = 0;
        for (int64_t i = 0; i < n; ++i) {
          ChoiceStream& c = *choices[size_t(i)];
          text::ParsedMessage msg = text::parse_output(parser_cfg, c.text(), parser_stop(c));
          completion += c.completion_tokens();
          cached = std::max(cached, c.handle().cached_tokens());
          if (c.reason() == FinishReason::Error) throw std::runtime_error(c.error());
          ojson message = {{"role", "assistant"},
                           {"content", msg.content ? ojson(*msg.content) : ojson()},
                           {"reasoning_content", msg.reasoning_content ? ojson(*msg.reasoning_content) : ojson()}};
          if (!msg.tool_calls.empty()) {
            ojson calls = ojson::array();
            for (size_t k = 0; k < msg.tool_calls.size(); ++k)
              calls.push_back({{"id", msg.tool_calls[k].id}, {"index", int(k)}, {"type", "function"},
                               {"function", {{"name", msg.tool_calls[k].name}, {"arguments", msg.tool_calls[k].arguments}}}});
            message["tool_calls"] = calls;
          } else {
            message["tool_calls"] = nullptr;
          }
          out_choices.push_back({{"index", i}, {"message", message},
                                 {"logprobs", want_logprobs ? chat_logprobs(c.sampled()) : ojson()},
                                 {"finish_reason", finish_reason_for(c, msg.finish_reason)},
                                 {"matched_stop", matched_stop(c)}});
        }
        return ojson{{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                     {"choices", out_choices}, {"usage", usage_json(prompt_tokens, completion, cached)}};
      });
      return;
    }

    // Streaming: SSE chunks; the role first, then reasoning/content/tool-call
    // deltas, then the finish chunk per choice, optional usage, [DONE].
    auto shared = std::make_shared<std::tuple<std::vector<std::unique_ptr<ChoiceStream>>, std::vector<text::OutputParser>>>(
        std::move(choices), std::move(parsers));
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, shared, id, model, created, n, include_usage, want_logprobs, prompt_tokens](size_t, httplib::DataSink& sink) {
          auto& [choices, parsers] = *shared;
          auto send = [&](const ojson& j) {
            std::string s = "data: " + dump(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          auto chunk = [&](int64_t index, ojson delta, ojson finish, ojson logprobs = ojson()) {
            ojson choice = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                            {"finish_reason", std::move(finish)}};
            return ojson{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                         {"choices", ojson::array({choice})}};
          };
          auto abort_all = [&] {
            for (auto& c : choices) c->handle().cancel();
            for (auto& c : choices) record(*c, true);
          };
          for (int64_t i = 0; i < n; ++i)
            if (!send(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr))) return abort_all(), false;
          std::vector<std::vector<TokenEvent>> events(choices.size());
          std::vector<bool> closed(choices.size(), false);
          double last_write = now_seconds();
          while (true) {
            bool got = wait_any(choices, events, 0.5);
            if (!sink.is_writable()) return abort_all(), false;
            if (!keep_alive(sink, got, last_write)) return abort_all(), false;
            for (size_t i = 0; i < choices.size(); ++i) {
              if (closed[i]) continue;
              ChoiceStream& c = *choices[i];
              for (auto& e : events[i]) {
                size_t before = c.sampled().size();
                std::string piece = c.apply(e);
                text::ParserDelta d = parsers[i].feed(piece);
                if (c.finished()) d.append(parsers[i].finish(parser_stop(c)));
                ojson logprobs;
                if (want_logprobs && c.sampled().size() > before)
                  logprobs = chat_logprobs(std::vector<SampledToken>(c.sampled().begin() + int64_t(before), c.sampled().end()));
                if (!d.empty() || !logprobs.is_null()) {
                  ojson delta = ojson::object();
                  if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
                  if (!d.content.empty()) delta["content"] = d.content;
                  if (!d.tool_calls.empty()) {
                    ojson calls = ojson::array();
                    for (auto& t : d.tool_calls) {
                      ojson call = {{"index", t.index}};
                      if (t.id) call["id"] = *t.id, call["type"] = "function";
                      ojson fn = ojson::object();
                      if (t.name) fn["name"] = *t.name;
                      fn["arguments"] = t.arguments;
                      call["function"] = fn;
                      calls.push_back(call);
                    }
                    delta["tool_calls"] = calls;
                  }
                  if (!send(chunk(int64_t(i), delta, nullptr, logprobs))) return abort_all(), false;
                  last_write = now_seconds();
                }
                if (c.finished()) {
                  if (c.reason() == FinishReason::Error || parsers[i].message().stream_error) {
                    std::string msg = c.reason() == FinishReason::Error ? c.error()
                                      : "malformed tool call after its header was streamed: " +
                                        parsers[i].message().tool_call_error.value_or("");
                    send(error_body(500, msg));
                  }
                  ojson fin = chunk(int64_t(i), ojson::object(), finish_reason_for(c, parsers[i].message().finish_reason));
                  fin["choices"][0]["matched_stop"] = matched_stop(c);
                  if (!send(fin)) return abort_all(), false;
                  closed[i] = true;
                  record(c, c.reason() == FinishReason::Abort);
                  break;
                }
              }
              events[i].clear();
            }
            if (all_finished(choices)) break;
          }
          if (include_usage) {
            int64_t completion = 0, cached = 0;
            for (auto& c : choices) completion += c->completion_tokens(), cached = std::max(cached, c->handle().cached_tokens());
            send({{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                  {"choices", ojson::array()}, {"usage", usage_json(prompt_tokens, completion, cached)}});
          }
          return end_stream(sink);
        });
  }

  // ---- completions (raw prompts, no parsers) ----

  std::vector<std::vector<int32_t>> prompts_from(const ojson& p, const char* key) {
    const int64_t vocab = engine->model().config().vocab_size;
    std::vector<std::vector<int32_t>> out;
    if (p.is_string()) {
      out.push_back(tokenizer->encode(p.get<std::string>()));
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      out.push_back(id_list(p, key, vocab));
    } else if (p.is_array() && !p.empty()) {
      for (auto& item : p) {
        if (item.is_string()) out.push_back(tokenizer->encode(item.get<std::string>()));
        else if (item.is_array()) out.push_back(id_list(item, key, vocab));
        else throw BadRequest(std::string("'") + key + "' must be a string, a list of strings or token ids");
      }
    } else {
      throw BadRequest(std::string("'") + key + "' must be a non-empty string, a list of strings or token ids");
    }
    for (auto& ids : out)
      if (ids.empty()) throw BadRequest(std::string("'") + key + "' holds an empty prompt");
    return out;
  }

  void completions(const std::string& raw, httplib::Response& res) {
    ojson body = parse_body(raw);
    if (!body.contains("prompt")) throw BadRequest("'prompt' is required");
    const std::string model = body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : model_name();
    std::vector<std::vector<int32_t>> prompts = prompts_from(body["prompt"], "prompt");
    const int64_t n = int_field(body, "n", 1, 1, 16);
    const bool stream = bool_field(body, "stream", false);
    const bool echo = bool_field(body, "echo", false);
    const int64_t logprobs_k = body.contains("logprobs") && !body["logprobs"].is_null() ? int_field(body, "logprobs", 0, 0, 20) : -1;
    bool include_usage = body.contains("stream_options") && body["stream_options"].is_object() &&
                         bool_field(body["stream_options"], "include_usage", false);
    const std::vector<std::string> stops = stop_field(body);
    const std::string id = "cmpl-" + random_hex(24);
    std::vector<std::unique_ptr<ChoiceStream>> choices;
    std::vector<std::string> echoes;
    int64_t prompt_tokens = 0;
    for (auto& prompt : prompts) {
      const int64_t ctx = engine->context_length();
      if (int64_t(prompt.size()) >= ctx)
        throw BadRequest("The input (" + std::to_string(prompt.size()) + " tokens) is longer than the model's context length (" +
                         std::to_string(ctx) + " tokens).");
      SamplingParams p = sampling_from(body, max_tokens_from(body, "max_tokens", int64_t(prompt.size()), 16));
      p.top_logprobs = std::max<int64_t>(logprobs_k, 0);
      prompt_tokens += int64_t(prompt.size());
      for (int64_t i = 0; i < n; ++i) {
        SamplingParams pi = p;
        pi.seed = p.seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
        auto h = submit(id + "-" + std::to_string(choices.size()), prompt, pi);
        choices.push_back(std::make_unique<ChoiceStream>(h, tokenizer, stops, true));
        echoes.push_back(echo ? tokenizer->decode(prompt) : "");
      }
    }
    const int64_t created = unix_time();
    auto logprobs_json = [&](const std::vector<SampledToken>& toks) {
      ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array();
      for (auto& t : toks) {
        tokens.push_back(text::utf8::to_valid_lossy(tokenizer->token_bytes(t.token)));
        lps.push_back(t.logprob);
        ojson top = ojson::object();
        for (auto& [tid, lp] : t.top) top[text::utf8::to_valid_lossy(tokenizer->token_bytes(tid))] = lp;
        tops.push_back(top);
      }
      return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}};
    };
    auto reason_of = [](const ChoiceStream& c) -> std::string {
      return c.reason() == FinishReason::Length ? "length" : (c.reason() == FinishReason::Abort || c.reason() == FinishReason::Error) ? "abort" : "stop";
    };
    if (!stream) {
      respond_when_done(res, std::make_shared<Choices>(std::move(choices)),
                        [=, this](Choices& choices) {
        ojson out = ojson::array();
        int64_t completion = 0, cached = 0;
        for (size_t i = 0; i < choices.size(); ++i) {
          ChoiceStream& c = *choices[i];
          if (c.reason() == FinishReason::Error) throw std::runtime_error(c.error());
          completion += c.completion_tokens();
          cached += c.handle().cached_tokens();
          out.push_back({{"index", i}, {"text", echoes[i] + c.text()},
                         {"logprobs", logprobs_k >= 0 ? logprobs_json(c.sampled()) : ojson()},
                         {"finish_reason", reason_of(c)}, {"matched_stop", matched_stop(c)}});
        }
        return ojson{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                     {"choices", out}, {"usage", usage_json(prompt_tokens, completion, cached)}};
      });
      return;
    }
    auto shared = std::make_shared<std::vector<std::unique_ptr<ChoiceStream>>>(std::move(choices));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
      auto& choices = *shared;
      auto send = [&](const ojson& j) {
        std::string s = "data: " + dump(j) + "\n\n";
        return sink.write(s.data(), s.size());
      };
      auto abort_all = [&] {
        for (auto& c : choices) c->handle().cancel(), record(*c, true);
      };
      std::vector<std::vector<TokenEvent>> events(choices.size());
      std::vector<bool> echoed(choices.size(), false);
      double last_write = now_seconds();
      while (!all_finished(choices)) {
        bool got = wait_any(choices, events, 0.5);
        if (!sink.is_writable()) return abort_all(), false;
        if (!keep_alive(sink, got, last_write)) return abort_all(), false;
        for (size_t i = 0; i < choices.size(); ++i) {
          ChoiceStream& c = *choices[i];
          for (auto& e : events[i]) {
            size_t before = c.sampled().size();
            std::string piece = c.apply(e);
            if (!echoed[i]) piece = echoes[i] + piece, echoed[i] = true;
            ojson lp;
            if (logprobs_k >= 0 && c.sampled().size() > before)
              lp = logprobs_json(std::vector<SampledToken>(c.sampled().begin() + int64_t(before), c.sampled().end()));
            ojson choice = {{"index", i}, {"text", piece}, {"logprobs", lp},
                            {"finish_reason", c.finished() ? ojson(reason_of(c)) : ojson()}};
            if (c.finished()) choice["matched_stop"] = matched_stop(c);
            if (!piece.empty() || c.finished() || !lp.is_null()) {
              if (!send({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                         {"choices", ojson::array({choice})}}))
                return abort_all(), false;
              last_write = now_seconds();
            }
            if (c.finished()) {
              record(c, c.reason() == FinishReason::Abort);
              break;
            }
          }
          events[i].clear();
        }
      }
      if (include_usage) {
        int64_t completion = 0, cached = 0;
        for (auto& c : choices) completion += c->completion_tokens(), cached += c->handle().cached_tokens();
        send({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
              {"choices", ojson::array()}, {"usage", usage_json(prompt_tokens, completion, cached)}});
      }
      return end_stream(sink);
    });
  }

  // ---- SGLang native /generate ----

  void generate(const std::string& raw, httplib::Response& res) {
    ojson body = parse_body(raw);
    std::vector<std::vector<int32_t>> prompts;
    bool batched = false;
    if (body.contains("input_ids") && !body["input_ids"].is_null()) {
      batched = body["input_ids"].is_array() && !body["input_ids"].empty() && body["input_ids"][0].is_array();
      prompts = prompts_from(body["input_ids"], "input_ids");
    } else if (body.contains("text") && !body["text"].is_null()) {
      batched = body["text"].is_array();
      prompts = prompts_from(body["text"], "text");
    } else {
      throw BadRequest("either 'text' or 'input_ids' is required");
    }
    ojson sp = body.contains("sampling_params") && body["sampling_params"].is_object() ? body["sampling_params"] : ojson::object();
    if (sp.contains("sampling_seed") && !sp.contains("seed")) sp["seed"] = sp["sampling_seed"];
    const bool stream = bool_field(body, "stream", false);
    const bool return_logprob = bool_field(body, "return_logprob", false);
    const int64_t top_n = int_field(body, "top_logprobs_num", 0, 0, 20);
    const bool skip_special = bool_field(sp, "skip_special_tokens", true);
    const std::vector<std::string> stops = stop_field(sp);
    const std::string base_id = body.contains("rid") && body["rid"].is_string() ? body["rid"].get<std::string>() : random_hex(32);
    std::vector<std::unique_ptr<ChoiceStream>> choices;
    for (size_t k = 0; k < prompts.size(); ++k) {
      const int64_t ctx = engine->context_length();
      if (int64_t(prompts[k].size()) >= ctx)
        throw BadRequest("The input (" + std::to_string(prompts[k].size()) + " tokens) is longer than the model's context length (" +
                         std::to_string(ctx) + " tokens).");
      SamplingParams p = sampling_from(sp, max_tokens_from(sp, "max_new_tokens", int64_t(prompts[k].size()), 128));
      p.min_new_tokens = int_field(sp, "min_new_tokens", 0, 0, int64_t(1) << 40);
      p.top_logprobs = return_logprob ? top_n : 0;
      std::string rid = prompts.size() == 1 ? base_id : base_id + "-" + std::to_string(k);
      choices.push_back(std::make_unique<ChoiceStream>(submit(rid, prompts[k], p), tokenizer, stops, skip_special));
    }
    auto result = [this, return_logprob, top_n](ChoiceStream& c) {
      RequestTimes t = c.handle().times();
      ojson finish = nullptr;
      if (c.finished()) {
        finish = {{"type", finish_reason_name(c.reason() == FinishReason::Error ? FinishReason::Abort : c.reason())},
                  {"matched", matched_stop(c)}};
        if (!c.error().empty()) finish["message"] = c.error();
      }
      ojson meta = {{"id", c.handle().id()}, {"finish_reason", finish},
                    {"prompt_tokens", c.handle().prompt_tokens()}, {"completion_tokens", c.completion_tokens()},
                    {"cached_tokens", c.handle().cached_tokens()},
                    {"e2e_latency", (t.finished > 0 ? t.finished : now_seconds()) - t.submitted}};
      if (return_logprob) {
        ojson lp = ojson::array(), top = ojson::array();
        for (auto& s : c.sampled()) {
          lp.push_back(ojson::array({s.logprob, s.token, nullptr}));
          ojson alts = ojson::array();
          for (auto& [tid, v] : s.top) alts.push_back(ojson::array({v, tid, nullptr}));
          top.push_back(alts);
        }
        meta["output_token_logprobs"] = lp;
        if (top_n > 0) meta["output_top_logprobs"] = top;
      }
      return ojson{{"text", c.text()}, {"output_ids", c.output_ids()}, {"meta_info", meta}};
    };
    if (!stream) {
      respond_when_done(res, std::make_shared<Choices>(std::move(choices)), [result, batched](Choices& choices) {
        if (!batched) return result(*choices[0]);
        ojson all = ojson::array();
        for (auto& c : choices) all.push_back(result(*c));
        return all;
      });
      return;
    }
    auto shared = std::make_shared<std::vector<std::unique_ptr<ChoiceStream>>>(std::move(choices));
    res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
      auto& choices = *shared;
      std::vector<std::vector<TokenEvent>> events(choices.size());
      double last_write = now_seconds();
      while (!all_finished(choices)) {
        bool got = wait_any(choices, events, 0.5);
        if (!sink.is_writable()) {
          for (auto& c : choices) c->handle().cancel(), record(*c, true);
          return false;
        }
        if (!keep_alive(sink, got, last_write)) {
          for (auto& c : choices) c->handle().cancel(), record(*c, true);
          return false;
        }
        for (size_t i = 0; i < choices.size(); ++i) {
          if (events[i].empty()) continue;
          for (auto& e : events[i]) choices[i]->apply(e);
          events[i].clear();
          ojson r = result(*choices[i]);  // cumulative text, like SGLang
          if (batched) r["index"] = i;
          std::string s = "data: " + dump(r) + "\n\n";
          if (!sink.write(s.data(), s.size())) {
            for (auto& c : choices) c->handle().cancel(), record(*c, true);
            return false;
          }
          last_write = now_seconds();
          if (choices[i]->finished()) record(*choices[i], choices[i]->reason() == FinishReason::Abort);
        }
      }
      return end_stream(sink);
    });
  }

  // ---- small routes ----

  ojson model_card() {
    return {{"id", model_name()}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "dsv4.cpp"},
            {"root", opt.model_path}, {"max_model_len", engine->context_length()}};
  }

  void setup_routes() {
    http.Post("/v1/chat/completions", guarded_body([this](const std::string& b, httplib::Response& r) { chat_completions(b, r); }));
    http.Post("/v1/completions", guarded_body([this](const std::string& b, httplib::Response& r) { completions(b, r); }));
    http.Post("/generate", guarded_body([this](const std::string& b, httplib::Response& r) { generate(b, r); }));
    http.Put("/generate", guarded_body([this](const std::string& b, httplib::Response& r) { generate(b, r); }));
    http.Get("/v1/models", guarded([this](auto&, auto& r) {
      r.set_content(dump({{"object", "list"}, {"data", ojson::array({model_card()})}}), "application/json");
    }));
    http.Get(R"(/v1/models/(.+))", guarded([this](const httplib::Request& q, httplib::Response& r) {
      if (q.matches[1] != model_name()) throw BadRequest("The model '" + std::string(q.matches[1]) + "' does not exist", 404);
      r.set_content(dump(model_card()), "application/json");
    }));
    http.Get("/health", [this](auto&, httplib::Response& r) {
      r.status = ready ? 200 : 503;
      r.set_content("", "text/plain");
    });
    http.Get("/health_generate", guarded([this](auto&, httplib::Response& r) {
      SamplingParams p;
      p.temperature = 0;
      p.max_new_tokens = 1;
      auto h = engine->submit("health-" + random_hex(8), {int32_t(engine->model().config().bos_token_id)}, p);
      std::vector<TokenEvent> ev;
      double deadline = now_seconds() + 20;
      bool done = false;
      while (!done && now_seconds() < deadline) {
        h->wait(ev, 0.5);
        for (auto& e : ev) done = done || e.finished;
        ev.clear();
      }
      if (!done) h->cancel();
      r.status = done ? 200 : 503;
      r.set_content("", "text/plain");
    }));
    http.Get("/get_model_info", guarded([this](auto&, auto& r) {
      const ModelConfig& c = engine->model().config();
      r.set_content(dump({{"model_path", opt.model_path}, {"tokenizer_path", opt.model_path},
                          {"is_generation", true}, {"preferred_sampling_params", nullptr},
                          {"weight_version", "default"}, {"model_type", c.model_type},
                          {"architectures", ojson::array({c.architecture})},
                          {"encoder_profile", std::string(text::profile_name(profile))}}),
                     "application/json");
    }));
    auto server_info = guarded([this](auto&, auto& r) {
      EngineMetrics m = engine->metrics();
      const EngineOptions& eo = engine->options();
      r.set_content(dump({{"model_path", opt.model_path}, {"served_model_name", model_name()},
                          {"host", opt.host}, {"port", opt.port}, {"context_length", engine->context_length()},
                          {"max_running_requests", eo.max_running_requests},
                          {"max_total_num_tokens", eo.max_total_tokens}, {"chunked_prefill_size", eo.chunked_prefill_size},
                          {"max_req_input_len", engine->context_length() - 1},
                          {"reasoning_parser", opt.reasoning_parser}, {"tool_call_parser", opt.tool_call_parser},
                          {"enable_deterministic_inference", opt.deterministic}, {"random_seed", opt.random_seed},
                          {"server_args", opt.server_args},
                          {"internal_states", ojson::array({{{"last_gen_throughput", m.gen_throughput},
                                                              {"num_running_reqs", m.running},
                                                              {"num_queue_reqs", m.queued},
                                                              {"prefix_cache_entries", m.prefix_cache_entries},
                                                              {"prefix_cache_bytes", m.prefix_cache_bytes}}})},
                          {"version", "dsv4.cpp 0.1"}}),
                     "application/json");
    });
    http.Get("/get_server_info", server_info);
    http.Get("/server_info", server_info);
    auto flush = guarded([this](auto&, httplib::Response& r) {
      if (engine->flush_cache()) {
        malloc_trim(0);  // hand the freed prefix-cache memory back to the OS now, not at the next idle step
        r.set_content("Cache flushed.\n", "text/plain");
      } else {
        r.status = 400;
        r.set_content("Cache not flushed: requests are running or waiting.\n", "text/plain");
      }
    });
    http.Get("/flush_cache", flush);
    http.Post("/flush_cache", guarded_body([flush](const std::string&, httplib::Response& r) {
      httplib::Request none;
      flush(none, r);
    }));
    http.Post("/abort_request", guarded_body([this](const std::string& raw, httplib::Response& r) {
      ojson body = parse_body(raw);
      if (bool_field(body, "abort_all", false)) {
        int64_t n = engine->abort_all();
        r.set_content(dump({{"aborted", n}}), "application/json");
        return;
      }
      if (!body.contains("rid") || !body["rid"].is_string()) throw BadRequest("'rid' (string) or 'abort_all': true is required");
      std::string rid = body["rid"].get<std::string>();
      bool found = engine->abort(rid);
      for (int i = 0; i < 16 && !found; ++i) found = engine->abort(rid + "-" + std::to_string(i));
      if (!found) throw BadRequest("no running or waiting request with rid '" + rid + "'", 404);
      r.set_content(dump({{"aborted", 1}}), "application/json");
    }));
    http.Get("/metrics", [this](auto&, httplib::Response& r) {
      r.set_content(metrics.render(engine->metrics(), model_name()), "text/plain; version=0.0.4");
    });
    http.Get("/get_load", guarded([this](auto&, auto& r) {
      EngineMetrics m = engine->metrics();
      r.set_content(dump(ojson::array({{{"dp_rank", 0}, {"num_reqs", m.running + m.queued},
                                        {"num_waiting_reqs", m.queued}, {"num_tokens", m.used_tokens}}})),
                    "application/json");
    }));
    http.Post("/tokenize", guarded_body([this](const std::string& raw, httplib::Response& r) {
      ojson body = parse_body(raw);
      if (!body.contains("prompt") || !body["prompt"].is_string()) throw BadRequest("'prompt' (string) is required");
      auto ids = tokenizer->encode(body["prompt"].get<std::string>());
      r.set_content(dump({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine->context_length()}}), "application/json");
    }));
    http.Post("/detokenize", guarded_body([this](const std::string& raw, httplib::Response& r) {
      ojson body = parse_body(raw);
      if (!body.contains("tokens")) throw BadRequest("'tokens' is required");
      auto ids = id_list(body["tokens"], "tokens", int64_t(tokenizer->vocab_size()));
      r.set_content(dump({{"text", tokenizer->decode(std::vector<text::TokenId>(ids.begin(), ids.end()))}}), "application/json");
    }));
  }
};

Server::Server(std::shared_ptr<Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
               text::EncoderProfile profile, ServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.engine = std::move(engine);
  s.tokenizer = std::move(tokenizer);
  s.profile = profile;
  s.render_options = text::RenderOptions::from_environment(profile);
  s.opt = std::move(options);
  s.http.new_task_queue = [n = s.opt.http_threads] { return new httplib::ThreadPool(size_t(n)); };
  s.http.set_payload_max_length(size_t(std::min<uint64_t>(drain_limit_bytes(s.opt), SIZE_MAX)));
  // httplib (Debian's libcpp-httplib 0.11.4) listens with a backlog of 5,
  // compiled into the library. A burst of connects (64 streaming clients at
  // once) overflows that accept queue: the kernel falls back to SYN cookies,
  // drops handshakes (ListenOverflows), and when a client's first data
  // segment is dropped too, its next segment fails the cookie check and is
  // answered with a RST: the client sees ECONNRESET. Remember the socket
  // here; run() listens on it again with the system's maximum backlog.
  s.http.set_socket_options([&s](socket_t sock) {
    httplib::default_socket_options(sock);
    s.listen_fd = int(sock);
  });
  s.http.set_read_timeout(60, 0);
  s.http.set_write_timeout(60, 0);
  s.http.set_pre_routing_handler([](const httplib::Request&, httplib::Response& res) {
    res.set_header("Access-Control-Allow-Origin", "*");
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.http.set_error_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    // Unknown routes (httplib has read their body by now) answer 401, not
    // 404, to a client without the key, as the routes do.
    if (!s.authorized(req)) return Impl::send_unauthorized(res);
    if (res.status == 404) send_error(res, 404, "no route " + req.method + " " + req.path);
    else if (res.status == 413) send_error(res, 413, "the request body is too large");
    else if (res.status >= 400) send_error(res, res.status, "request failed");
  });
  s.http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });
  s.setup_routes();
}

Server::~Server() { stop(); }

bool Server::run() {
  Impl& s = *impl_;
  if (s.opt.port == 0) {
    bound_port_ = s.http.bind_to_any_port(s.opt.host);
    if (bound_port_ <= 0) return false;
  } else {
    if (!s.http.bind_to_port(s.opt.host, s.opt.port)) return false;
    bound_port_ = s.opt.port;
  }
  // listen() on a listening socket only resizes its queue (Linux); the kernel
  // caps SOMAXCONN at net.core.somaxconn.
  if (s.listen_fd >= 0 && ::listen(s.listen_fd, SOMAXCONN) != 0)
    s.log("warning", std::string("could not enlarge the listen backlog: ") + std::strerror(errno));
  s.ready = true;
  std::printf("dsv4 serving %s on http://%s:%d (OpenAI API at /v1)\n", s.model_name().c_str(), s.opt.host.c_str(), bound_port_);
  std::fflush(stdout);
  return s.http.listen_after_bind();
}

void Server::stop() {
  if (impl_) {
    impl_->ready = false;
    impl_->http.stop();
  }
}

}  // namespace dsv4
