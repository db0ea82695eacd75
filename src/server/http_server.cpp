#include "server/http_server.h"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "server/http_common.h"

namespace dsv4 {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A file-descriptor limit of 1024 (the usual soft default) would make a few
// hundred slow connections exhaust accept(): raise it to the hard limit.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

std::string status_line(int status) {
  return "HTTP/1.1 " + std::to_string(status) + " " + http_status_text(status) + "\r\n";
}

}  // namespace

class Session;

struct HttpServer::State : std::enable_shared_from_this<HttpServer::State> {
  HttpLimits limits;
  HttpHandler handler;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::atomic<bool> stopping{false};

  mutable std::mutex mutex;                    // the registry and the counters below
  std::list<std::weak_ptr<Session>> sessions;  // oldest first
  std::map<std::string, int> per_client;
  int64_t inflight_body_bytes = 0;
  int64_t active_requests = 0;
  int64_t evicted_total = 0, refused_total = 0, timeouts_total = 0;
  std::condition_variable idle;

  void accept();
  // Makes room for one more connection from `address`; false if none can be made.
  bool admit(const std::string& address);
  // One connection of `address` ended (the count admit() raised).
  void forget_client(const std::string& address) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = per_client.find(address);
    if (it != per_client.end() && --it->second <= 0) per_client.erase(it);
  }
};

// One connection. Reads run on the I/O threads through the session's strand;
// a request that arrived whole is handled on a thread of its own, which
// writes the response by posting writes to the strand and waiting for them.
class Session : public std::enable_shared_from_this<Session>, public ResponseStream {
 public:
  enum class Phase { Idle, Header, Body, Handling, Closing };

  Session(std::shared_ptr<HttpServer::State> server, tcp::socket socket, std::string address)
      : server_(std::move(server)),
        stream_(std::move(socket)),
        buffer_(std::max<size_t>(server_->limits.max_header_bytes, size_t(1) << 20)),
        address_(std::move(address)) {}

  const std::string& address() const { return address_; }
  // Idle or still sending its header block: a connection that may be closed
  // to make room for others.
  bool evictable() const {
    const Phase p = phase_.load();
    return p == Phase::Idle || p == Phase::Header;
  }
  void start() { read_header(); }
  void close_from_outside() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // ResponseStream (called on the request's thread).
  bool write(std::string_view data) override {
    if (data.empty()) return alive();
    std::string chunk = hex(data.size()) + "\r\n";
    chunk.append(data);
    chunk += "\r\n";
    return send(std::move(chunk));
  }
  bool alive() const override { return !failed_.load(); }

 private:
  static std::string hex(size_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%zx", n);
    return buf;
  }

