// `dsv4 bench-serve --multi-turn`: N conversations of T turns against
// /v1/chat/completions. Every turn resends the whole conversation so far: a
// system prompt and tool schemas shared by all conversations, the earlier
// user messages and the assistant's earlier answers (as the server returned
// them), and a new user message. That is what an agent does on every step,
// and it is the load the prefix cache exists for: with a working cache each
// turn computes only its new message, so its time to first token stays flat
// instead of growing with the conversation.
//
// Reported per turn: TTFT (mean, median, p90 over conversations), prompt
// tokens, usage.prompt_tokens_details.cached_tokens (the server must run with
// --enable-cache-report), and the fraction of the previous turn's
// conversation (its prompt + its answer) that the cache covered; the server's
// cached tokens by tier come from /metrics. Flag names follow SGLang's
// benchmark/hicache/bench_multiturn.py where it has one.
#include "bench_serve_multiturn.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_serve_util.h"
#include "svg_plot.h"

namespace dsv4::tools {
namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using bench::fmt;
using bench::mean;
using bench::percentile;

// Common English words: each is one token of the DeepSeek vocabulary with its
// leading space, so n words make a text of about n tokens.
const char* const kWords[] = {
    "the",    "of",     "and",    "to",     "in",     "is",     "that",   "for",    "it",     "as",     "was",
    "with",   "be",     "by",     "on",     "not",    "he",     "this",   "are",    "or",     "his",    "from",
    "at",     "which",  "but",    "have",   "an",     "had",    "they",   "you",    "were",   "their",  "one",
    "all",    "we",     "can",    "her",    "has",    "there",  "been",   "if",     "more",   "when",   "will",
    "would",  "who",    "so",     "no",     "file",   "code",   "test",   "build",  "server", "request", "model",
    "cache",  "token",  "error",  "value",  "number", "string", "list",   "table",  "field",  "user",   "data",
    "time",   "state",  "page",   "line",   "input",  "output", "result", "check",  "path",   "name",   "type",
    "first",  "last",   "new",    "old",    "small",  "large",  "good",   "fast",   "slow",   "open",   "close",
    "read",   "write",  "run",    "stop",   "start",  "find",   "make",   "use",    "call",   "return"};

std::string words(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

// Tool schemas of about `total_tokens` tokens in all (a schema's JSON
// punctuation and names take about a third of its tokens).
json make_tools(std::mt19937_64& rng, int64_t num_tools, int64_t total_tokens) {
  json tools = json::array();
  if (num_tools <= 0 || total_tokens <= 0) return tools;
  const int64_t per_tool = std::max<int64_t>(8, total_tokens / num_tools * 2 / 3);
  for (int64_t i = 0; i < num_tools; ++i) {
    json props = json::object();
    const int64_t n_props = 3;
    for (int64_t k = 0; k < n_props; ++k)
      props["arg_" + std::to_string(k)] = {{"type", k == 0 ? "string" : k == 1 ? "integer" : "boolean"},
                                           {"description", words(rng, per_tool / 2 / n_props)}};
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", "tool_" + std::to_string(i)},
                       {"description", words(rng, per_tool / 2)},
                       {"parameters", {{"type", "object"}, {"properties", props}, {"required", {"arg_0"}}}}}}});
  }
  return tools;
}

struct TurnResult {
  int64_t conversation = 0, turn = 0;
  bool success = false;
  std::string error;
  double start = 0, ttft = 0, latency = 0;  // seconds
  int64_t prompt_tokens = 0, cached_tokens = -1, completion_tokens = 0;
  int64_t prev_conversation_tokens = 0;  // the previous turn's prompt + answer (0 on the first turn)
};

struct Conversation {
  json messages = json::array();
  int64_t next_turn = 0, prev_tokens = 0;
  bool done = false;
};

