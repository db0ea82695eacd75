// Pieces every route of the HTTP server shares: the JSON type, the request
// error that becomes a 4xx/5xx answer, OpenAI's error shape, and ids.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "server/http.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;

// A request the client got wrong: HTTP 400 (or `status`) with this message.
struct BadRequest : std::runtime_error {
  int status;
  explicit BadRequest(const std::string& m, int s = 400) : std::runtime_error(m), status(s) {}
};

// Compact JSON; invalid UTF-8 in strings is replaced instead of throwing, so
// that a model emitting odd bytes can never break a response.
std::string dump(const ojson& j);

// {"error": {message, type, param, code}} as OpenAI's API answers.
ojson error_body(int status, const std::string& message, const std::string& param = "");
void send_error(HttpResponse& res, int status, const std::string& message);

std::string random_hex(size_t n);
int64_t unix_time();

}  // namespace dsv4
