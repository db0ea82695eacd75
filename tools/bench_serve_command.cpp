// `dsv4 bench-serve`: an online serving benchmark in the style of
// `python -m sglang.bench_serving`. It sends prompts (random token ids of a
// chosen length, or a JSONL file) to a running server as streaming requests,
// at a request rate (Poisson arrivals, or all at once) under an optional
// concurrency cap, and reports throughput, time to first token (TTFT),
// inter-token latency (ITL) and end-to-end latency, with a per-request CSV
// and a hand-written SVG plot.
//
// Backends: `generate` (SGLang's /generate with input_ids, ignore_eos: output
// lengths are exact) and `completions` (/v1/completions, prompt as token ids
// or text, usage from stream_options.include_usage).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "bench_serve_multiturn.h"
#include "bench_serve_util.h"
#include "svg_plot.h"

namespace dsv4::tools {
namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchServeArgs {
  std::string host = "127.0.0.1", base_url, backend = "generate", model;
  int port = 30000;
  std::string dataset = "random", dataset_path;
  int64_t num_prompts = 1000, random_input_len = 1024, random_output_len = 1024;
  double random_range_ratio = 0.0;
  std::string request_rate = "inf";
  int64_t max_concurrency = 0;  // 0 = unlimited
  uint64_t seed = 1;
  double temperature = 0.0;
  bool disable_ignore_eos = false, disable_stream = false;
  int64_t warmup_requests = 1;
  int64_t token_id_lo = 1000, token_id_hi = 100000;  // random prompt ids (ordinary tokens of the DeepSeek vocab)
  std::string output_csv, output_svg, output_json;
  double timeout_s = 3600;
};

struct Prompt {
  std::vector<int32_t> ids;  // random dataset
  std::string text;          // file dataset
  int64_t input_len = 0;     // known for ids; from the server for text
  int64_t output_len = 0;
};

struct Outcome {
  bool success = false;
  std::string error;
  double start = 0;  // seconds since the benchmark started
  double ttft = 0, latency = 0;
  std::vector<double> itl;  // seconds between successive token chunks
  int64_t prompt_len = 0, output_len = 0;
};

// ---- prompts ----

std::vector<Prompt> make_prompts(const BenchServeArgs& a, std::mt19937_64& rng) {
  std::vector<Prompt> out;
  auto draw_len = [&](int64_t full) {
    const int64_t lo = std::max<int64_t>(1, int64_t(double(full) * a.random_range_ratio));
    if (lo >= full) return full;
    return std::uniform_int_distribution<int64_t>(lo, full)(rng);
  };
  if (a.dataset == "random") {
    std::uniform_int_distribution<int32_t> tok(int32_t(a.token_id_lo), int32_t(a.token_id_hi - 1));
    for (int64_t i = 0; i < a.num_prompts; ++i) {
      Prompt p;
      p.input_len = draw_len(a.random_input_len);
      p.output_len = draw_len(a.random_output_len);
      for (int64_t k = 0; k < p.input_len; ++k) p.ids.push_back(tok(rng));
      out.push_back(std::move(p));
    }
    return out;
  }
  // file: one JSON object per line with "prompt" (string or token ids) and
  // optionally "output_len" / "max_tokens".
  std::ifstream in(a.dataset_path);
  if (!in) throw std::runtime_error("cannot read --dataset-path '" + a.dataset_path + "'");
  std::vector<Prompt> all;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      throw std::runtime_error(a.dataset_path + ":" + std::to_string(lineno) + ": not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("prompt"))
      throw std::runtime_error(a.dataset_path + ":" + std::to_string(lineno) + ": expected an object with \"prompt\"");
    Prompt p;
    if (j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
    } else if (j["prompt"].is_array()) {
      p.ids = j["prompt"].get<std::vector<int32_t>>();
      p.input_len = int64_t(p.ids.size());
    } else {
      throw std::runtime_error(a.dataset_path + ":" + std::to_string(lineno) +
                               ": \"prompt\" must be a string or token ids");
    }
    if (j.contains("output_len") && j["output_len"].is_number_integer())
      p.output_len = j["output_len"].get<int64_t>();
    else if (j.contains("max_tokens") && j["max_tokens"].is_number_integer())
      p.output_len = j["max_tokens"].get<int64_t>();
    else
      p.output_len = draw_len(a.random_output_len);
    all.push_back(std::move(p));
  }
  if (all.empty()) throw std::runtime_error("--dataset-path '" + a.dataset_path + "' holds no prompts");
  // Like sglang: cycle through the file when more prompts are asked for.
  for (int64_t i = 0; i < a.num_prompts; ++i) out.push_back(all[size_t(i) % all.size()]);
  return out;
}

// ---- one streaming request ----

struct Target {
  std::string scheme_host_port;
  std::string backend, model;
};

std::string request_body(const BenchServeArgs& a, const Target& t, const Prompt& p) {
  json body;
  const bool ignore_eos = !a.disable_ignore_eos;
  if (t.backend == "generate") {
    if (!p.ids.empty())
      body["input_ids"] = p.ids;
    else
      body["text"] = p.text;
    body["sampling_params"] = {
        {"max_new_tokens", p.output_len}, {"temperature", a.temperature}, {"ignore_eos", ignore_eos}};
    body["stream"] = !a.disable_stream;
  } else {
    if (!p.ids.empty())
      body["prompt"] = p.ids;
    else
      body["prompt"] = p.text;
    body["model"] = t.model;
    body["max_tokens"] = p.output_len;
    body["temperature"] = a.temperature;
    body["ignore_eos"] = ignore_eos;
    body["stream"] = !a.disable_stream;
    if (!a.disable_stream) {
      body["stream_options"] = {{"include_usage", true}};
      body["logprobs"] = 0;  // every sampled token then yields a chunk naming it: exact token counts and ITLs
    }
  }
  return body.dump();
}

Outcome send_one(const BenchServeArgs& a, const Target& t, const Prompt& p, Clock::time_point bench_start) {
  Outcome o;
  o.prompt_len = p.input_len;
  const auto st = Clock::now();
  o.start = std::chrono::duration<double>(st - bench_start).count();
  auto since = [&](Clock::time_point tp) { return std::chrono::duration<double>(tp - st).count(); };

  std::string raw_error;
  bool done = false, failed = false;
  int64_t tokens = 0;
  Clock::time_point last{};
  std::string finish;
  auto on_tokens = [&](int64_t now_tokens) {
    if (now_tokens <= tokens) return;
    const auto now = Clock::now();
    if (tokens == 0)
      o.ttft = since(now);
    else
      o.itl.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
    tokens = now_tokens;
  };
  auto handle_event = [&](const std::string& data) {
    if (data == "[DONE]") {
      done = true;
      return;
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) {
      failed = true, raw_error = "unparsable SSE data: " + data.substr(0, 200);
      return;
    }
    if (j.contains("error")) {
      failed = true, raw_error = j["error"].is_object() ? j["error"].value("message", j.dump()) : j.dump();
      return;
    }
    if (t.backend == "generate") {
      const json& m = j["meta_info"];
      if (m.contains("prompt_tokens")) o.prompt_len = m["prompt_tokens"].get<int64_t>();
      on_tokens(m.value("completion_tokens", int64_t(0)));
      if (m.contains("finish_reason") && m["finish_reason"].is_object()) finish = m["finish_reason"].value("type", "");
    } else {
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& c = j["choices"][0];
        int64_t n = 0;
        if (c.contains("logprobs") && c["logprobs"].is_object() && c["logprobs"].contains("tokens"))
          n = int64_t(c["logprobs"]["tokens"].size());
        else if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty())
          n = 1;  // a server without logprobs: one chunk ~ one token
        on_tokens(tokens + n);
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish = c["finish_reason"];
      }
      if (j.contains("usage") && j["usage"].is_object()) {  // authoritative counts, no timing
        o.prompt_len = j["usage"].value("prompt_tokens", o.prompt_len);
        const int64_t n = j["usage"].value("completion_tokens", tokens);
        if (tokens == 0 && n > 0) o.ttft = since(Clock::now());
        tokens = n;
      }
    }
  };
  const bench::SseOutcome r =
      bench::post_sse(t.scheme_host_port, t.backend == "generate" ? "/generate" : "/v1/completions",
                      request_body(a, t, p), a.timeout_s, [&](const std::string& d) {
                        handle_event(d);
                        return !failed;
                      });
  o.latency = since(Clock::now());
  const int status = r.status;
  if (!r.sent && !failed) {
    o.error = "HTTP request failed: " + httplib::to_string(r.error);
    return o;
  }
  if (status != 200) {
    json j = json::parse(r.error_body, nullptr, false);
    o.error = "HTTP " + std::to_string(status) + ": " +
              (!j.is_discarded() && j.contains("error") && j["error"].is_object() ? j["error"].value("message", "")
                                                                                  : r.error_body.substr(0, 200));
    return o;
  }
  if (failed) {
    o.error = raw_error;
    return o;
  }
  if (!a.disable_stream && !done) {
    o.error = "the stream ended without data: [DONE]";
    return o;
  }
  if (a.disable_stream) {  // whole JSON body (no per-token timing: TTFT = latency)
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded()) {
      o.error = "unparsable response";
      return o;
    }
    if (t.backend == "generate")
      tokens = j["meta_info"].value("completion_tokens", int64_t(0)),
      o.prompt_len = j["meta_info"].value("prompt_tokens", o.prompt_len);
    else
      tokens = j["usage"].value("completion_tokens", int64_t(0)),
      o.prompt_len = j["usage"].value("prompt_tokens", o.prompt_len);
    o.ttft = o.latency;
  }
  if (finish == "abort") {
    o.error = "the server aborted the request";
    return o;
  }
  o.output_len = tokens;
  o.success = tokens > 0;
  if (!o.success) o.error = "no tokens generated";
  return o;
}

