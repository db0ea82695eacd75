// OpenAI's Responses API: POST /v1/responses (whole or streamed),
// GET / DELETE /v1/responses/{id} and POST /v1/responses/{id}/cancel. The
// request becomes a chat request (responses_format.h), rendered and parsed
// exactly as /v1/chat/completions renders and parses it; the answer is a
// Response object of output items (reasoning, message, function_call),
// streamed as the API's typed events, and kept in the bounded store
// (responses_store.h) unless the request says store: false.
#include "server/responses_format.h"
#include "server/responses_store.h"
#include "server/responses_stream.h"
#include "server/server_impl.h"
#include "server/streaming.h"
#include "server/structured_output.h"
#include "text/request_parsing.h"

namespace dsv4 {

namespace {

// One response in flight: what its final Response object is built from, and
// where it goes once finished.
struct ResponseJob {
  ResponsesRequest request;
  std::string id;
  int64_t created_at = 0, prompt_tokens = 0;
  // The chat messages before this response's output (previous responses'
  // turns and this request's input, without the instructions).
  ojson conversation;
  bool report_cached = false;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  ResponsesStore* store = nullptr;

  // completed, incomplete (max_output_tokens) or failed (an engine error, an
  // abort: /abort_request, shutdown; or, when streamed, a tool call that
  // turned out malformed after its header went out: unstreamed, such a call
  // is only text, like in a chat completion).
  static std::string status_of(const ChoiceStream& c, const text::ParsedMessage& msg, bool streamed) {
    if (c.reason() == FinishReason::Error || c.reason() == FinishReason::Abort || (streamed && msg.stream_error))
      return "failed";
    if (c.reason() == FinishReason::Length) return "incomplete";
    return "completed";
  }
  static std::string failure_of(const ChoiceStream& c, const text::ParsedMessage& msg) {
    if (c.reason() == FinishReason::Error) return c.error();
    if (c.reason() == FinishReason::Abort) return "the request was aborted (abort_request or server shutdown)";
    return "malformed tool call after its header was streamed: " + msg.tool_call_error.value_or("");
  }

  // The in_progress object of response.created / response.in_progress.
  ojson in_progress() const { return response_object(request, id, created_at, "in_progress", ojson::array(), nullptr); }

  // The final Response object, stored unless store: false. The reasoning
  // token count re-tokenizes the reasoning text (the engine counts tokens,
  // not which part of the answer they went to).
  ojson finish(ChoiceStream& c, const std::string& status, const std::string& failure, ojson items,
               const std::string& reasoning) {
    const int64_t reasoning_tokens = reasoning.empty() ? 0 : int64_t(tokenizer->encode(reasoning).size());
    const int64_t cached = report_cached ? std::min(c.handle().cached_tokens(), prompt_tokens) : 0;
    ojson usage = responses_usage(prompt_tokens, c.completion_tokens(), cached, reasoning_tokens);
    ojson history = conversation;
    history.push_back(assistant_message(items));
    ojson response = response_object(request, id, created_at, status, std::move(items), std::move(usage), failure);
    if (request.store) store->put(id, {response, std::move(history)});
    return response;
  }
};

// The typed stream (responses_stream.h) on the shared SSE loop: named
// events, no [DONE].
class ResponsesFormat : public SseFormatter {
 public:
  std::shared_ptr<ResponseJob> job;
  std::unique_ptr<text::OutputParser> parser;
  std::unique_ptr<ResponsesEventStream> stream;

  std::string frame(const ojson& j) const override {
    return "event: " + j["type"].get<std::string>() + "\ndata: " + dump(j) + "\n\n";
  }
  std::string done() const override { return ""; }

  bool open(const Send& send) override {
    stream = std::make_unique<ResponsesEventStream>(send);
    return stream->open(job->in_progress());
  }

