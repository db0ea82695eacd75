// The HTTP/1.1 transport of `dsv4 serve`, on Boost.Beast and Asio.
//
// Why this shape: a thread-per-connection server (cpp-httplib 0.11, what we
// had) lets 300 connections that never finish their headers hold every
// worker, so /health stops answering, and buffers whatever header block or
// body a client sends. Here connections are read asynchronously by a few I/O
// threads: an idle or slow connection costs a socket and a small buffer, no
// thread. A thread is taken only by a request that arrived whole (the routes
// block while the engine generates), and their number is bounded. Every
// read has a deadline, the header block and the body have caps, bodies being
// read share one memory budget, and when the connection limits are reached
// the oldest connection that is idle or still sending its headers is closed
// to make room, so a flood of slow connections cannot lock others out.
// Beast's parser refuses ambiguous framing (two Content-Length values; a
// Transfer-Encoding whose last coding is not chunked with a body), and
// pipelined requests are answered in order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "server/http.h"

namespace dsv4 {

struct HttpLimits {
  size_t max_header_bytes = 64 << 10;  // past it: 431
  uint64_t max_body_bytes = 32 << 20;  // past it: 413
  // Bodies being received or handled, all connections (past it: 503 with
  // Retry-After). A body costs several times its size while it is parsed,
  // rendered and tokenized (a 30 MB chat body peaked at ~130 MB): 48 MB
  // lets one body of the largest size, or thousands of ordinary ones, in.
  uint64_t max_inflight_body_bytes = uint64_t(48) << 20;
  double header_timeout = 10;  // seconds for a request's whole header block (and idle keep-alive)
  double body_timeout = 60;    // seconds for its whole body
  double write_timeout = 60;   // seconds for one write to be taken by the client
  int max_connections = 4096;
  int max_connections_per_client = 512;  // per remote address
  int max_active_requests = 2048;        // requests being handled at once (each has a thread)
  int io_threads = 1;
};

class HttpServer {
 public:
  HttpServer(HttpLimits limits, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds (port 0: any free port); returns the port, or -1 with `error` set.
  int bind(const std::string& host, int port, std::string* error);
  // Serves until stop(); the calling thread is one of the I/O threads.
  void run();
  // Stops accepting, closes every connection, and waits (briefly) for the
  // requests being handled to end.
  void stop();

  struct Stats {
    int64_t connections = 0, active_requests = 0, inflight_body_bytes = 0;
    int64_t evicted_total = 0, refused_total = 0, timeouts_total = 0;
  };
  Stats stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dsv4
