#include "server/metrics.h"

#include <cstdio>
#include <sstream>

namespace dsv4 {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::ostringstream o;
  o << "# TYPE " << name << " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    o << name << "_bucket{" << labels << ",le=\"" << bounds_[i] << "\"} " << cum << "\n";
  }
  cum += counts_.back();
  o << name << "_bucket{" << labels << ",le=\"+Inf\"} " << cum << "\n";
  o << name << "_sum{" << labels << "} " << sum_ << "\n";
  o << name << "_count{" << labels << "} " << count_ << "\n";
  return o.str();
}

ServerMetrics::ServerMetrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}),
      e2e_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}),
      tpot_({0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2}) {}

void ServerMetrics::observe_request(const RequestTimes& t, int64_t completion_tokens, bool aborted) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (t.first_token > 0) ttft_.observe(t.first_token - t.submitted);
  if (t.finished > 0 && !aborted) {
    e2e_.observe(t.finished - t.submitted);
    if (completion_tokens > 1 && t.first_token > 0)
      tpot_.observe((t.finished - t.first_token) / double(completion_tokens - 1));
  }
}

std::string ServerMetrics::render(const EngineMetrics& m, const std::string& model_name) const {
  std::ostringstream o;
  const std::string labels = "model_name=\"" + model_name + "\"";
  auto metric = [&](const char* type, const char* name, double value, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    o << name << "{" << labels << "} " << value << "\n";
  };
  metric("counter", "sglang:prompt_tokens_total", double(m.prompt_tokens_total), "Prefilled prompt tokens.");
  metric("counter", "sglang:generation_tokens_total", double(m.generation_tokens_total), "Generated tokens.");
  o << "# HELP sglang:cached_tokens_total Prompt tokens served from the prefix cache.\n"
    << "# TYPE sglang:cached_tokens_total counter\n"
    << "sglang:cached_tokens_total{" << labels << ",cache_source=\"host\"} " << m.cached_tokens_total << "\n";
  metric("counter", "sglang:num_requests_total", double(m.requests_total), "Requests received.");
  metric("counter", "sglang:num_aborted_requests_total", double(m.aborted_total), "Requests aborted.");
  metric("gauge", "sglang:num_running_reqs", double(m.running), "Requests being processed.");
  metric("gauge", "sglang:num_queue_reqs", double(m.queued), "Requests waiting.");
  metric("gauge", "sglang:num_used_tokens", double(m.used_tokens), "Tokens reserved by running requests.");
  metric("gauge", "sglang:gen_throughput", m.gen_throughput, "Generation throughput (tokens/s).");
  // The scheduler thread's time, for telling the model's share of a step
  // from the engine's own work (dsv4's names: SGLang has no equivalent).
  metric("counter", "dsv4:engine_steps_total", double(m.steps_total), "Scheduler steps run.");
  metric("counter", "dsv4:engine_step_seconds_total", m.step_seconds, "Seconds spent in scheduler steps.");
  metric("counter", "dsv4:engine_forward_seconds_total", m.forward_seconds, "Seconds in the model's forward passes.");
  metric("counter", "dsv4:engine_sample_seconds_total", m.sample_seconds, "Seconds sampling.");
  metric("counter", "dsv4:engine_emit_seconds_total", m.emit_seconds,
         "Seconds emitting tokens (cache policy, request events).");
  // Speculative decoding: SGLang's gauges (over the whole run here), then
  // the counters they come from and the acceptance of each draft position.
  metric("gauge", "sglang:spec_accept_length", m.spec_accept_length,
         "Tokens per speculative verify step (accepted drafts + 1); 0 before any.");
  metric("gauge", "sglang:spec_accept_rate", m.spec_accept_rate, "Accepted drafts per drafted token.");
  metric("counter", "dsv4:spec_verify_total", double(m.spec_verify_total), "Verify steps (per sequence).");
  metric("counter", "dsv4:spec_draft_tokens_total", double(m.spec_draft_tokens_total), "Drafted tokens verified.");
  metric("counter", "dsv4:spec_accepted_tokens_total", double(m.spec_accepted_tokens_total),
         "Drafted tokens accepted.");
  metric("counter", "dsv4:spec_bypassed_steps_total", double(m.spec_bypassed_steps_total),
         "Decode steps run without drafts because speculation measured slower at that batch size.");
  metric("counter", "dsv4:engine_draft_seconds_total", m.draft_seconds, "Seconds proposing drafts.");
  if (!m.spec_position_drafted.empty()) {
    o << "# HELP dsv4:spec_position_accept_rate Acceptance of the j-th draft of a step, when drafted.\n"
      << "# TYPE dsv4:spec_position_accept_rate gauge\n";
    for (size_t j = 0; j < m.spec_position_drafted.size(); ++j)
      o << "dsv4:spec_position_accept_rate{" << labels << ",position=\"" << j + 1 << "\"} "
        << (m.spec_position_drafted[j] > 0 ? double(m.spec_position_accepted[j]) / double(m.spec_position_drafted[j])
                                           : 0.0)
        << "\n";
  }
  double total_prompt = double(m.prompt_tokens_total + m.cached_tokens_total);
  metric("gauge", "sglang:cache_hit_rate", total_prompt > 0 ? double(m.cached_tokens_total) / total_prompt : 0.0,
         "Fraction of prompt tokens served from the prefix cache.");
  metric("gauge", "sglang:prefix_cache_bytes", double(m.prefix_cache_bytes), "Host memory held by the prefix cache.");
  std::lock_guard<std::mutex> lock(mutex_);
  o << ttft_.render("sglang:time_to_first_token_seconds", labels);
  o << e2e_.render("sglang:e2e_request_latency_seconds", labels);
  o << tpot_.render("sglang:time_per_output_token_seconds", labels);
  return o.str();
}

}  // namespace dsv4