// ---- SVG ----

using bench::fmt;
using bench::mean;
using bench::nice_axis;
using bench::percentile;
using bench::stdev;

struct Panel {
  double x, y, w, h;
};

// Axes with ticks and labels; returns mappers data -> pixels.
void axes(std::ostringstream& s, const Panel& p, double xmax, double xstep, double ymax, double ystep,
          const std::string& title, const std::string& xlabel, const std::string& ylabel) {
  s << "<rect x='" << p.x << "' y='" << p.y << "' width='" << p.w << "' height='" << p.h
    << "' fill='#fff' stroke='#888'/>\n";
  s << "<text x='" << p.x + p.w / 2 << "' y='" << p.y - 8 << "' text-anchor='middle' font-weight='bold'>"
    << svg_escape(title) << "</text>\n";
  for (double v = 0; v <= xmax + 1e-9; v += xstep) {
    const double px = p.x + v / xmax * p.w;
    s << "<line x1='" << px << "' y1='" << p.y + p.h << "' x2='" << px << "' y2='" << p.y + p.h + 4
      << "' stroke='#888'/>"
      << "<text x='" << px << "' y='" << p.y + p.h + 16 << "' text-anchor='middle' font-size='10'>"
      << fmt(v, xstep < 1 ? 2 : 0) << "</text>\n";
  }
  for (double v = 0; v <= ymax + 1e-9; v += ystep) {
    const double py = p.y + p.h - v / ymax * p.h;
    s << "<line x1='" << p.x << "' y1='" << py << "' x2='" << p.x + p.w << "' y2='" << py << "' stroke='#eee'/>"
      << "<text x='" << p.x - 6 << "' y='" << py + 3 << "' text-anchor='end' font-size='10'>"
      << fmt(v, ystep < 1 ? 2 : 0) << "</text>\n";
  }
  s << "<text x='" << p.x + p.w / 2 << "' y='" << p.y + p.h + 32 << "' text-anchor='middle' font-size='11'>"
    << svg_escape(xlabel) << "</text>\n";
  s << "<text transform='translate(" << p.x - 42 << "," << p.y + p.h / 2
    << ") rotate(-90)' text-anchor='middle' font-size='11'>" << svg_escape(ylabel) << "</text>\n";
}

