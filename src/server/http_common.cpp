#include "server/http_common.h"

#include <ctime>
#include <random>

namespace dsv4 {

namespace {

const char* error_type(int status) {
  switch (status) {
    case 400: return "BadRequest";
    case 401: return "Unauthorized";
    case 404: return "NotFound";
    case 405: return "MethodNotAllowed";
    case 413: return "PayloadTooLarge";
    case 415: return "UnsupportedMediaType";
    case 431: return "RequestHeaderFieldsTooLarge";
    case 503: return "ServiceUnavailable";
    default: return status >= 500 ? "InternalServerError" : "BadRequest";
  }
}

}  // namespace

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson error_body(int status, const std::string& message, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", error_type(status)},
            {"param", param.empty() ? ojson() : ojson(param)},
            {"code", status}}}};
}

void send_error(HttpResponse& res, int status, const std::string& message) {
  res.status = status;
  res.stream = nullptr;
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

}  // namespace dsv4