// One streamed chat turn. On success the assistant's answer is appended to
// `messages` (with its tool calls, answered by a short tool result).
TurnResult run_turn(const MultiTurnArgs& m, const json& tools, json& messages, Clock::time_point bench_start) {
  TurnResult o;
  const auto st = Clock::now();
  o.start = std::chrono::duration<double>(st - bench_start).count();
  json body = {{"model", m.model},
               {"messages", messages},
               {"max_tokens", m.output_length},
               {"temperature", m.temperature},
               {"ignore_eos", m.ignore_eos},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"logprobs", true},  // one chunk per sampled token: exact TTFT even for tokens that print nothing
               {"chat_template_kwargs", {{"thinking", m.thinking}}}};
  if (!tools.empty()) body["tools"] = tools;

  std::string content, reasoning, error;
  json tool_calls = json::array();
  bool done = false, got_usage = false;
  int64_t tokens = 0;
  auto handle = [&](const std::string& d) {
    if (d == "[DONE]") return done = true, true;
    json j = json::parse(d, nullptr, false);
    if (j.is_discarded()) return error = "unparsable SSE data: " + d.substr(0, 200), false;
    if (j.contains("error"))
      return error = j["error"].is_object() ? j["error"].value("message", j.dump()) : j.dump(), false;
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      const json& c = j["choices"][0];
      int64_t n = 0;
      if (c.contains("logprobs") && c["logprobs"].is_object() && c["logprobs"].contains("content") &&
          c["logprobs"]["content"].is_array())
        n = int64_t(c["logprobs"]["content"].size());
      if (c.contains("delta") && c["delta"].is_object()) {
        const json& dl = c["delta"];
        if (dl.contains("content") && dl["content"].is_string()) content += dl["content"].get<std::string>();
        if (dl.contains("reasoning_content") && dl["reasoning_content"].is_string())
          reasoning += dl["reasoning_content"].get<std::string>();
        if (dl.contains("tool_calls") && dl["tool_calls"].is_array())
          for (const json& tc : dl["tool_calls"]) {
            const size_t idx = tc.value("index", size_t(0));
            while (tool_calls.size() <= idx)
              tool_calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
            json& t = tool_calls[idx];
            if (tc.contains("id") && tc["id"].is_string()) t["id"] = tc["id"];
            if (tc.contains("function") && tc["function"].is_object()) {
              const json& f = tc["function"];
              if (f.contains("name") && f["name"].is_string())
                t["function"]["name"] = t["function"]["name"].get<std::string>() + f["name"].get<std::string>();
              if (f.contains("arguments") && f["arguments"].is_string())
                t["function"]["arguments"] =
                    t["function"]["arguments"].get<std::string>() + f["arguments"].get<std::string>();
            }
          }
        if (n == 0 && (!content.empty() || !reasoning.empty() || !tool_calls.empty())) n = tokens > 0 ? 0 : 1;
      }
      if (n > 0 && tokens == 0) o.ttft = std::chrono::duration<double>(Clock::now() - st).count();
      tokens += n;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      got_usage = true;
      o.prompt_tokens = u.value("prompt_tokens", int64_t(0));
      o.completion_tokens = u.value("completion_tokens", tokens);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        o.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t(-1));
    }
    return true;
  };
  const bench::SseOutcome r = bench::post_sse(m.root, "/v1/chat/completions", body.dump(), m.timeout_s, handle);
  o.latency = std::chrono::duration<double>(Clock::now() - st).count();
  if (!error.empty()) return o.error = error, o;
  if (!r.sent) return o.error = "HTTP request failed: " + httplib::to_string(r.error), o;
  if (r.status != 200) {
    json j = json::parse(r.error_body, nullptr, false);
    o.error = "HTTP " + std::to_string(r.status) + ": " +
              (!j.is_discarded() && j.contains("error") && j["error"].is_object() ? j["error"].value("message", "")
                                                                                  : r.error_body.substr(0, 200));
    return o;
  }
  if (!done) return o.error = "the stream ended without data: [DONE]", o;
  if (!got_usage) return o.error = "no usage chunk (stream_options.include_usage)", o;
  if (o.completion_tokens <= 0) return o.error = "no tokens generated", o;
  json answer = {{"role", "assistant"}, {"content", content}};
  if (!reasoning.empty()) answer["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) answer["tool_calls"] = tool_calls;
  messages.push_back(answer);
  for (const json& tc : tool_calls)  // an agent answers every call before the next user message
    messages.push_back({{"role", "tool"}, {"tool_call_id", tc["id"]}, {"content", "done"}});
  o.success = true;
  return o;
}

// ---- per-turn statistics ----

struct TurnStats {
  int64_t turn = 0, requests = 0;
  double prompt = 0, cached = 0, prev = 0;  // means
  double cached_of_prev = 0, cached_of_prev_min = 0, hit_rate = 0;
  double ttft_mean = 0, ttft_median = 0, ttft_p90 = 0, latency_mean = 0;  // ms
};

