// The server's state and routes, shared by server.cpp (HTTP setup, guards,
// small routes) and completion_routes.cpp (the generating routes). Private
// to src/server.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/http_common.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request_fields.h"
#include "server/responses_store.h"
#include "server/server.h"
#include "text/chat_encoder.h"
#include "text/grammar_json.h"

namespace dsv4 {

struct AnthropicRequest;  // server/anthropic_format.h

struct Server::Impl {
  Impl(std::shared_ptr<Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer, text::EncoderProfile profile,
       ServerOptions options);

  std::shared_ptr<Engine> engine;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  text::EncoderProfile profile;
  text::RenderOptions render_options;
  ServerOptions opt;
  std::unique_ptr<HttpServer> http;
  ServerMetrics metrics;
  SeedSource seeds;
  std::atomic<bool> ready{false};
  // Finished Responses API responses (GET /v1/responses/{id}, previous_response_id).
  std::unique_ptr<ResponsesStore> responses_store;

  std::string model_name() const { return opt.served_model_name; }
  int64_t vocab_size() const { return engine->model().config().vocab_size; }
  text::JsonGrammarOptions grammar_options() const { return {opt.grammar_max_string_chars}; }
  void log(const std::string& level, const std::string& msg) const;

  // Engine submission of all of a request's choices at once (all or none),
  // with the engine's refusals as HTTP errors (a full queue: 503, an id in
  // use: 400).
  std::vector<std::shared_ptr<RequestHandle>> submit_all(std::vector<Engine::Submission> requests);
  // validate_request with the server's max_tokens policy; its refusals are 400s.
  ValidatedRequest validate(std::vector<int32_t> prompt, SamplingParams params, const char* length_name) const;

  // Routes: exact paths, or path prefixes (a trailing '*').
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  using BodyHandler = std::function<void(const std::string& body, HttpResponse&)>;
  struct Route {
    std::string method, path;
    bool open = false;  // answered without the API key (/health, /metrics)
    Handler handler;
  };
  std::vector<Route> routes;
  void get(const std::string& path, Handler h, bool open = false) { routes.push_back({"GET", path, open, h}); }
  void post(const std::string& path, BodyHandler h) {
    routes.push_back({"POST", path, false, [h](const HttpRequest& q, HttpResponse& r) { h(q.body, r); }});
  }

  // Every request: CORS, preflights, routing, the API key, the content type
  // of bodies, errors as JSON answers (server/router.cpp).
  void dispatch(const HttpRequest& req, HttpResponse& res);
  bool authorized(const HttpRequest& req) const;
  void setup_routes();
  // completion_routes.cpp
  void chat_completions(const std::string& raw, HttpResponse& res);
  void completions(const std::string& raw, HttpResponse& res);
  void generate(const std::string& raw, HttpResponse& res);
  // A checked chat request (or another API's request turned into one)
  // rendered with the model's encoder, its warnings logged, and tokenized;
  // `what` names the API in the 400 for a field the checks let through.
  std::vector<int32_t> chat_prompt(const ojson& chat, const char* what, text::RenderedPrompt& rendered);
  // anthropic_routes.cpp
  void anthropic_messages(const std::string& raw, HttpResponse& res);
  void anthropic_count_tokens(const std::string& raw, HttpResponse& res);
  std::vector<int32_t> anthropic_prompt(const AnthropicRequest& a, text::RenderedPrompt& rendered);
  // responses_routes.cpp
  void setup_responses_routes();
  void responses_create(const std::string& raw, HttpResponse& res);
};

}  // namespace dsv4