void histogram(std::ostringstream& s, const Panel& p, const std::vector<double>& values_ms, const std::string& title,
               const std::string& color) {
  if (values_ms.empty()) {
    axes(s, p, 1, 0.2, 1, 0.2, title + " (no data)", "ms", "count");
    return;
  }
  const double hi = std::max(percentile(values_ms, 99.5) * 1.05, 1e-3);
  const int bins = 40;
  std::vector<int64_t> count(bins, 0);
  int64_t clipped = 0;
  for (double v : values_ms) {
    int b = int(v / hi * bins);
    if (b >= bins) b = bins - 1, ++clipped;
    count[size_t(std::max(0, b))]++;
  }
  const auto [xmax, xstep] = nice_axis(hi);
  const auto [ymax, ystep] = nice_axis(double(*std::max_element(count.begin(), count.end())));
  axes(s, p, xmax, xstep, ymax, ystep, title, "milliseconds", "count");
  for (int b = 0; b < bins; ++b) {
    if (count[size_t(b)] == 0) continue;
    const double x0 = p.x + (hi * b / bins) / xmax * p.w, x1 = p.x + (hi * (b + 1) / bins) / xmax * p.w;
    const double bh = double(count[size_t(b)]) / ymax * p.h;
    s << "<rect x='" << fmt(x0, 2) << "' y='" << fmt(p.y + p.h - bh, 2) << "' width='"
      << fmt(std::max(0.5, x1 - x0 - 0.5), 2) << "' height='" << fmt(bh, 2) << "' fill='" << color << "'/>\n";
  }
  const double med = percentile(values_ms, 50), p99 = percentile(values_ms, 99);
  for (auto [v, label] : {std::pair<double, const char*>{med, "median"}, {p99, "p99"}}) {
    const double px = p.x + std::min(v, xmax) / xmax * p.w;
    s << "<line x1='" << px << "' y1='" << p.y << "' x2='" << px << "' y2='" << p.y + p.h
      << "' stroke='#333' stroke-dasharray='4,3'/><text x='" << px + 3 << "' y='" << p.y + 12 << "' font-size='10'>"
      << label << " " << fmt(v, 1) << "</text>\n";
  }
  if (clipped > 0)
    s << "<text x='" << p.x + p.w - 4 << "' y='" << p.y + 26 << "' text-anchor='end' font-size='10'>" << clipped
      << " above the last bin</text>\n";
}