std::vector<TurnStats> per_turn(const std::vector<TurnResult>& rs, int64_t rounds) {
  std::vector<TurnStats> out;
  for (int64_t t = 0; t < rounds; ++t) {
    TurnStats s;
    s.turn = t + 1;
    std::vector<double> ttft, lat, fr;
    double prompt = 0, cached = 0, prev = 0;
    for (const auto& r : rs) {
      if (!r.success || r.turn != t) continue;
      ++s.requests;
      ttft.push_back(r.ttft * 1000), lat.push_back(r.latency * 1000);
      prompt += double(r.prompt_tokens), cached += double(std::max<int64_t>(0, r.cached_tokens));
      prev += double(r.prev_conversation_tokens);
      if (r.prev_conversation_tokens > 0)
        fr.push_back(double(std::max<int64_t>(0, r.cached_tokens)) / double(r.prev_conversation_tokens));
    }
    if (s.requests == 0) continue;
    const double n = double(s.requests);
    s.prompt = prompt / n, s.cached = cached / n, s.prev = prev / n;
    s.cached_of_prev = prev > 0 ? cached / prev : 0;
    s.cached_of_prev_min = fr.empty() ? 0 : *std::min_element(fr.begin(), fr.end());
    s.hit_rate = prompt > 0 ? cached / prompt : 0;
    s.ttft_mean = mean(ttft), s.ttft_median = percentile(ttft, 50), s.ttft_p90 = percentile(ttft, 90);
    s.latency_mean = mean(lat);
    out.push_back(s);
  }
  return out;
}

const char* kTurnCsvHeader =
    "turn,requests,prompt_tokens_mean,cached_tokens_mean,prev_conversation_tokens_mean,cached_of_prev,"
    "cached_of_prev_min,cache_hit_rate,ttft_mean_ms,ttft_median_ms,ttft_p90_ms,latency_mean_ms";

void write_turn_csv(const std::string& path, const std::vector<TurnStats>& ts) {
  std::ofstream csv(path);
  if (!csv) throw std::runtime_error("cannot write " + path);
  csv << kTurnCsvHeader << "\n";
  for (const auto& s : ts)
    csv << s.turn << ',' << s.requests << ',' << fmt(s.prompt, 1) << ',' << fmt(s.cached, 1) << ',' << fmt(s.prev, 1)
        << ',' << fmt(s.cached_of_prev, 4) << ',' << fmt(s.cached_of_prev_min, 4) << ',' << fmt(s.hit_rate, 4) << ','
        << fmt(s.ttft_mean, 1) << ',' << fmt(s.ttft_median, 1) << ',' << fmt(s.ttft_p90, 1) << ','
        << fmt(s.latency_mean, 1) << "\n";
}

// Reads a per-turn CSV written by write_turn_csv (another run, to plot beside this one).
std::vector<TurnStats> read_turn_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read --compare-csv '" + path + "'");
  std::string line;
  if (!std::getline(in, line) || line != kTurnCsvHeader)
    throw std::runtime_error("--compare-csv '" + path + "' is not a multi-turn per-turn CSV");
  std::vector<TurnStats> out;
  while (std::getline(in, line)) {
    std::vector<double> v;
    std::istringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) v.push_back(std::strtod(cell.c_str(), nullptr));
    if (v.size() < 12) continue;
    TurnStats s;
    s.turn = int64_t(v[0]), s.requests = int64_t(v[1]), s.prompt = v[2], s.cached = v[3], s.prev = v[4];
    s.cached_of_prev = v[5], s.cached_of_prev_min = v[6], s.hit_rate = v[7];
    s.ttft_mean = v[8], s.ttft_median = v[9], s.ttft_p90 = v[10], s.latency_mean = v[11];
    out.push_back(s);
  }
  return out;
}

// ---- SVG: TTFT per turn (top) and cache coverage per turn (bottom) ----

struct Series {
  std::string label, color;
  std::vector<TurnStats> turns;
};

