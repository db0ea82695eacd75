// Helpers shared by the `dsv4 bench-serve` modes (single requests in
// bench_serve_command.cpp, the multi-turn trace in bench_serve_multiturn.cpp):
// statistics as sglang.bench_serving computes them, number formatting, SVG
// axis scaling, a streaming (SSE) POST, and a /metrics scrape.
#pragma once
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dsv4::tools::bench {

inline double percentile(std::vector<double> v, double q) {  // numpy's linear interpolation
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}
inline double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}
inline double stdev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

inline std::string fmt(double v, int prec = 1) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// A "nice" axis maximum and tick step.
inline std::pair<double, double> nice_axis(double max) {
  if (!(max > 0)) max = 1;
  const double raw = max / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  return {std::ceil(max / step) * step, step};
}

// The server root "http://host:port" from --base-url or --host/--port.
inline std::string server_root(const std::string& base_url, const std::string& host, int port) {
  std::string r = base_url.empty() ? "http://" + host + ":" + std::to_string(port) : base_url;
  while (!r.empty() && r.back() == '/') r.pop_back();
  if (r.rfind("http://", 0) != 0) throw std::runtime_error("--base-url must start with http:// (got '" + r + "')");
  if (r.find('/', 7) != std::string::npos)
    throw std::runtime_error("--base-url is the server root, without a path (got '" + r + "')");
  return r;
}

// What a streaming POST left behind: whether it was sent, the HTTP status,
// the body of a non-200 answer (or the whole body when the server did not
// stream), and the transport error.
struct SseOutcome {
  bool sent = false;
  int status = 0;
  std::string error_body, body;
  httplib::Error error = httplib::Error::Success;
};

// POSTs `body` as JSON to `path` and calls `on_data` with every SSE `data:`
// payload of a 200 answer, as it arrives; `on_data` returns false to stop.
inline SseOutcome post_sse(const std::string& scheme_host_port, const std::string& path, const std::string& body,
                           double read_timeout_s, const std::function<bool(const std::string&)>& on_data) {
  httplib::Client cli(scheme_host_port);
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(time_t(read_timeout_s), 0);
  cli.set_write_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  SseOutcome out;
  std::string buffer;
  bool keep_going = true;
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (out.status != 200) {
      out.error_body.append(data, len);
      return true;
    }
    out.body.append(data, len);
    buffer.append(data, len);
    size_t pos;
    while (keep_going && (pos = buffer.find("\n\n")) != std::string::npos) {
      std::string block = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      std::istringstream lines(block);
      std::string line;
      while (keep_going && std::getline(lines, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) != 0) continue;  // comments (keep-alive), other fields
        std::string d = line.substr(5);
        if (!d.empty() && d[0] == ' ') d.erase(0, 1);
        keep_going = on_data(d);
      }
    }
    return keep_going;
  };
  httplib::Response res;
  out.sent = cli.send(req, res, out.error);
  if (out.status == 0) out.status = res.status;
  if (out.error_body.empty() && out.status != 200) out.error_body = res.body;
  return out;
}

// Every sample line of the server's /metrics, "name{labels}" -> value; empty
// when the server has no /metrics.
inline std::map<std::string, double> scrape_metrics(const std::string& scheme_host_port) {
  std::map<std::string, double> out;
  httplib::Client cli(scheme_host_port);
  cli.set_connection_timeout(5, 0);
  auto r = cli.Get("/metrics");
  if (!r || r->status != 200) return out;
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return out;
}

// The sum of a metric's samples whose name is `name` and whose labels
// contain `label` (e.g. cache_source="storage_file"); 0 when absent.
inline double metric_sum(const std::map<std::string, double>& m, const std::string& name,
                         const std::string& label = "") {
  double s = 0;
  for (const auto& [k, v] : m)
    if (k.rfind(name, 0) == 0 && k.size() > name.size() && k[name.size()] == '{' &&
        (label.empty() || k.find(label) != std::string::npos))
      s += v;
  return s;
}

}  // namespace dsv4::tools::bench