  bool events(size_t, ChoiceStream& c, const std::vector<TokenEvent>& evs, const Send&) override {
    for (auto& e : evs) {
      text::ParserDelta d = parser->feed(c.apply(e));
      if (c.finished()) d.append(parser->finish(parser_stop(c)));
      if (!stream->delta(d)) return false;
      if (!c.finished()) continue;
      const text::ParsedMessage& msg = parser->message();
      const std::string status = ResponseJob::status_of(c, msg, true);
      const std::string failure = status == "failed" ? ResponseJob::failure_of(c, msg) : "";
      if (!stream->close_items(status == "incomplete" ? "incomplete" : "completed")) return false;
      // Stored before the client hears of it, so that a GET right after the
      // final event finds it.
      return stream->finish(job->finish(c, status, failure, stream->items(), stream->reasoning()), failure);
    }
    return true;
  }
};

// The {id} of /v1/responses/{id}[suffix]; empty when the path is not that.
std::string response_id(const std::string& path, const std::string& suffix) {
  static const std::string prefix = "/v1/responses/";
  if (path.size() <= prefix.size() + suffix.size() || path.compare(0, prefix.size(), prefix) != 0) return "";
  if (path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) return "";
  const std::string id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
  return id.find('/') == std::string::npos ? id : "";
}

[[noreturn]] void not_stored(const std::string& id) {
  throw BadRequest("no stored response with id '" + id +
                       "' (never made, made with store: false, deleted, evicted from the store, or still in progress)",
                   404);
}

}  // namespace

void Server::Impl::responses_create(const std::string& raw, HttpResponse& res) {
  const ojson body = parse_body(raw);
  auto job = std::make_shared<ResponseJob>();
  job->request = responses_request(body);
  ResponsesRequest& r = job->request;
  if (r.model.empty()) r.model = model_name();
  ojson history = ojson::array();
  if (!r.previous_response_id.empty()) {
    std::optional<StoredResponse> previous = responses_store->get(r.previous_response_id);
    if (!previous)
      throw BadRequest("'previous_response_id': no stored response with id '" + r.previous_response_id +
                       "' (made with store: false, deleted, evicted from the store, or unknown)");
    history = std::move(previous->messages);
  }
  const ojson chat = responses_chat_body(r, history);
  check_chat_request(chat);
  check_tool_choice(chat);
  text::RenderedPrompt rendered;
  std::vector<int32_t> prompt = chat_prompt(chat, "responses", rendered);
  // Without max_output_tokens a response may take what the context leaves.
  const bool max_given = r.max_output_tokens > 0;
  SamplingParams params =
      sampling_field(r.sampling, max_given ? r.max_output_tokens : engine->context_length(), 0, seeds);
  params.max_new_tokens_explicit = max_given;
  job->prompt_tokens = int64_t(prompt.size());
  const text::ParserConfig parser_cfg = text::parser_config_for_request(chat, profile, rendered.starts_in_reasoning,
                                                                        opt.reasoning_parser, opt.tool_call_parser);
  // text.format (as response_format) and tool_choice constrain decoding as on chat.
  params.constraint = chat_constraint(chat, tokenizer, parser_cfg, rendered.starts_in_reasoning, grammar_options());
  const ValidatedRequest checked = validate(std::move(prompt), params, "max_output_tokens");
  job->id = "resp_" + random_hex(32);
  job->created_at = unix_time();
  job->conversation = std::move(history);
  for (const ojson& m : r.input_messages) job->conversation.push_back(m);
  job->report_cached = opt.enable_cache_report;
  job->tokenizer = tokenizer;
  job->store = responses_store.get();

  auto choices = std::make_shared<Choices>();
  std::vector<Engine::Submission> submissions;
  submissions.push_back({job->id, checked});
  for (auto& handle : submit_all(std::move(submissions)))
    choices->push_back(std::make_unique<ChoiceStream>(handle, tokenizer, std::vector<std::string>{}, false));

  if (r.stream) {
    auto format = std::make_shared<ResponsesFormat>();
    format->job = job;
    format->parser = std::make_unique<text::OutputParser>(parser_cfg);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    stream_events(res, choices, format, metrics, opt.keepalive_seconds);
    return;
  }
  auto build = [job, parser_cfg](Choices& cs) {
    ChoiceStream& c = *cs.at(0);
    const text::ParsedMessage msg = text::parse_output(parser_cfg, c.text(), parser_stop(c));
    const std::string status = ResponseJob::status_of(c, msg, false);
    const std::string failure = status == "failed" ? ResponseJob::failure_of(c, msg) : "";
    ojson items = output_items(msg, status == "incomplete" ? "incomplete" : "completed");
    return job->finish(c, status, failure, std::move(items), msg.reasoning_content.value_or(""));
  };
  respond_when_done(res, choices, build, metrics);
}

void Server::Impl::setup_responses_routes() {
  post("/v1/responses", [this](const std::string& b, HttpResponse& r) { responses_create(b, r); });
  get("/v1/responses/*", [this](const HttpRequest& q, HttpResponse& r) {
    const std::string id = response_id(q.path, "");
    if (id.empty()) throw BadRequest("no route GET " + q.path + " (input_items listing is not supported)", 404);
    if (q.target.find("stream=true") != std::string::npos)
      throw BadRequest("'stream': streaming a stored response is not supported (background responses only)");
    std::optional<StoredResponse> stored = responses_store->get(id);
    if (!stored) not_stored(id);
    r.set_content(dump(stored->response), "application/json");
  });
  routes.push_back(
      {"DELETE", "/v1/responses/*", false, [this](const HttpRequest& q, HttpResponse& r) {
         const std::string id = response_id(q.path, "");
         if (id.empty() || !responses_store->erase(id)) not_stored(id.empty() ? q.path : id);
         r.set_content(dump({{"id", id}, {"object", "response.deleted"}, {"deleted", true}}), "application/json");
       }});
  // Only background responses can be cancelled (as OpenAI and vLLM answer);
  // this server runs none, so a stored one is a 400 and any other id a 404.
  // A foreground request stops when its client disconnects.
  routes.push_back({"POST", "/v1/responses/*", false, [this](const HttpRequest& q, HttpResponse&) {
                      const std::string id = response_id(q.path, "/cancel");
                      if (id.empty()) throw BadRequest("no route POST " + q.path, 404);
                      if (!responses_store->get(id)) not_stored(id);
                      throw BadRequest("response '" + id +
                                       "' cannot be cancelled: only background responses can be, and this server "
                                       "runs none (background: true is refused)");
                    }});
}

}  // namespace dsv4