std::string make_svg(const std::vector<Outcome>& rs, const std::string& subtitle) {
  std::ostringstream s;
  const double W = 960, H = 720;
  s << "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='"
    << H << "' viewBox='0 0 " << W << " " << H << "' font-family='sans-serif' font-size='12'>\n";
  s << "<rect width='100%' height='100%' fill='#fafafa'/>\n";
  s << "<text x='" << W / 2
    << "' y='22' text-anchor='middle' font-size='15' font-weight='bold'>dsv4 bench-serve</text>\n";
  s << "<text x='" << W / 2 << "' y='40' text-anchor='middle' font-size='11'>" << svg_escape(subtitle) << "</text>\n";

  // Top: each request as a bar from its start to its end, the TTFT part darker.
  std::vector<const Outcome*> ok;
  double tmax = 0;
  for (auto& r : rs)
    if (r.success) ok.push_back(&r), tmax = std::max(tmax, r.start + r.latency);
  Panel top{70, 70, W - 100, 300};
  const auto [xmax, xstep] = nice_axis(tmax);
  const auto [ymax, ystep] = nice_axis(double(std::max<size_t>(ok.size(), 1)));
  axes(s, top, xmax, xstep, ymax, ystep, "Requests over time (light: decoding, dark: waiting for the first token)",
       "seconds since the start", "request");
  const double bar = std::max(0.5, top.h / ymax * 0.8);
  for (size_t i = 0; i < ok.size(); ++i) {
    const Outcome& r = *ok[i];
    const double y = top.y + top.h - double(i + 1) / ymax * top.h;
    const double x0 = top.x + r.start / xmax * top.w, xt = top.x + (r.start + r.ttft) / xmax * top.w,
                 x1 = top.x + (r.start + r.latency) / xmax * top.w;
    s << "<rect x='" << fmt(x0, 2) << "' y='" << fmt(y, 2) << "' width='" << fmt(std::max(0.3, xt - x0), 2)
      << "' height='" << fmt(bar, 2) << "' fill='#c0392b'/>";
    s << "<rect x='" << fmt(xt, 2) << "' y='" << fmt(y, 2) << "' width='" << fmt(std::max(0.3, x1 - xt), 2)
      << "' height='" << fmt(bar, 2) << "' fill='#5dade2'/>\n";
  }

  // Bottom: TTFT and ITL distributions.
  std::vector<double> ttft, itl;
  for (auto* r : ok) {
    ttft.push_back(r->ttft * 1000);
    for (double v : r->itl) itl.push_back(v * 1000);
  }
  histogram(s, Panel{70, 440, (W - 160) / 2, 230}, ttft, "Time to first token", "#c0392b");
  histogram(s, Panel{70 + (W - 160) / 2 + 60, 440, (W - 160) / 2, 230}, itl, "Inter-token latency", "#5dade2");
  s << "</svg>\n";
  return s.str();
}

// ---- the benchmark ----

// The server's counters (dsv4's /metrics) read before and after the run:
// speculative decoding, to report the acceptance as sglang.bench_serving
// does, and where the time of the engine's steps went. All zero when the
// server is not dsv4.
struct ServerCounters {
  double verifies = 0, drafted = 0, accepted = 0;
  double steps = 0, step_seconds = 0, forward_seconds = 0, sample_seconds = 0, emit_seconds = 0;
  double decode_steps = 0, decode_step_seconds = 0, decode_forward_seconds = 0;
  double process_cpu = 0, engine_cpu = 0, compute_threads = 0;
};
ServerCounters scrape_server_counters(const std::string& scheme_host_port) {
  const auto m = bench::scrape_metrics(scheme_host_port);
  ServerCounters c;
  c.verifies = bench::metric_sum(m, "dsv4:spec_verify_total");
  c.drafted = bench::metric_sum(m, "dsv4:spec_draft_tokens_total");
  c.accepted = bench::metric_sum(m, "dsv4:spec_accepted_tokens_total");
  c.steps = bench::metric_sum(m, "dsv4:engine_steps_total");
  c.step_seconds = bench::metric_sum(m, "dsv4:engine_step_seconds_total");
  c.forward_seconds = bench::metric_sum(m, "dsv4:engine_forward_seconds_total");
  c.sample_seconds = bench::metric_sum(m, "dsv4:engine_sample_seconds_total");
  c.emit_seconds = bench::metric_sum(m, "dsv4:engine_emit_seconds_total");
  c.decode_steps = bench::metric_sum(m, "dsv4:engine_decode_steps_total");
  c.decode_step_seconds = bench::metric_sum(m, "dsv4:engine_decode_step_seconds_total");
  c.decode_forward_seconds = bench::metric_sum(m, "dsv4:engine_decode_forward_seconds_total");
  c.process_cpu = bench::metric_sum(m, "process_cpu_seconds_total");
  c.engine_cpu = bench::metric_sum(m, "dsv4:engine_cpu_seconds_total");
  c.compute_threads = bench::metric_sum(m, "dsv4:compute_threads");
  return c;
}

