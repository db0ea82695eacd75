#include "server/server.h"

#include <malloc.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/machine.h"
#include "server/server_impl.h"

namespace dsv4 {

namespace {

// The command line as /get_server_info shows it: the values of secret-looking
// options (--api-key and any option named with key, token, secret, password,
// credential or auth as a word) replaced by "<redacted>".
ojson redacted_server_args(const std::vector<std::string>& args) {
  static const char* secret_words[] = {"key",    "keys",       "token",       "secret",        "secrets", "password",
                                       "passwd", "credential", "credentials", "authorization", "auth",    "cookie"};
  ojson out = ojson::array();
  for (const std::string& arg : args) {
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    bool secret = false;
    size_t start = 0;
    while (start <= name.size() && !secret) {
      size_t end = name.find_first_of("-_,", start);
      if (end == std::string::npos) end = name.size();
      std::string word = name.substr(start, end - start);
      for (char& c : word) c = char(std::tolower(static_cast<unsigned char>(c)));
      for (const char* w : secret_words) secret = secret || word == w;
      start = end + 1;
    }
    out.push_back(secret && eq != std::string::npos ? name + "=<redacted>" : arg);
  }
  return out;
}

}  // namespace

Server::Impl::Impl(std::shared_ptr<Engine> e, std::shared_ptr<const text::Tokenizer> t, text::EncoderProfile p,
                   ServerOptions o)
    : engine(std::move(e)),
      tokenizer(std::move(t)),
      profile(p),
      render_options(text::RenderOptions::from_environment(p)),
      opt(std::move(o)),
      seeds(opt.deterministic, opt.random_seed),
      responses_store(std::make_unique<ResponsesStore>(opt.responses_store_size, opt.responses_store_bytes)) {}

void Server::Impl::log(const std::string& level, const std::string& msg) const {
  static const char* order[] = {"debug", "info", "warning", "error"};
  auto rank = [&](const std::string& l) {
    for (int i = 0; i < 4; ++i)
      if (l == order[i]) return i;
    return 1;
  };
  if (rank(level) < rank(opt.log_level)) return;
  std::fprintf(stderr, "[dsv4 %s] %s\n", level.c_str(), msg.c_str());
}

ValidatedRequest Server::Impl::validate(std::vector<int32_t> prompt, SamplingParams params,
                                        const char* length_name) const {
  RequestLimits limits = engine->limits();
  limits.clamp_max_tokens = opt.clamp_max_tokens;
  try {
    return validate_request(limits, std::move(prompt), std::move(params), length_name);
  } catch (const Error& e) {
    throw BadRequest(e.what());
  }
}

std::vector<std::shared_ptr<RequestHandle>> Server::Impl::submit_all(std::vector<Engine::Submission> requests) {
  try {
    return engine->submit_all(std::move(requests));
  } catch (const QueueFullError& e) {
    throw BadRequest(e.what(), 503);
  } catch (const DuplicateIdError& e) {
    throw BadRequest(e.what());
  } catch (const Error& e) {
    throw BadRequest(e.what());
  }
}

void Server::Impl::setup_routes() {
  auto model_card = [this]() -> ojson {
    return {{"id", model_name()},     {"object", "model"},      {"created", unix_time()},
            {"owned_by", "dsv4.cpp"}, {"root", opt.model_path}, {"max_model_len", engine->context_length()}};
  };
  post("/v1/chat/completions", [this](const std::string& b, HttpResponse& r) { chat_completions(b, r); });
  // Anthropic's Messages API (errors in its shape: router.cpp).
  post("/v1/messages", [this](const std::string& b, HttpResponse& r) { anthropic_messages(b, r); });
  post("/v1/messages/count_tokens", [this](const std::string& b, HttpResponse& r) { anthropic_count_tokens(b, r); });
  // OpenAI's Responses API (responses_routes.cpp).
  setup_responses_routes();
  post("/v1/completions", [this](const std::string& b, HttpResponse& r) { completions(b, r); });
  post("/generate", [this](const std::string& b, HttpResponse& r) { generate(b, r); });
  routes.push_back({"PUT", "/generate", false, [this](const HttpRequest& q, HttpResponse& r) { generate(q.body, r); }});
  get("/v1/models", ([this, model_card](auto&, auto& r) {
        r.set_content(dump({{"object", "list"}, {"data", ojson::array({model_card()})}}), "application/json");
      }));
  get("/v1/models/*", ([this, model_card](const HttpRequest& q, HttpResponse& r) {
        const std::string name = q.path.substr(std::string("/v1/models/").size());
        if (name != model_name()) throw BadRequest("The model '" + name + "' does not exist", 404);
        r.set_content(dump(model_card()), "application/json");
      }));
  get(
      "/health",
      [this](auto&, HttpResponse& r) {
        r.status = ready ? 200 : 503;
        r.set_content("", "text/plain");
      },
      /*open=*/true);
  get("/health_generate", ([this](auto&, HttpResponse& r) {
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
  get("/get_model_info", ([this](auto&, auto& r) {
        const ModelConfig& c = engine->model().config();
        r.set_content(dump({{"model_path", opt.model_path},
                            {"tokenizer_path", opt.model_path},
                            {"is_generation", true},
                            {"preferred_sampling_params", nullptr},
                            {"weight_version", "default"},
                            {"model_type", c.model_type},
                            {"architectures", ojson::array({c.architecture})},
                            {"encoder_profile", std::string(text::profile_name(profile))}}),
                      "application/json");
      }));
  Handler server_info = ([this](auto&, auto& r) {
    EngineMetrics m = engine->metrics();
    const EngineOptions& eo = engine->options();
    r.set_content(dump({{"model_path", opt.model_path},
                        {"served_model_name", model_name()},
                        {"host", opt.host},
                        {"port", opt.port},
                        {"context_length", engine->context_length()},
                        {"max_running_requests", eo.max_running_requests},
                        {"max_total_num_tokens", eo.max_total_tokens},
                        {"chunked_prefill_size", eo.chunked_prefill_size},
                        {"max_req_input_len", engine->context_length() - 1},
                        {"reasoning_parser", opt.reasoning_parser},
                        {"tool_call_parser", opt.tool_call_parser},
                        {"enable_deterministic_inference", opt.deterministic},
                        {"random_seed", opt.random_seed},
                        {"enable_cache_report", opt.enable_cache_report},
                        {"clamp_max_tokens", opt.clamp_max_tokens},
                        {"server_args", redacted_server_args(opt.server_args)},
                        {"internal_states", ojson::array({{{"last_gen_throughput", m.gen_throughput},
                                                           {"num_running_reqs", m.running},
                                                           {"num_queue_reqs", m.queued},
                                                           {"prefix_cache_entries", m.prefix_cache_entries},
                                                           {"prefix_cache_bytes", m.prefix_cache_bytes}}})},
                        {"version", "dsv4.cpp 0.1"}}),
                  "application/json");
  });
  get("/get_server_info", server_info);
  get("/server_info", server_info);
  Handler flush = ([this](auto&, HttpResponse& r) {
    // Every tier, storage included; running requests keep what they started
    // from until they end (docs/hicache.md).
    engine->flush_cache();
    malloc_trim(0);  // hand the freed prefix-cache memory back to the OS now, not at the next idle step
    r.set_content("Cache flushed.\n", "text/plain");
  });
  get("/flush_cache", flush);
  post("/flush_cache", [flush](const std::string&, HttpResponse& r) { flush(HttpRequest(), r); });
  post("/abort_request", ([this](const std::string& raw, HttpResponse& r) {
         ojson body = parse_body(raw);
         if (bool_field(body, "abort_all", false)) {
           int64_t n = engine->abort_all();
           r.set_content(dump({{"aborted", n}}), "application/json");
           return;
         }
         if (!body.contains("rid") || !body["rid"].is_string())
           throw BadRequest("'rid' (string) or 'abort_all': true is required");
         std::string rid = body["rid"].get<std::string>();
         bool found = engine->abort(rid);
         for (int i = 0; i < 16 && !found; ++i) found = engine->abort(rid + "-" + std::to_string(i));
         if (!found) throw BadRequest("no running or waiting request with rid '" + rid + "'", 404);
         r.set_content(dump({{"aborted", 1}}), "application/json");
       }));
  get(
      "/metrics",
      [this](auto&, HttpResponse& r) {
        r.set_content(metrics.render(engine->metrics(), model_name()), "text/plain; version=0.0.4");
      },
      /*open=*/true);
  get("/get_load", ([this](auto&, auto& r) {
        EngineMetrics m = engine->metrics();
        r.set_content(dump(ojson::array({{{"dp_rank", 0},
                                          {"num_reqs", m.running + m.queued},
                                          {"num_waiting_reqs", m.queued},
                                          {"num_tokens", m.used_tokens}}})),
                      "application/json");
      }));
  post("/tokenize", ([this](const std::string& raw, HttpResponse& r) {
         ojson body = parse_body(raw);
         if (!body.contains("prompt") || !body["prompt"].is_string()) throw BadRequest("'prompt' (string) is required");
         auto ids = tokenizer->encode(body["prompt"].get<std::string>());
         r.set_content(dump({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine->context_length()}}),
                       "application/json");
       }));
  post("/detokenize", ([this](const std::string& raw, HttpResponse& r) {
         ojson body = parse_body(raw);
         if (!body.contains("tokens")) throw BadRequest("'tokens' is required");
         auto ids = id_list(body["tokens"], "tokens", int64_t(tokenizer->vocab_size()));
         r.set_content(dump({{"text", tokenizer->decode(std::vector<text::TokenId>(ids.begin(), ids.end()))}}),
                       "application/json");
       }));
}

Server::Server(std::shared_ptr<Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
               text::EncoderProfile profile, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(engine), std::move(tokenizer), profile, std::move(options))) {
  Impl& s = *impl_;
  HttpLimits limits = s.opt.http;
  limits.max_body_bytes = uint64_t(s.opt.max_request_bytes);
  s.http =
      std::make_unique<HttpServer>(limits, [&s](const HttpRequest& req, HttpResponse& res) { s.dispatch(req, res); });
  s.setup_routes();
}

Server::~Server() { stop(); }

bool Server::run() {
  Impl& s = *impl_;
  std::string error;
  bound_port_ = s.http->bind(s.opt.host, s.opt.port, &error);
  if (bound_port_ <= 0) {
    s.log("error", "cannot listen on " + s.opt.host + ":" + std::to_string(s.opt.port) + ": " + error);
    return false;
  }
  s.ready = true;
  std::printf("dsv4 serving %s on http://%s:%d (OpenAI API at /v1)\n", s.model_name().c_str(), s.opt.host.c_str(),
              bound_port_);
  std::fflush(stdout);
  s.http->run();
  return true;
}

void Server::stop() {
  if (impl_) {
    impl_->ready = false;
    impl_->http->stop();
  }
}

}  // namespace dsv4
