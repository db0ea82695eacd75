// The HTTP request and response types the routes see, independent of the
// transport (server/http_server.h). A route fills a response with a body, or
// with a stream that writes the body piece by piece (SSE) while the route's
// thread waits on the engine.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4 {

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent: path and query
  std::string path;                                          // target without the query
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in arrival order
  std::string body;
  std::string remote_address;

  // The first value of a header (name lower-case), or "".
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

// The client's side of a streamed body. write() sends one piece (as a chunk
// of a chunked response) and returns false once the client is gone or the
// write timed out; after that the stream only fails.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  virtual bool write(std::string_view data) = 0;
  virtual bool alive() const = 0;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type = "text/plain";
  // When set, the body is produced by this function after the status line
  // and headers went out (chunked transfer encoding).
  std::function<void(ResponseStream&)> stream;
  // The connection is closed after this response.
  bool close = false;

  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value);
  void set_stream(std::string type, std::function<void(ResponseStream&)> producer) {
    content_type = std::move(type);
    stream = std::move(producer);
  }
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

const char* http_status_text(int status);

}  // namespace dsv4