// Where the run's engine steps went (docs/engine.md, "Overhead outside the
// model"): the scheduler thread's wall time outside the forward passes, and
// the CPU the rest of the server (HTTP handlers, detokenizing, streaming)
// took from the machine the compute threads run on; then the same for the
// steps that only decoded, charged with all of that CPU (an upper bound).
struct StepOverhead {
  double steps = 0, step_ms = 0, forward_share = 0, sample_share = 0, emit_share = 0, other_share = 0;
  double server_cpu_ms_per_step = 0, server_cpu_share = 0;
  double decode_steps = 0, decode_step_ms = 0, decode_outside_share = 0;
  double outside_share() const { return sample_share + emit_share + other_share + server_cpu_share; }
};
StepOverhead step_overhead(const ServerCounters& before, const ServerCounters& after) {
  StepOverhead o;
  o.steps = after.steps - before.steps;
  const double step = after.step_seconds - before.step_seconds;
  if (o.steps <= 0 || step <= 0) return o;
  const double forward = after.forward_seconds - before.forward_seconds;
  const double sample = after.sample_seconds - before.sample_seconds, emit = after.emit_seconds - before.emit_seconds;
  o.step_ms = 1e3 * step / o.steps;
  o.forward_share = forward / step;
  o.sample_share = sample / step;
  o.emit_share = emit / step;
  o.other_share = std::max(0.0, (step - forward - sample - emit) / step);
  const double server_cpu = (after.process_cpu - before.process_cpu) - (after.engine_cpu - before.engine_cpu);
  o.server_cpu_ms_per_step = 1e3 * std::max(0.0, server_cpu) / o.steps;
  const double threads = std::max(1.0, after.compute_threads);
  o.server_cpu_share = std::max(0.0, server_cpu) / (step * threads);
  o.decode_steps = after.decode_steps - before.decode_steps;
  const double decode_step = after.decode_step_seconds - before.decode_step_seconds;
  if (o.decode_steps > 0 && decode_step > 0) {
    const double decode_forward = after.decode_forward_seconds - before.decode_forward_seconds;
    o.decode_step_ms = 1e3 * decode_step / o.decode_steps;
    o.decode_outside_share =
        std::max(0.0, decode_step - decode_forward) / decode_step + std::max(0.0, server_cpu) / (decode_step * threads);
  }
  return o;
}

