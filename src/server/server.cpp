#include "server/server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/machine.h"
#include "server/server_impl.h"

namespace dsv4 {

namespace {

// How much of an oversize request body is read and thrown away before the
// connection is closed, so that ordinary clients get to read the 413.
uint64_t drain_limit_bytes(const ServerOptions& opt) {
  const uint64_t limit = uint64_t(opt.max_request_bytes);
  return limit > UINT64_MAX / 4 ? UINT64_MAX : limit * 4;
}

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

void send_unauthorized(httplib::Response& res) {
  send_error(res, 401, "Unauthorized: a valid API key is required (Authorization: Bearer ...)");
}

}  // namespace

Server::Impl::Impl(std::shared_ptr<Engine> e, std::shared_ptr<const text::Tokenizer> t, text::EncoderProfile p,
                   ServerOptions o)
    : engine(std::move(e)),
      tokenizer(std::move(t)),
      profile(p),
      render_options(text::RenderOptions::from_environment(p)),
      opt(std::move(o)),
      seeds(opt.deterministic, opt.random_seed) {}

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

std::shared_ptr<RequestHandle> Server::Impl::submit(const std::string& id, const std::vector<int32_t>& prompt,
                                                    const SamplingParams& p) {
  try {
    return engine->submit(id, prompt, p);
  } catch (const QueueFullError& e) {
    throw BadRequest(e.what(), 503);
  } catch (const Error& e) {
    throw BadRequest(e.what());
  }
}

// The API key is checked inside the handlers, not in httplib's pre-routing
// hook: that hook answers before httplib reads the request body, and the
// unread body stays in the socket, where the next request of the kept-alive
// connection is parsed from it (a 400 "request failed"). Node 18's fetch
// sends a body in its own segment after the headers, so a wrong-key request
// followed by a right-key one on the same connection failed that way.
bool Server::Impl::authorized(const httplib::Request& req) const {
  if (opt.api_key.empty() || req.path == "/health" || req.path == "/health_generate" || req.path == "/metrics")
    return true;
  return req.get_header_value("Authorization") == "Bearer " + opt.api_key;
}

// Wraps a handler: errors become JSON error responses, never crashes.
httplib::Server::Handler Server::Impl::guarded(Route f) {
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
httplib::Server::HandlerWithContentReader Server::Impl::guarded_body(BodyRoute f) {
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

void Server::Impl::setup_routes() {
  auto model_card = [this]() -> ojson {
    return {{"id", model_name()},     {"object", "model"},      {"created", unix_time()},
            {"owned_by", "dsv4.cpp"}, {"root", opt.model_path}, {"max_model_len", engine->context_length()}};
  };
  http.Post("/v1/chat/completions",
            guarded_body([this](const std::string& b, httplib::Response& r) { chat_completions(b, r); }));
  http.Post("/v1/completions", guarded_body([this](const std::string& b, httplib::Response& r) { completions(b, r); }));
  http.Post("/generate", guarded_body([this](const std::string& b, httplib::Response& r) { generate(b, r); }));
  http.Put("/generate", guarded_body([this](const std::string& b, httplib::Response& r) { generate(b, r); }));
  http.Get("/v1/models", guarded([this, model_card](auto&, auto& r) {
             r.set_content(dump({{"object", "list"}, {"data", ojson::array({model_card()})}}), "application/json");
           }));
  http.Get(R"(/v1/models/(.+))", guarded([this, model_card](const httplib::Request& q, httplib::Response& r) {
             if (q.matches[1] != model_name())
               throw BadRequest("The model '" + std::string(q.matches[1]) + "' does not exist", 404);
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
  auto server_info = guarded([this](auto&, auto& r) {
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
              if (!body.contains("rid") || !body["rid"].is_string())
                throw BadRequest("'rid' (string) or 'abort_all': true is required");
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
             r.set_content(dump(ojson::array({{{"dp_rank", 0},
                                               {"num_reqs", m.running + m.queued},
                                               {"num_waiting_reqs", m.queued},
                                               {"num_tokens", m.used_tokens}}})),
                           "application/json");
           }));
  http.Post("/tokenize", guarded_body([this](const std::string& raw, httplib::Response& r) {
              ojson body = parse_body(raw);
              if (!body.contains("prompt") || !body["prompt"].is_string())
                throw BadRequest("'prompt' (string) is required");
              auto ids = tokenizer->encode(body["prompt"].get<std::string>());
              r.set_content(dump({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine->context_length()}}),
                            "application/json");
            }));
  http.Post("/detokenize", guarded_body([this](const std::string& raw, httplib::Response& r) {
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
    if (!s.authorized(req)) return send_unauthorized(res);
    if (res.status == 404)
      send_error(res, 404, "no route " + req.method + " " + req.path);
    else if (res.status == 413)
      send_error(res, 413, "the request body is too large");
    else if (res.status >= 400)
      send_error(res, res.status, "request failed");
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
  std::printf("dsv4 serving %s on http://%s:%d (OpenAI API at /v1)\n", s.model_name().c_str(), s.opt.host.c_str(),
              bound_port_);
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
