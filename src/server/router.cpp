// Request dispatch: CORS, preflights, routing, the API key, the content
// type of bodies, and errors as OpenAI-shaped JSON answers (Anthropic-shaped
// on the Messages API's routes).
#include <algorithm>

#include "server/anthropic_format.h"
#include "server/server_impl.h"
#include "text/chat_encoder.h"

namespace dsv4 {

namespace {

// Compares without an early exit, so that the time taken says nothing of
// how much of a guessed key was right.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string& other = a.size() == b.size() ? b : a;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ other[i]);
  return diff == 0;
}

// Bodies a browser can send cross-origin without a preflight are
// text/plain, application/x-www-form-urlencoded and multipart/form-data (or
// none). Only JSON is accepted, so that a web page cannot drive a server
// that has no key.
bool json_content_type(const std::string& value) {
  std::string type = value.substr(0, value.find(';'));
  type.erase(std::remove(type.begin(), type.end(), ' '), type.end());
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return type == "application/json" || (type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0);
}

}  // namespace

bool Server::Impl::authorized(const HttpRequest& req) const {
  if (opt.api_key.empty()) return true;
  const std::string bearer = req.header("authorization");
  if (bearer.rfind("Bearer ", 0) == 0 && constant_time_equal(bearer.substr(7), opt.api_key)) return true;
  // Anthropic's SDK sends the key as x-api-key.
  const std::string x_api_key = req.header("x-api-key");
  return !x_api_key.empty() && constant_time_equal(x_api_key, opt.api_key);
}

void Server::Impl::dispatch(const HttpRequest& req, HttpResponse& res) {
  // CORS: the origin is answered only when allowed (see ServerOptions).
  const std::string origin = req.header("origin");
  if (!origin.empty()) {
    const bool listed =
        std::find(opt.allowed_origins.begin(), opt.allowed_origins.end(), origin) != opt.allowed_origins.end() ||
        std::find(opt.allowed_origins.begin(), opt.allowed_origins.end(), "*") != opt.allowed_origins.end();
    const bool allowed = listed || (opt.allowed_origins.empty() && !opt.api_key.empty());
    if (allowed) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      // Preflights carry no credentials: answered without the key.
      res.status = 204;
      if (allowed) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS");
        res.set_header("Access-Control-Allow-Headers",
                       "Authorization, Content-Type, X-Api-Key, Anthropic-Version, OpenAI-Beta");
        res.set_header("Access-Control-Max-Age", "600");
      }
      return;
    }
  }
  const Route* route = nullptr;
  bool path_known = false;
  for (const Route& r : routes) {
    const bool match =
        r.path.back() == '*' ? req.path.rfind(r.path.substr(0, r.path.size() - 1), 0) == 0 : req.path == r.path;
    if (!match) continue;
    path_known = true;
    if (r.method == req.method || (req.method == "HEAD" && r.method == "GET")) {
      route = &r;
      break;
    }
  }
  // Anthropic's routes answer errors in Anthropic's shape.
  const auto fail = is_anthropic_path(req.path) ? send_anthropic_error : send_error;
  try {
    if (!(route && route->open) && !authorized(req))
      throw BadRequest("Unauthorized: a valid API key is required (Authorization: Bearer ...)", 401);
    if (!route) {
      if (req.method == "OPTIONS") {
        res.status = 204;
        res.set_header("Allow", "GET, POST, OPTIONS");
        return;
      }
      if (path_known) throw BadRequest("method " + req.method + " is not allowed on " + req.path, 405);
      throw BadRequest("no route " + req.method + " " + req.path, 404);
    }
    if (req.method != "GET" && req.method != "HEAD" && opt.api_key.empty() && !req.body.empty() &&
        !json_content_type(req.header("content-type")))
      throw BadRequest("request bodies must be JSON: send Content-Type: application/json", 415);
    route->handler(req, res);
  } catch (const BadRequest& e) {
    if (e.status == 503) res.set_header("Retry-After", "1");
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
    fail(res, e.status, e.what());
  } catch (const text::EncoderError& e) {
    fail(res, 400, e.what());
  } catch (const std::exception& e) {
    log("error", std::string("internal error on ") + req.path + ": " + e.what());
    fail(res, 500, std::string("internal error: ") + e.what());
  }
}

}  // namespace dsv4