  void read_header() {
    phase_ = buffer_.size() > 0 ? Phase::Header : Phase::Idle;
    parser_.emplace();
    parser_->header_limit(std::uint32_t(std::min<size_t>(server_->limits.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(server_->limits.max_body_bytes);
    stream_.expires_after(seconds(server_->limits.header_timeout));
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    phase_ = Phase::Body;
    const auto length = parser_->content_length();
    // A refusal here comes before the body: the body the client is still
    // sending is read and dropped (up to 4x the body cap), so that it gets to
    // read the answer instead of a reset.
    drain_ = int64_t(std::min<uint64_t>(length ? *length + (64 << 10) : server_->limits.max_body_bytes,
                                        4 * server_->limits.max_body_bytes));
    if (length && *length > server_->limits.max_body_bytes)
      return refuse(
          413, "the request body is too large (limit " + std::to_string(server_->limits.max_body_bytes) + " bytes)");
    // Bodies being read share one budget (a chunked body reserves the cap).
    reserved_ = parser_->is_done() ? 0 : int64_t(length ? *length : server_->limits.max_body_bytes);
    {
      std::lock_guard<std::mutex> lock(server_->mutex);
      if (server_->inflight_body_bytes + reserved_ > int64_t(server_->limits.max_inflight_body_bytes)) {
        reserved_ = 0;
        return refuse(503, "the server is reading too many request bodies; retry shortly");
      }
      server_->inflight_body_bytes += reserved_;
    }
    if (parser_->is_done()) return on_body({});
    stream_.expires_after(seconds(server_->limits.body_timeout));
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void release_body_budget() {
    if (reserved_ == 0) return;
    std::lock_guard<std::mutex> lock(server_->mutex);
    server_->inflight_body_bytes -= reserved_;
    reserved_ = 0;
  }

  void on_body(beast::error_code ec) {
    if (ec) {
      release_body_budget();
      return on_read_error(ec);
    }
    stream_.expires_never();
    auto message = parser_->release();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.path = request.target.substr(0, request.target.find('?'));
    for (const auto& field : message)
      request.headers.emplace_back(lower(std::string(field.name_string())), std::string(field.value()));
    request.body = std::move(message.body());
    request.remote_address = address_;
    keep_alive_ = message.keep_alive();
    bool full;
    {
      std::lock_guard<std::mutex> lock(server_->mutex);
      full = server_->active_requests >= server_->limits.max_active_requests;
      if (!full) ++server_->active_requests;
    }
    if (full) {
      release_body_budget();
      return refuse(503, "the server is handling too many requests; retry shortly");
    }
    phase_ = Phase::Handling;
    std::thread([self = shared_from_this(), request = std::move(request)]() mutable {
      self->handle(std::move(request));
    }).detach();
  }

  // On the request's own thread.
  void handle(HttpRequest request) {
    HttpResponse response;
    try {
      server_->handler(request, response);
    } catch (const std::exception& e) {
      response = HttpResponse();
      response.status = 500;
      response.set_content(dump(error_body(500, std::string("internal error: ") + e.what())), "application/json");
    }
    const bool large = request.body.size() >= (size_t(1) << 20);
    request.body.clear();
    request.body.shrink_to_fit();
    release_body_budget();
    // A large body leaves freed blocks (the body, its parsed JSON) that
    // glibc keeps for reuse: give them back so that a burst of big requests
    // does not leave the server's footprint up.
    if (large) malloc_trim(0);
    const bool keep = keep_alive_ && !response.close && !server_->stopping;
    std::string head = status_line(response.status);
    head += "Content-Type: " + response.content_type + "\r\n";
    for (auto& [name, value] : response.headers) head += name + ": " + value + "\r\n";
    if (keep) {
      head += "Keep-Alive: timeout=" + std::to_string(int(server_->limits.header_timeout)) + "\r\n";
    } else {
      head += "Connection: close\r\n";
    }
    bool ok;
    if (response.stream) {
      head += "Transfer-Encoding: chunked\r\n\r\n";
      ok = send(std::move(head));
      if (ok) {
        try {
          response.stream(*this);
        } catch (const std::exception& e) {
          // Headers are out: the only way left to say so is to end the
          // response without its last chunk.
          std::fprintf(stderr, "[dsv4 error] a streamed response failed: %s\n", e.what());
          failed_ = true;
        }
      }
      ok = alive() && send("0\r\n\r\n");
    } else {
      head += "Content-Length: " + std::to_string(response.body.size()) + "\r\n\r\n";
      head += response.body;
      ok = send(std::move(head));
    }
    {
      std::lock_guard<std::mutex> lock(server_->mutex);
      --server_->active_requests;
    }
    server_->idle.notify_all();
    asio::post(stream_.get_executor(), [self = shared_from_this(), next = ok && keep] {
      if (next)
        self->read_header();
      else
        self->close();
    });
  }

  // Posts one write to the strand and waits for it (write_timeout).
  bool send(std::string bytes) {
    if (failed_) return false;
    auto data = std::make_shared<std::string>(std::move(bytes));
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> result = done->get_future();
    asio::post(stream_.get_executor(), [self = shared_from_this(), data, done] {
      self->stream_.expires_after(seconds(self->server_->limits.write_timeout));
      asio::async_write(self->stream_, asio::buffer(*data), [self, data, done](beast::error_code ec, size_t) {
        self->stream_.expires_never();
        done->set_value(!ec);
      });
    });
    // The strand's timer bounds the write; the wait adds a margin for a
    // stalled I/O thread.
    if (result.wait_for(seconds(server_->limits.write_timeout + 5)) != std::future_status::ready || !result.get()) {
      failed_ = true;
      close_from_outside();
      return false;
    }
    return true;
  }

  void on_read_error(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted)
      return close();
    if (ec == beast::error::timeout) {
      {
        std::lock_guard<std::mutex> lock(server_->mutex);
        ++server_->timeouts_total;
      }
      return close();  // a slow or idle client: no answer, the deadline passed
    }
    if (ec == bhttp::error::header_limit)
      return refuse(431, "the request header block is too large (limit " +
                             std::to_string(server_->limits.max_header_bytes) + " bytes)");
    if (ec == bhttp::error::body_limit) {
      // The parser may refuse a declared length as it completes the header,
      // before on_header ran: drain the body the client is sending anyway.
      const auto length = parser_->content_length();
      if (drain_ == 0)
        drain_ = int64_t(std::min<uint64_t>(length ? *length + (64 << 10) : server_->limits.max_body_bytes,
                                            4 * server_->limits.max_body_bytes));
      return refuse(
          413, "the request body is too large (limit " + std::to_string(server_->limits.max_body_bytes) + " bytes)");
    }
    refuse(400, std::string("malformed HTTP request: ") + ec.message());
  }

  // An error answer from the I/O thread, then a lingering close: the
  // sending side is shut, and what the client still sends is read and
  // dropped for a moment, so that it gets to read the answer instead of a
  // reset.
  void refuse(int status, const std::string& message) {
    phase_ = Phase::Closing;
    auto data = std::make_shared<std::string>(status_line(status) + "Content-Type: application/json\r\n" +
                                              "Connection: close\r\nContent-Length: ");
    const std::string body = dump(error_body(status, message));
    *data += std::to_string(body.size()) + "\r\n\r\n" + body;
    stream_.expires_after(seconds(5));
    asio::async_write(stream_, asio::buffer(*data), [self = shared_from_this(), data](beast::error_code ec, size_t) {
      if (ec) return self->close();
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->linger(std::max<int64_t>(self->drain_, int64_t(4) << 20));
    });
  }

  void linger(int64_t budget) {
    stream_.expires_after(seconds(2));
    auto sink = std::make_shared<std::array<char, 16384>>();
    stream_.async_read_some(asio::buffer(*sink),
                            [self = shared_from_this(), sink, budget](beast::error_code ec, size_t n) {
                              if (ec || budget - int64_t(n) <= 0) return self->close();
                              self->linger(budget - int64_t(n));
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    failed_ = true;
    phase_ = Phase::Closing;
    release_body_budget();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    server_->forget_client(address_);
  }

 public:
  ~Session() override {
    if (!closed_) server_->forget_client(address_);
  }

 private:
  std::shared_ptr<HttpServer::State> server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string address_;
  std::atomic<Phase> phase_{Phase::Idle};
  std::atomic<bool> failed_{false};
  bool closed_ = false, keep_alive_ = true;
  int64_t reserved_ = 0;
  int64_t drain_ = 0;  // bytes a refusal reads and drops before closing
};

bool HttpServer::State::admit(const std::string& address) {
  std::vector<std::shared_ptr<Session>> evict;
  {
    std::lock_guard<std::mutex> lock(mutex);
    // Forget sessions that ended.
    for (auto it = sessions.begin(); it != sessions.end();) it = it->expired() ? sessions.erase(it) : std::next(it);
    const int total = int(sessions.size());
    const int mine = per_client.count(address) ? per_client[address] : 0;
    auto pick = [&](bool same_client) -> bool {
      for (auto& weak : sessions)
        if (auto s = weak.lock(); s && s->evictable() && (!same_client || s->address() == address) &&
                                  std::find(evict.begin(), evict.end(), s) == evict.end()) {
          evict.push_back(s);
          return true;
        }
      return false;
    };
    if (mine >= limits.max_connections_per_client && !pick(true)) return ++refused_total, false;
    if (total >= limits.max_connections && !pick(false)) return ++refused_total, false;
    evicted_total += int64_t(evict.size());
    ++per_client[address];
  }
  for (auto& s : evict) s->close_from_outside();
  return true;
}

void HttpServer::State::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (self->stopping || ec == asio::error::operation_aborted) return;
      // EMFILE and friends: try again shortly instead of spinning.
      auto timer = std::make_shared<asio::steady_timer>(self->ioc, std::chrono::milliseconds(50));
      timer->async_wait([self, timer](beast::error_code) { self->accept(); });
      return;
    }
    beast::error_code aec;
    const auto endpoint = socket.remote_endpoint(aec);
    const std::string address = aec ? std::string("?") : endpoint.address().to_string();
    if (self->admit(address)) {
      socket.set_option(tcp::no_delay(true), aec);
      auto session = std::make_shared<Session>(self, std::move(socket), address);
      {
        std::lock_guard<std::mutex> lock(self->mutex);
        self->sessions.push_back(session);
      }
      session->start();
    } else {
      socket.close(aec);
    }
    self->accept();
  });
}

HttpServer::HttpServer(HttpLimits limits, HttpHandler handler) : state_(std::make_shared<State>()) {
  state_->limits = limits;
  state_->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind(const std::string& host, int port, std::string* error) {
  raise_fd_limit();
  beast::error_code ec;
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    *error = "not an IP address: " + host;
    return -1;
  }
  tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  tcp::acceptor& a = state_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  // The kernel's maximum backlog: a burst of connects (64 streaming clients
  // at once) must not overflow the accept queue into SYN cookies and resets.
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    *error = ec.message();
    return -1;
  }
  return a.local_endpoint().port();
}