int run_bench_serve(const BenchServeArgs& a) {
  Target t;
  t.backend = a.backend;
  t.scheme_host_port = bench::server_root(a.base_url, a.host, a.port);
  double rate = std::numeric_limits<double>::infinity();
  if (a.request_rate != "inf") {
    try {
      rate = std::stod(a.request_rate);
    } catch (...) {
      throw std::runtime_error("--request-rate must be a number of requests/s or inf");
    }
    if (!(rate > 0)) throw std::runtime_error("--request-rate must be positive (or inf)");
  }
  if (a.dataset == "file" && a.dataset_path.empty()) throw std::runtime_error("--dataset file needs --dataset-path");
  if (a.token_id_lo < 0 || a.token_id_hi <= a.token_id_lo) throw std::runtime_error("bad random token id range");

  // The model name, for /v1/completions.
  {
    httplib::Client cli(t.scheme_host_port);
    cli.set_connection_timeout(10, 0);
    auto r = cli.Get("/v1/models");
    if (!r) throw std::runtime_error("cannot reach " + t.scheme_host_port + ": " + httplib::to_string(r.error()));
    if (r->status != 200) throw std::runtime_error("GET /v1/models: HTTP " + std::to_string(r->status) + " " + r->body);
    json j = json::parse(r->body, nullptr, false);
    t.model = a.model;
    if (t.model.empty() && !j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty())
      t.model = j["data"][0].value("id", "");
  }

  std::mt19937_64 rng(a.seed);
  std::vector<Prompt> prompts = make_prompts(a, rng);
  std::printf("#Input tokens: %lld (%s)\n#Output tokens: %lld\n",
              (long long)std::accumulate(prompts.begin(), prompts.end(), int64_t(0),
                                         [](int64_t s, const Prompt& p) { return s + p.input_len; }),
              a.dataset == "random" ? "random token ids" : "text prompts: counted by the server",
              (long long)std::accumulate(prompts.begin(), prompts.end(), int64_t(0),
                                         [](int64_t s, const Prompt& p) { return s + p.output_len; }));

  // Warm-up: one request, which must succeed.
  for (int64_t w = 0; w < a.warmup_requests && !prompts.empty(); ++w) {
    std::printf("Starting warmup request %lld ...\n", (long long)w + 1);
    std::fflush(stdout);
    Prompt p = prompts[0];
    p.output_len = std::min<int64_t>(p.output_len, 16);
    Outcome o = send_one(a, t, p, Clock::now());
    if (!o.success) throw std::runtime_error("the warm-up request failed: " + o.error);
  }

  std::printf("Backend: %s   Target: %s   Model: %s\n", t.backend.c_str(), t.scheme_host_port.c_str(), t.model.c_str());
  std::printf("Traffic request rate: %s   Max request concurrency: %s\n", a.request_rate.c_str(),
              a.max_concurrency > 0 ? std::to_string(a.max_concurrency).c_str() : "not set");
  std::fflush(stdout);

  std::vector<Outcome> results(prompts.size());
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0, completed = 0;
  const int64_t limit = a.max_concurrency > 0 ? a.max_concurrency : std::numeric_limits<int64_t>::max();
  std::exponential_distribution<double> gap(std::isinf(rate) ? 1.0 : rate);
  std::vector<std::thread> threads;
  threads.reserve(prompts.size());
  const ServerCounters server_before = scrape_server_counters(t.scheme_host_port);
  const auto start = Clock::now();
  auto next_arrival = start;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!std::isinf(rate)) {
      if (i > 0) next_arrival += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
      std::this_thread::sleep_until(next_arrival);
    }
    threads.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return in_flight < limit; });
        ++in_flight;
      }
      Outcome o;
      try {
        o = send_one(a, t, prompts[i], start);
      } catch (const std::exception& e) {
        o.error = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      results[i] = std::move(o);
      --in_flight;
      ++completed;
      const int64_t n = int64_t(prompts.size());
      if (n >= 50 && completed % (n / 10) == 0)
        std::fprintf(stderr, "  %lld/%lld requests done\n", (long long)completed, (long long)n);
      cv.notify_all();
    });
  }
  for (auto& th : threads) th.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();

  // Metrics.
  int64_t ok = 0, in_tokens = 0, out_tokens = 0;
  std::vector<double> ttft, itl, e2e, tpot;
  std::vector<std::string> errors;
  for (auto& r : results) {
    if (!r.success) {
      errors.push_back(r.error);
      continue;
    }
    ++ok;
    in_tokens += r.prompt_len;
    out_tokens += r.output_len;
    ttft.push_back(r.ttft * 1000);
    e2e.push_back(r.latency * 1000);
    for (double v : r.itl) itl.push_back(v * 1000);
    if (r.output_len > 1) tpot.push_back((r.latency - r.ttft) / double(r.output_len - 1) * 1000);
  }
  double concurrency = 0;
  for (double v : e2e) concurrency += v / 1000;
  concurrency /= duration;

  auto line = [](const char* k, const std::string& v) { std::printf("%-42s%s\n", k, v.c_str()); };
  std::printf("\n%s\n", "============ Serving Benchmark Result ============");
  line("Backend:", t.backend);
  line("Traffic request rate:", a.request_rate);
  line("Max request concurrency:", a.max_concurrency > 0 ? std::to_string(a.max_concurrency) : "not set");
  line("Successful requests:", std::to_string(ok));
  line("Failed requests:", std::to_string(int64_t(results.size()) - ok));
  line("Benchmark duration (s):", fmt(duration, 2));
  line("Total input tokens:", std::to_string(in_tokens));
  line("Total generated tokens:", std::to_string(out_tokens));
  line("Request throughput (req/s):", fmt(double(ok) / duration, 2));
  line("Input token throughput (tok/s):", fmt(double(in_tokens) / duration, 2));
  line("Output token throughput (tok/s):", fmt(double(out_tokens) / duration, 2));
  line("Total token throughput (tok/s):", fmt(double(in_tokens + out_tokens) / duration, 2));
  line("Concurrency:", fmt(concurrency, 2));
  const ServerCounters server_after = scrape_server_counters(t.scheme_host_port);
  const double verifies = server_after.verifies - server_before.verifies;
  const double accept_length =
      verifies > 0 ? (server_after.accepted - server_before.accepted + verifies) / verifies : 0;
  const double drafted = server_after.drafted - server_before.drafted;
  const double accept_rate = drafted > 0 ? (server_after.accepted - server_before.accepted) / drafted : 0;
  const StepOverhead overhead = step_overhead(server_before, server_after);
  if (verifies > 0) {
    line("Accept length:", fmt(accept_length, 2));
    line("Accept rate:", fmt(accept_rate, 2));
  }
  std::printf("%s\n", "----------------End-to-End Latency----------------");
  line("Mean E2E Latency (ms):", fmt(mean(e2e), 2));
  line("Median E2E Latency (ms):", fmt(percentile(e2e, 50), 2));
  line("P99 E2E Latency (ms):", fmt(percentile(e2e, 99), 2));
  std::printf("%s\n", "---------------Time to First Token----------------");
  line("Mean TTFT (ms):", fmt(mean(ttft), 2));
  line("Median TTFT (ms):", fmt(percentile(ttft, 50), 2));
  line("P99 TTFT (ms):", fmt(percentile(ttft, 99), 2));
  std::printf("%s\n", "-----Time per Output Token (excl. 1st token)------");
  line("Mean TPOT (ms):", fmt(mean(tpot), 2));
  line("Median TPOT (ms):", fmt(percentile(tpot, 50), 2));
  line("P99 TPOT (ms):", fmt(percentile(tpot, 99), 2));
  std::printf("%s\n", "---------------Inter-Token Latency----------------");
  line("Mean ITL (ms):", fmt(mean(itl), 2));
  line("Median ITL (ms):", fmt(percentile(itl, 50), 2));
  line("P95 ITL (ms):", fmt(percentile(itl, 95), 2));
  line("P99 ITL (ms):", fmt(percentile(itl, 99), 2));
  line("Max ITL (ms):", fmt(itl.empty() ? 0 : *std::max_element(itl.begin(), itl.end()), 2));
  line("Std ITL (ms):", fmt(stdev(itl), 2));
  if (overhead.steps > 0) {
    auto pct = [&](double share) { return fmt(100 * share, 2); };
    std::printf("%s\n", "-------------Engine steps (dsv4 /metrics)---------");
    line("Engine steps:", fmt(overhead.steps, 0));
    line("Mean step (ms):", fmt(overhead.step_ms, 2));
    line("Model forward (% of steps):", pct(overhead.forward_share));
    line("Sampling (% of steps):", pct(overhead.sample_share));
    line("Emitting tokens (% of steps):", pct(overhead.emit_share));
    line("Scheduling, admission, rest (% of steps):", pct(overhead.other_share));
    line("HTTP + detokenizing CPU (ms/step):", fmt(overhead.server_cpu_ms_per_step, 3));
    line("HTTP + detokenizing (% of compute CPU):", pct(overhead.server_cpu_share));
    line("Outside the model (% of a step):", pct(overhead.outside_share()));
    if (overhead.decode_steps > 0) {
      line("Decode-only steps:", fmt(overhead.decode_steps, 0));
      line("Mean decode-only step (ms):", fmt(overhead.decode_step_ms, 2));
      line("Outside the model (% of a decode step):", pct(overhead.decode_outside_share));
    }
  }
  std::printf("%s\n", "==================================================");
  if (!errors.empty()) {
    std::printf("first errors:\n");
    for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) std::printf("  %s\n", errors[i].c_str());
  }

  if (!a.output_csv.empty()) {
    std::ofstream csv(a.output_csv);
    if (!csv) throw std::runtime_error("cannot write " + a.output_csv);
    csv << "request,start_s,prompt_tokens,output_tokens,success,ttft_ms,e2e_latency_ms,tpot_ms,itl_mean_ms,itl_p99_ms,"
           "itl_max_ms,error\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Outcome& r = results[i];
      std::vector<double> itl_ms;
      for (double v : r.itl) itl_ms.push_back(v * 1000);
      std::string err = r.error;
      for (char& c : err)
        if (c == '"' || c == '\n' || c == '\r') c = '\'';
      csv << i << ',' << fmt(r.start, 6) << ',' << r.prompt_len << ',' << r.output_len << ',' << (r.success ? 1 : 0)
          << ',' << fmt(r.ttft * 1000, 3) << ',' << fmt(r.latency * 1000, 3) << ','
          << fmt(r.output_len > 1 ? (r.latency - r.ttft) / double(r.output_len - 1) * 1000 : 0, 3) << ','
          << fmt(mean(itl_ms), 3) << ',' << fmt(percentile(itl_ms, 99), 3) << ','
          << fmt(itl_ms.empty() ? 0 : *std::max_element(itl_ms.begin(), itl_ms.end()), 3) << ",\"" << err << "\"\n";
    }
    std::printf("wrote %s\n", a.output_csv.c_str());
  }
  if (!a.output_svg.empty()) {
    std::ofstream svg(a.output_svg);
    if (!svg) throw std::runtime_error("cannot write " + a.output_svg);
    std::string sub = t.backend + ", " + std::to_string(ok) + " requests, rate " + a.request_rate + ", concurrency " +
                      (a.max_concurrency > 0 ? std::to_string(a.max_concurrency) : "unlimited") + ", output " +
                      fmt(double(out_tokens) / duration, 1) + " tok/s, TTFT p50 " + fmt(percentile(ttft, 50), 1) +
                      " ms, ITL p50 " + fmt(percentile(itl, 50), 1) + " ms";
    svg << make_svg(results, sub);
    std::printf("wrote %s\n", a.output_svg.c_str());
  }
  if (!a.output_json.empty()) {
    json j = {{"backend", t.backend},
              {"request_rate", a.request_rate},
              {"max_concurrency", a.max_concurrency},
              {"completed", ok},
              {"failed", int64_t(results.size()) - ok},
              {"duration", duration},
              {"total_input_tokens", in_tokens},
              {"total_output_tokens", out_tokens},
              {"request_throughput", double(ok) / duration},
              {"input_throughput", double(in_tokens) / duration},
              {"output_throughput", double(out_tokens) / duration},
              {"concurrency", concurrency},
              {"mean_e2e_latency_ms", mean(e2e)},
              {"median_e2e_latency_ms", percentile(e2e, 50)},
              {"p99_e2e_latency_ms", percentile(e2e, 99)},
              {"mean_ttft_ms", mean(ttft)},
              {"median_ttft_ms", percentile(ttft, 50)},
              {"p99_ttft_ms", percentile(ttft, 99)},
              {"mean_tpot_ms", mean(tpot)},
              {"median_tpot_ms", percentile(tpot, 50)},
              {"p99_tpot_ms", percentile(tpot, 99)},
              {"mean_itl_ms", mean(itl)},
              {"median_itl_ms", percentile(itl, 50)},
              {"p99_itl_ms", percentile(itl, 99)}};
    if (overhead.steps > 0) {
      j["engine_steps"] = overhead.steps;
      j["engine_mean_step_ms"] = overhead.step_ms;
      j["engine_forward_share"] = overhead.forward_share;
      j["engine_sample_share"] = overhead.sample_share;
      j["engine_emit_share"] = overhead.emit_share;
      j["engine_other_share"] = overhead.other_share;
      j["server_cpu_ms_per_step"] = overhead.server_cpu_ms_per_step;
      j["server_cpu_share"] = overhead.server_cpu_share;
      j["outside_model_share"] = overhead.outside_share();
      j["decode_only_steps"] = overhead.decode_steps;
      j["decode_only_mean_step_ms"] = overhead.decode_step_ms;
      j["decode_only_outside_model_share"] = overhead.decode_outside_share;
    }
    if (verifies > 0) j["accept_length"] = accept_length, j["accept_rate"] = accept_rate;
    std::ofstream out(a.output_json, std::ios::app);  // one JSON line per run, like sglang's --output-file
    if (!out) throw std::runtime_error("cannot write " + a.output_json);
    out << j.dump() << "\n";
    std::printf("wrote %s\n", a.output_json.c_str());
  }
  return ok == int64_t(results.size()) ? 0 : 1;
}

}  // namespace