std::string make_svg(const std::vector<Series>& series, int64_t rounds, const std::string& subtitle) {
  std::ostringstream s;
  const double W = 900, H = 680;
  s << "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='"
    << H << "' viewBox='0 0 " << W << " " << H << "' font-family='sans-serif' font-size='12'>\n"
    << "<rect width='100%' height='100%' fill='#fafafa'/>\n"
    << "<text x='" << W / 2
    << "' y='22' text-anchor='middle' font-size='15' font-weight='bold'>dsv4 bench-serve --multi-turn</text>\n"
    << "<text x='" << W / 2 << "' y='40' text-anchor='middle' font-size='11'>" << svg_escape(subtitle) << "</text>\n";
  struct P {
    double x, y, w, h;
  };
  auto panel = [&](const P& p, double ymax, double ystep, const std::string& title, const std::string& ylabel,
                   int yprec) {
    s << "<rect x='" << p.x << "' y='" << p.y << "' width='" << p.w << "' height='" << p.h
      << "' fill='#fff' stroke='#888'/>\n<text x='" << p.x + p.w / 2 << "' y='" << p.y - 8
      << "' text-anchor='middle' font-weight='bold'>" << svg_escape(title) << "</text>\n";
    for (int64_t t = 1; t <= rounds; ++t) {
      const double px = p.x + (double(t) - 0.5) / double(rounds) * p.w;
      s << "<text x='" << fmt(px, 1) << "' y='" << p.y + p.h + 16 << "' text-anchor='middle' font-size='10'>" << t
        << "</text>\n";
    }
    for (double v = 0; v <= ymax + 1e-9; v += ystep) {
      const double py = p.y + p.h - v / ymax * p.h;
      s << "<line x1='" << p.x << "' y1='" << fmt(py, 1) << "' x2='" << p.x + p.w << "' y2='" << fmt(py, 1)
        << "' stroke='#eee'/><text x='" << p.x - 6 << "' y='" << fmt(py + 3, 1)
        << "' text-anchor='end' font-size='10'>" << fmt(v, yprec) << "</text>\n";
    }
    s << "<text x='" << p.x + p.w / 2 << "' y='" << p.y + p.h + 32
      << "' text-anchor='middle' font-size='11'>turn</text>\n<text transform='translate(" << p.x - 48 << ","
      << p.y + p.h / 2 << ") rotate(-90)' text-anchor='middle' font-size='11'>" << svg_escape(ylabel) << "</text>\n";
  };
  auto px_of = [&](const P& p, int64_t turn) { return p.x + (double(turn) - 0.5) / double(rounds) * p.w; };
  auto polyline = [&](const P& p, double ymax, const Series& se, double TurnStats::*field, bool dashed) {
    s << "<polyline fill='none' stroke='" << se.color << "' stroke-width='2'"
      << (dashed ? " stroke-dasharray='5,4'" : "") << " points='";
    for (const auto& t : se.turns)
      s << fmt(px_of(p, t.turn), 1) << ',' << fmt(p.y + p.h - std::min(t.*field, ymax) / ymax * p.h, 1) << ' ';
    s << "'/>\n";
    if (!dashed)
      for (const auto& t : se.turns)
        s << "<circle cx='" << fmt(px_of(p, t.turn), 1) << "' cy='"
          << fmt(p.y + p.h - std::min(t.*field, ymax) / ymax * p.h, 1) << "' r='3' fill='" << se.color << "'/>\n";
  };

  double tmax = 0;
  for (const auto& se : series)
    for (const auto& t : se.turns) tmax = std::max(tmax, t.ttft_p90);
  const auto [ymax, ystep] = bench::nice_axis(tmax / 1000);
  const P top{80, 70, W - 260, 320};
  panel(top, ymax, ystep, "Time to first token per turn (solid: median, dashed: p90)", "seconds", ystep < 1 ? 2 : 0);
  for (const auto& se : series) {
    Series sec = se;
    for (auto& t : sec.turns) t.ttft_median /= 1000, t.ttft_p90 /= 1000;
    polyline(top, ymax, sec, &TurnStats::ttft_median, false);
    polyline(top, ymax, sec, &TurnStats::ttft_p90, true);
  }
  const P bot{80, 450, W - 260, 170};
  panel(bot, 1.0, 0.25, "cached_tokens / previous turn's prompt + answer", "fraction", 2);
  const double y95 = bot.y + bot.h - 0.95 * bot.h;
  s << "<line x1='" << bot.x << "' y1='" << fmt(y95, 1) << "' x2='" << bot.x + bot.w << "' y2='" << fmt(y95, 1)
    << "' stroke='#999' stroke-dasharray='2,3'/><text x='" << bot.x + bot.w - 4 << "' y='" << fmt(y95 + 12, 1)
    << "' text-anchor='end' font-size='10'>95%</text>\n";
  for (const auto& se : series) {
    Series later = se;
    later.turns.erase(std::remove_if(later.turns.begin(), later.turns.end(),
                                     [](const TurnStats& t) { return t.turn < 2; }),
                      later.turns.end());
    polyline(bot, 1.0, later, &TurnStats::cached_of_prev, false);
  }
  double ly = 80;
  for (const auto& se : series) {
    s << "<rect x='" << W - 165 << "' y='" << ly << "' width='14' height='14' fill='" << se.color << "'/><text x='"
      << W - 145 << "' y='" << ly + 11 << "'>" << svg_escape(se.label) << "</text>\n";
    ly += 22;
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

void add_multiturn_options(CLI::App* cmd, MultiTurnArgs& m) {
  auto* g = cmd->add_option_group("multi-turn", "Agentic multi-turn trace (--multi-turn; /v1/chat/completions)");
  g->add_flag("--multi-turn", m.enabled,
              "Run N conversations of T turns, each turn resending the whole conversation (like SGLang's "
              "bench_multiturn.py); the server should run with --enable-cache-report");
  g->add_option("--num-clients", m.num_clients, "Conversations")->check(CLI::PositiveNumber);
  g->add_option("--num-rounds", m.num_rounds, "Turns per conversation")->check(CLI::PositiveNumber);
  g->add_option("--max-parallel", m.max_parallel, "Most turns in flight (default 1: TTFT without queueing)")
      ->check(CLI::PositiveNumber);
  g->add_option("--system-prompt-length", m.system_prompt_len,
                "Tokens of the system prompt every conversation shares (about one token a word)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--tool-schema-length", m.tool_schema_len, "Tokens of the shared tool schemas, about")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--num-tools", m.num_tools, "Tools the schemas describe")->check(CLI::NonNegativeNumber);
  g->add_option("--request-length", m.request_length, "Tokens of each conversation's first user message")
      ->check(CLI::PositiveNumber);
  g->add_option("--sub-question-input-length", m.sub_question_input_length,
                "Tokens of every later user message (0: --request-length)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--output-length", m.output_length, "Answer tokens per turn")->check(CLI::PositiveNumber);
  g->add_flag("--enable-round-barrier", m.enable_round_barrier,
              "Send turn t+1 of any conversation only after every conversation finished turn t");
  g->add_option("--ready-queue-policy", m.ready_queue_policy, "Which ready conversation goes next: fifo | random")
      ->check(CLI::IsMember({"fifo", "random"}));
  g->add_flag("--thinking", m.thinking,
              "Thinking mode (earlier turns' reasoning is dropped from the history, as the chat template does, so "
              "the cache can only reuse up to the previous turn's prompt)");
  g->add_option("--label", m.label, "Name of this run in the plot (default: cache or no cache, from the server)");
  g->add_option("--compare-csv", m.compare_csv, "A per-turn CSV of another run to plot beside this one");
  g->add_option("--compare-label", m.compare_label, "Its name in the plot");
  g->add_option("--output-requests-csv", m.output_requests_csv, "Per-request CSV (--output-csv is per turn)");
  g->add_option("--tag", m.tag, "Tag of this run in the JSON summary line");
}

int run_multiturn(const MultiTurnArgs& m) {
  double rate = std::numeric_limits<double>::infinity();
  if (m.request_rate != "inf") {
    rate = std::strtod(m.request_rate.c_str(), nullptr);
    if (!(rate > 0)) throw std::runtime_error("--request-rate must be a positive number of requests/s or inf");
  }
  MultiTurnArgs a = m;
  {
    httplib::Client cli(a.root);
    cli.set_connection_timeout(10, 0);
    auto r = cli.Get("/v1/models");
    if (!r) throw std::runtime_error("cannot reach " + a.root + ": " + httplib::to_string(r.error()));
    if (r->status != 200) throw std::runtime_error("GET /v1/models: HTTP " + std::to_string(r->status) + " " + r->body);
    json j = json::parse(r->body, nullptr, false);
    if (a.model.empty() && !j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty())
      a.model = j["data"][0].value("id", "");
  }

  // The trace: shared system prompt and tools, then per conversation its
  // user messages, all drawn from the seed (the same seed, the same trace).
  std::mt19937_64 rng(a.seed);
  const std::string system = "You are an agent working in a software repository. " + words(rng, a.system_prompt_len);
  const json tools = make_tools(rng, a.num_tools, a.tool_schema_len);
  const int64_t sub_len = a.sub_question_input_length > 0 ? a.sub_question_input_length : a.request_length;
  std::vector<std::vector<std::string>> user(size_t(a.num_clients));
  for (auto& u : user)
    for (int64_t t = 0; t < a.num_rounds; ++t) u.push_back(words(rng, t == 0 ? a.request_length : sub_len));
  std::vector<Conversation> conv(size_t(a.num_clients));
  for (auto& c : conv) c.messages.push_back({{"role", "system"}, {"content", system}});

  for (int64_t w = 0; w < a.warmup_requests; ++w) {  // pages the weights in; shares no prefix with the trace
    std::printf("Starting warmup request %lld ...\n", (long long)w + 1);
    std::fflush(stdout);
    std::mt19937_64 wr(a.seed ^ 0x9e3779b97f4a7c15ULL ^ uint64_t(w));
    json msgs = json::array({{{"role", "user"}, {"content", "Warm up: " + words(wr, 32)}}});
    MultiTurnArgs wa = a;
    wa.output_length = std::min<int64_t>(a.output_length, 4);
    TurnResult o = run_turn(wa, json::array(), msgs, Clock::now());
    if (!o.success) throw std::runtime_error("the warm-up request failed: " + o.error);
  }

  const auto before = bench::scrape_metrics(a.root);
  std::printf("Target: %s   Model: %s   %lld conversations x %lld turns, max parallel %lld%s\n", a.root.c_str(),
              a.model.c_str(), (long long)a.num_clients, (long long)a.num_rounds, (long long)a.max_parallel,
              a.enable_round_barrier ? ", round barrier" : "");
  std::fflush(stdout);

  std::mutex mu;
  std::condition_variable cv;
  std::deque<int64_t> ready, waiting;  // conversations whose next turn may start / waits for the barrier
  for (int64_t i = 0; i < a.num_clients; ++i) ready.push_back(i);
  int64_t in_flight = 0, live = a.num_clients;
  std::vector<TurnResult> results;
  std::mt19937_64 pick_rng(a.seed + 1);
  std::exponential_distribution<double> gap(std::isinf(rate) ? 1.0 : rate);
  const auto start = Clock::now();
  auto next_send = start;
  const int64_t total = a.num_clients * a.num_rounds;

  auto worker = [&] {
    for (;;) {
      int64_t ci;
      Clock::time_point send_at;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !ready.empty() || live == 0; });
        if (ready.empty()) return;
        size_t k = 0;
        if (a.ready_queue_policy == "random") k = std::uniform_int_distribution<size_t>(0, ready.size() - 1)(pick_rng);
        ci = ready[k];
        ready.erase(ready.begin() + std::ptrdiff_t(k));
        ++in_flight;
        send_at = std::max(next_send, Clock::now());
        if (!std::isinf(rate))
          next_send = send_at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(pick_rng)));
      }
      std::this_thread::sleep_until(send_at);
      Conversation& c = conv[size_t(ci)];  // only this worker touches it while the turn runs
      c.messages.push_back({{"role", "user"}, {"content", user[size_t(ci)][size_t(c.next_turn)]}});
      TurnResult r;
      try {
        r = run_turn(a, tools, c.messages, start);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      r.conversation = ci, r.turn = c.next_turn, r.prev_conversation_tokens = c.prev_tokens;
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      ++c.next_turn;
      c.prev_tokens = r.prompt_tokens + r.completion_tokens;
      if (!r.success || c.next_turn >= a.num_rounds) {
        c.done = true, --live;  // a failed turn ends its conversation: the history has no answer to resend
      } else {
        (a.enable_round_barrier ? waiting : ready).push_back(ci);
      }
      if (ready.empty() && in_flight == 0)
        while (!waiting.empty()) ready.push_back(waiting.front()), waiting.pop_front();
      results.push_back(std::move(r));
      if (total >= 20 && results.size() % size_t(std::max<int64_t>(1, total / 10)) == 0)
        std::fprintf(stderr, "  %zu/%lld turns done\n", results.size(), (long long)total);
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int64_t i = 0; i < std::min(a.max_parallel, a.num_clients); ++i) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  const auto after = bench::scrape_metrics(a.root);

  // ---- report ----
  std::sort(results.begin(), results.end(), [](const TurnResult& x, const TurnResult& y) {
    return std::tie(x.conversation, x.turn) < std::tie(y.conversation, y.turn);
  });
  int64_t ok = 0, in_tokens = 0, out_tokens = 0, cached = 0;
  bool cache_reported = true;
  std::vector<double> ttft, lat;
  std::vector<std::string> errors;
  for (const auto& r : results) {
    if (!r.success) {
      errors.push_back("conversation " + std::to_string(r.conversation) + " turn " + std::to_string(r.turn + 1) +
                       ": " + r.error);
      continue;
    }
    ++ok, in_tokens += r.prompt_tokens, out_tokens += r.completion_tokens;
    if (r.cached_tokens < 0) cache_reported = false;
    cached += std::max<int64_t>(0, r.cached_tokens);
    ttft.push_back(r.ttft * 1000), lat.push_back(r.latency * 1000);
  }
  const std::vector<TurnStats> ts = per_turn(results, a.num_rounds);
  auto delta = [&](const std::string& name, const std::string& label = "") {
    return bench::metric_sum(after, name, label) - bench::metric_sum(before, name, label);
  };
  const double tier_device = delta("sglang:cached_tokens_total", "cache_source=\"device\"");
  const double tier_host = delta("sglang:cached_tokens_total", "cache_source=\"host\"");
  const double tier_storage = delta("sglang:cached_tokens_total", "cache_source=\"storage_file\"");

  auto line = [](const char* k, const std::string& v) { std::printf("%-42s%s\n", k, v.c_str()); };
  std::printf("\n%s\n", "============ Multi-turn Benchmark Result ============");
  line("Conversations x turns:", std::to_string(a.num_clients) + " x " + std::to_string(a.num_rounds));
  line("Max parallel:", std::to_string(a.max_parallel));
  line("Successful requests:", std::to_string(ok));
  line("Failed requests:", std::to_string(int64_t(results.size()) - ok));
  line("Not sent (after a failed turn):", std::to_string(total - int64_t(results.size())));
  line("Benchmark duration (s):", fmt(duration, 2));
  line("Average Prompt Length (tokens):", fmt(ok ? double(in_tokens) / double(ok) : 0, 1));
  line("Average Output Length (tokens):", fmt(ok ? double(out_tokens) / double(ok) : 0, 1));
  line("Average TTFT (ms):", fmt(mean(ttft), 2));
  line("Median TTFT (ms):", fmt(percentile(ttft, 50), 2));
  line("P90 TTFT (ms):", fmt(percentile(ttft, 90), 2));
  line("Average latency (ms):", fmt(mean(lat), 2));
  line("Input token throughput (tok/s):", fmt(double(in_tokens) / duration, 2));
  line("Output token throughput (tok/s):", fmt(double(out_tokens) / duration, 2));
  line("Request Throughput (req/s):", fmt(double(ok) / duration, 3));
  line("Cache Hit Rate:", cache_reported ? fmt(in_tokens ? double(cached) / double(in_tokens) : 0, 4)
                                         : std::string("n/a (start the server with --enable-cache-report)"));
  if (!after.empty())
    line("Cached tokens by tier (/metrics):", fmt(tier_device, 0) + " device, " + fmt(tier_host, 0) + " host, " +
                                                  fmt(tier_storage, 0) + " storage_file");
  std::printf("%s\n", "---------------------- Per turn ----------------------");
  std::printf("%4s %4s %8s %8s %9s %8s %8s %10s %10s %10s\n", "turn", "reqs", "prompt", "cached", "prev_conv",
              "cov_prev", "cov_min", "TTFT_mean", "TTFT_p50", "TTFT_p90");
  for (const auto& s : ts)
    std::printf("%4lld %4lld %8.1f %8.1f %9.1f %8s %8s %10.1f %10.1f %10.1f\n", (long long)s.turn,
                (long long)s.requests, s.prompt, s.cached, s.prev, s.turn > 1 ? fmt(s.cached_of_prev, 4).c_str() : "-",
                s.turn > 1 ? fmt(s.cached_of_prev_min, 4).c_str() : "-", s.ttft_mean, s.ttft_median, s.ttft_p90);
  const TurnStats* t2 = nullptr;
  for (const auto& s : ts)
    if (s.turn == 2) t2 = &s;
  if (t2 && !ts.empty() && ts.back().turn > 2 && t2->ttft_median > 0)
    line("Median TTFT last turn / turn 2:", fmt(ts.back().ttft_median / t2->ttft_median, 2));
  std::printf("%s\n", "=====================================================");
  if (!errors.empty()) {
    std::printf("first errors:\n");
    for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) std::printf("  %s\n", errors[i].c_str());
  }

  if (!a.output_csv.empty()) {
    write_turn_csv(a.output_csv, ts);
    std::printf("wrote %s\n", a.output_csv.c_str());
  }
  if (!a.output_requests_csv.empty()) {
    std::ofstream csv(a.output_requests_csv);
    if (!csv) throw std::runtime_error("cannot write " + a.output_requests_csv);
    csv << "conversation,turn,start_s,prompt_tokens,cached_tokens,prev_conversation_tokens,completion_tokens,ttft_ms,"
           "latency_ms,success,error\n";
    for (const auto& r : results) {
      std::string err = r.error;
      for (char& ch : err)
        if (ch == '"' || ch == '\n' || ch == '\r') ch = '\'';
      csv << r.conversation << ',' << r.turn + 1 << ',' << fmt(r.start, 3) << ',' << r.prompt_tokens << ','
          << r.cached_tokens << ',' << r.prev_conversation_tokens << ',' << r.completion_tokens << ','
          << fmt(r.ttft * 1000, 1) << ',' << fmt(r.latency * 1000, 1) << ',' << (r.success ? 1 : 0) << ",\"" << err
          << "\"\n";
    }
    std::printf("wrote %s\n", a.output_requests_csv.c_str());
  }
  if (!a.output_svg.empty()) {
    std::vector<Series> series;
    std::string label = a.label;
    if (label.empty()) label = cached > 0 ? "cache" : "no cache";
    series.push_back({label, "#c0392b", ts});
    if (!a.compare_csv.empty())
      series.push_back({a.compare_label.empty() ? a.compare_csv : a.compare_label, "#2e86c1",
                        read_turn_csv(a.compare_csv)});
    std::ofstream svg(a.output_svg);
    if (!svg) throw std::runtime_error("cannot write " + a.output_svg);
    svg << make_svg(series, a.num_rounds,
                    std::to_string(a.num_clients) + " conversations x " + std::to_string(a.num_rounds) +
                        " turns, shared prefix ~" + std::to_string(a.system_prompt_len + a.tool_schema_len) +
                        " tokens, +" + std::to_string(sub_len) + " user tokens and " +
                        std::to_string(a.output_length) + " answer tokens per turn");
    std::printf("wrote %s\n", a.output_svg.c_str());
  }
  if (!a.output_json.empty()) {
    json turns = json::array();
    for (const auto& s : ts)
      turns.push_back({{"turn", s.turn},
                       {"requests", s.requests},
                       {"prompt_tokens_mean", s.prompt},
                       {"cached_tokens_mean", s.cached},
                       {"cached_of_prev", s.cached_of_prev},
                       {"cached_of_prev_min", s.cached_of_prev_min},
                       {"ttft_mean_ms", s.ttft_mean},
                       {"ttft_median_ms", s.ttft_median},
                       {"ttft_p90_ms", s.ttft_p90}});
    json j = {{"mode", "multi-turn"},
              {"tag", a.tag},
              {"num_clients", a.num_clients},
              {"num_rounds", a.num_rounds},
              {"completed", ok},
              {"failed", int64_t(results.size()) - ok},
              {"duration", duration},
              {"total_input_tokens", in_tokens},
              {"total_output_tokens", out_tokens},
              {"cached_tokens", cached},
              {"cache_hit_rate", in_tokens ? double(cached) / double(in_tokens) : 0},
              {"cached_tokens_by_tier", {{"device", tier_device}, {"host", tier_host}, {"storage_file", tier_storage}}},
              {"average_ttft_ms", mean(ttft)},
              {"median_ttft_ms", percentile(ttft, 50)},
              {"p90_ttft_ms", percentile(ttft, 90)},
              {"round", turns}};
    std::ofstream out(a.output_json, std::ios::app);
    if (!out) throw std::runtime_error("cannot write " + a.output_json);
    out << j.dump() << "\n";
    std::printf("wrote %s\n", a.output_json.c_str());
  }
  return ok == total ? 0 : 1;
}

}  // namespace dsv4::tools
