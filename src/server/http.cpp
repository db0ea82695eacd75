#include "server/http.h"

#include <cctype>

namespace dsv4 {

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers)
    if (n == name) return v;
  return "";
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& h : headers)
    if (h.first == name) return true;
  return false;
}

void HttpResponse::set_header(std::string name, std::string value) {
  for (auto& [n, v] : headers)
    if (n == name) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(std::move(name), std::move(value));
}

const char* http_status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Server Error" : "Client Error";
  }
}

}  // namespace dsv4