void register_bench_serve_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<BenchServeArgs>();
  auto mt = std::make_shared<MultiTurnArgs>();
  CLI::App* cmd = app.add_subcommand("bench-serve",
                                     "Online serving benchmark against a running server (like sglang.bench_serving)");
  cmd->add_option("--host", a->host, "Server host");
  cmd->add_option("--port", a->port, "Server port")->check(CLI::Range(1, 65535));
  cmd->add_option("--base-url", a->base_url, "Server root, e.g. http://127.0.0.1:30000 (overrides --host/--port)");
  cmd->add_option("--backend", a->backend, "generate (/generate, input_ids) | completions (/v1/completions)")
      ->check(CLI::IsMember({"generate", "completions", "sglang", "sglang-oai"}))
      ->transform([](std::string v) {
        return v == "sglang" ? std::string("generate") : v == "sglang-oai" ? std::string("completions") : v;
      });
  cmd->add_option("--model", a->model, "Model name for /v1/completions (default: the server's first model)");
  cmd->add_option("--dataset,--dataset-name", a->dataset, "random | file")->check(CLI::IsMember({"random", "file"}));
  cmd->add_option("--dataset-path", a->dataset_path, "JSONL file: one {\"prompt\": ..., \"output_len\"?: N} per line");
  cmd->add_option("--num-prompts", a->num_prompts, "Number of requests")->check(CLI::PositiveNumber);
  cmd->add_option("--random-input-len", a->random_input_len, "Prompt tokens (random dataset)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--random-output-len", a->random_output_len, "Output tokens per request")->check(CLI::PositiveNumber);
  cmd->add_option("--random-range-ratio", a->random_range_ratio, "Lengths are uniform in [len*ratio, len]; 1.0 = exact")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--request-rate", a->request_rate, "Requests per second (Poisson arrivals) or inf (all at once)");
  cmd->add_option("--max-concurrency", a->max_concurrency, "Most requests in flight (0 = unlimited)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "Seed of the prompts and arrival times");
  cmd->add_option("--temperature", a->temperature, "Sampling temperature (default 0: greedy, as sglang.bench_serving)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_flag("--disable-ignore-eos", a->disable_ignore_eos, "Let EOS end requests early (output lengths vary)");
  cmd->add_flag("--disable-stream", a->disable_stream, "Non-streaming requests (no TTFT/ITL)");
  cmd->add_option("--warmup-requests", a->warmup_requests, "Requests sent before measuring")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--random-token-lo", a->token_id_lo, "Smallest token id of random prompts");
  cmd->add_option("--random-token-hi", a->token_id_hi, "Token ids of random prompts are below this");
  cmd->add_option("--output-csv", a->output_csv, "Per-request CSV (--multi-turn: per turn)");
  cmd->add_option("--output-svg", a->output_svg,
                  "SVG plot: requests over time, TTFT and ITL distributions (--multi-turn: TTFT and cache coverage per "
                  "turn)");
  cmd->add_option("--output-file,--output-json", a->output_json, "Append the summary as one JSON line");
  cmd->add_option("--timeout", a->timeout_s, "Per-request read timeout in seconds")->check(CLI::PositiveNumber);
  add_multiturn_options(cmd, *mt);
  cmd->callback([a, mt, &exit_code] {
    try {
      if (mt->enabled) {
        MultiTurnArgs m = *mt;
        m.root = bench::server_root(a->base_url, a->host, a->port);
        m.model = a->model, m.request_rate = a->request_rate, m.seed = a->seed, m.temperature = a->temperature;
        m.timeout_s = a->timeout_s, m.ignore_eos = !a->disable_ignore_eos, m.warmup_requests = a->warmup_requests;
        m.output_csv = a->output_csv, m.output_svg = a->output_svg, m.output_json = a->output_json;
        exit_code = run_multiturn(m);
        return;
      }
      exit_code = run_bench_serve(*a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsv4 bench-serve: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
