// The server's state and routes, shared by server.cpp (HTTP setup, guards,
// small routes) and completion_routes.cpp (the generating routes). Private
// to src/server.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "server/http_common.h"
#include "server/metrics.h"
#include "server/request_fields.h"
#include "server/server.h"

namespace dsv4 {

struct Server::Impl {
  Impl(std::shared_ptr<Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer, text::EncoderProfile profile,
       ServerOptions options);

  std::shared_ptr<Engine> engine;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  text::EncoderProfile profile;
  text::RenderOptions render_options;
  ServerOptions opt;
  httplib::Server http;
  ServerMetrics metrics;
  SeedSource seeds;
  std::atomic<bool> ready{false};
  int listen_fd = -1;  // the socket httplib bound, to widen its accept queue

  std::string model_name() const { return opt.served_model_name; }
  int64_t vocab_size() const { return engine->model().config().vocab_size; }
  void log(const std::string& level, const std::string& msg) const;

  // Engine submission with the engine's refusals as HTTP errors (a full
  // queue: 503).
  std::shared_ptr<RequestHandle> submit(const std::string& id, const std::vector<int32_t>& prompt,
                                        const SamplingParams& p);

  bool authorized(const httplib::Request& req) const;
  using Route = std::function<void(const httplib::Request&, httplib::Response&)>;
  using BodyRoute = std::function<void(const std::string& body, httplib::Response&)>;
  // Route wrappers: the API key, errors as JSON answers; guarded_body also
  // reads the body under the size limit.
  httplib::Server::Handler guarded(Route f);
  httplib::Server::HandlerWithContentReader guarded_body(BodyRoute f);

  void setup_routes();
  // completion_routes.cpp
  void chat_completions(const std::string& raw, httplib::Response& res);
  void completions(const std::string& raw, httplib::Response& res);
  void generate(const std::string& raw, httplib::Response& res);
};

}  // namespace dsv4