void HttpServer::run() {
  state_->accept();
  std::vector<std::thread> extra;
  for (int i = 1; i < state_->limits.io_threads; ++i) extra.emplace_back([s = state_] { s->ioc.run(); });
  state_->ioc.run();
  for (auto& t : extra) t.join();
}

void HttpServer::stop() {
  State& s = *state_;
  if (s.stopping.exchange(true)) return;
  asio::post(s.ioc, [state = state_] {
    beast::error_code ignored;
    state->acceptor.close(ignored);
    std::lock_guard<std::mutex> lock(state->mutex);
    for (auto& weak : state->sessions)
      if (auto session = weak.lock()) session->close_from_outside();
  });
  // Requests being handled end once their writes fail (their connections
  // are closed) or their generation is aborted; give them a moment.
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.idle.wait_for(lock, std::chrono::seconds(10), [&] { return s.active_requests == 0; });
  }
  s.ioc.stop();
}

HttpServer::Stats HttpServer::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  Stats st;
  for (auto& w : state_->sessions) st.connections += !w.expired();
  st.active_requests = state_->active_requests;
  st.inflight_body_bytes = state_->inflight_body_bytes;
  st.evicted_total = state_->evicted_total;
  st.refused_total = state_->refused_total;
  st.timeouts_total = state_->timeouts_total;
  return st;
}

}  // namespace dsv4
