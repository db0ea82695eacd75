#include "server/metrics.h"

#include <cstdio>
#include <sstream>

#include "core/machine.h"
#include "core/threads.h"

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

// The prefix cache's tiers (docs/hicache.md): SGLang's HiCache names where
// it has one, dsv4: names for what it does not expose.
static void render_hicache(std::ostringstream& o, const HiCacheMetrics& h, const std::string& labels) {
  auto metric = [&](const char* type, const char* name, double value, const char* help, const std::string& extra = "") {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    o << name << "{" << labels << extra << "} " << value << "\n";
  };
  metric("counter", "sglang:evicted_tokens_total", double(h.evicted_device_tokens),
         "Tokens of cached rows evicted from the device tier (L1).");
  metric("counter", "sglang:load_back_tokens_total", double(h.load_back_tokens),
         "Tokens of cached rows loaded back from the host tier (L2) to L1.");
  metric("counter", "sglang:hicache_backup_tokens_total", double(h.backup_tokens),
         "Tokens of cached rows copied from L1 to the host tier (L2).");
  metric("gauge", "sglang:hicache_host_used_tokens", double(h.host_tokens), "Tokens whose rows are in the host tier.");
  // Capacity in tokens at the bytes per token the cache holds now (rows and checkpoints).
  const double per_token =
      h.row_tokens > 0 ? double(h.row_bytes + h.checkpoint_bytes) / double(h.row_tokens) : 0.0;
  metric("gauge", "sglang:hicache_host_total_tokens", per_token > 0 ? double(h.host_capacity) / per_token : 0.0,
         "Host-tier capacity in tokens, at the current bytes per cached token.");
  const std::string storage = ",storage_backend=\"file\"";
  if (h.storage_configured) {
    metric("counter", "sglang:prefetched_tokens_total", double(h.storage.prefetched_tokens),
           "Prompt tokens read from the storage tier (L3).", storage);
    metric("counter", "sglang:backuped_tokens_total", double(h.storage.backuped_tokens),
           "Tokens whose rows were written to the storage tier (L3).", storage);
  }
  for (const char* tier : {"device", "host"}) {
    const bool dev = tier[0] == 'd';
    o << (dev ? "# HELP dsv4:hicache_bytes Bytes held per tier.\n# TYPE dsv4:hicache_bytes gauge\n" : "");
    o << "dsv4:hicache_bytes{" << labels << ",tier=\"" << tier << "\"} " << (dev ? h.device_bytes : h.host_bytes)
      << "\n";
  }
  for (const char* tier : {"device", "host"}) {
    const bool dev = tier[0] == 'd';
    o << (dev ? "# HELP dsv4:hicache_capacity_bytes Budget per tier.\n# TYPE dsv4:hicache_capacity_bytes gauge\n"
              : "");
    o << "dsv4:hicache_capacity_bytes{" << labels << ",tier=\"" << tier << "\"} "
      << (dev ? h.device_capacity : h.host_capacity) << "\n";
  }
  o << "# HELP dsv4:hicache_hits_total Lookups that resumed from the cache, by the lowest tier they used.\n"
    << "# TYPE dsv4:hicache_hits_total counter\n";
  o << "dsv4:hicache_hits_total{" << labels << ",tier=\"device\"} " << h.hit_device << "\n";
  o << "dsv4:hicache_hits_total{" << labels << ",tier=\"host\"} " << h.hit_host << "\n";
  o << "dsv4:hicache_hits_total{" << labels << ",tier=\"storage\"} " << h.hit_storage << "\n";
  metric("counter", "dsv4:hicache_lookups_total", double(h.lookups), "Prefix-cache lookups.");
  o << "# HELP dsv4:hicache_evictions_total Parts (pages, checkpoints) leaving a tier.\n"
    << "# TYPE dsv4:hicache_evictions_total counter\n";
  o << "dsv4:hicache_evictions_total{" << labels << ",tier=\"device\"} " << h.evictions_device << "\n";
  o << "dsv4:hicache_evictions_total{" << labels << ",tier=\"host\"} " << h.evictions_host << "\n";
  metric("gauge", "dsv4:hicache_nodes", double(h.nodes), "Radix pages in the tree.");
  metric("gauge", "dsv4:hicache_checkpoints", double(h.checkpoints), "Checkpoints in the tree.");
  metric("gauge", "dsv4:hicache_bytes_per_token", per_token,
         "Cached state bytes (rows + checkpoints) per token of cached rows.");
  if (!h.storage_configured) return;
  metric("gauge", "dsv4:hicache_storage_enabled", h.storage.enabled ? 1 : 0,
         "1 while the storage tier works (a write failure turns it off).");
  metric("gauge", "dsv4:hicache_storage_records", double(h.storage.records), "Record files in the directory.");
  metric("counter", "dsv4:hicache_storage_read_bytes_total", double(h.storage.read_bytes), "Bytes read from L3.");
  metric("counter", "dsv4:hicache_storage_write_bytes_total", double(h.storage.write_bytes), "Bytes written to L3.");
  metric("counter", "dsv4:hicache_storage_reads_total", double(h.storage.reads), "Records read from L3.");
  metric("counter", "dsv4:hicache_storage_writes_total", double(h.storage.writes), "Records written to L3.");
  metric("counter", "dsv4:hicache_storage_corrupt_records_total", double(h.storage.corrupt),
         "L3 records that failed a check (torn, truncated, foreign, bit-flipped): deleted, never used.");
  metric("counter", "dsv4:hicache_storage_errors_total", double(h.storage.errors), "L3 I/O errors.");
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
  // SGLang's split by the tier the tokens came from.
  const HiCacheMetrics& h = m.hicache;
  o << "# HELP sglang:cached_tokens_total Prompt tokens served from the prefix cache, by tier.\n"
    << "# TYPE sglang:cached_tokens_total counter\n"
    << "sglang:cached_tokens_total{" << labels << ",cache_source=\"device\"} " << h.cached_device << "\n"
    << "sglang:cached_tokens_total{" << labels << ",cache_source=\"host\"} " << h.cached_host << "\n"
    << "sglang:cached_tokens_total{" << labels << ",cache_source=\"storage_file\"} " << h.cached_storage << "\n";
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
  metric("counter", "dsv4:engine_decode_steps_total", double(m.decode_steps_total),
         "Scheduler steps that only decoded (no prompt chunk).");
  metric("counter", "dsv4:engine_decode_step_seconds_total", m.decode_step_seconds,
         "Seconds spent in steps that only decoded.");
  metric("counter", "dsv4:engine_decode_forward_seconds_total", m.decode_forward_seconds,
         "Seconds in the model's forward passes of steps that only decoded.");
  // CPU time by thread group: what the HTTP handlers, detokenizing and
  // streaming cost is the process's minus the engine's (its compute threads
  // carry its name). Prometheus' standard process counter, then dsv4's.
  const ThreadCpuSeconds cpu = thread_cpu_seconds(kEngineThreadName);
  metric("counter", "process_cpu_seconds_total", cpu.total, "Total user and system CPU time spent in seconds.");
  metric("gauge", "dsv4:compute_threads", double(compute_threads()), "Threads of the model's operations.");
  metric("counter", "dsv4:engine_cpu_seconds_total", cpu.named,
         "CPU seconds of the scheduler thread and its compute threads (the rest of the process: HTTP, detokenizing).");
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
  metric("counter", "dsv4:spec_head_rows_total", double(m.spec_head_rows_total), "Verify rows the LM head ran on.");
  metric("counter", "dsv4:spec_head_rows_skipped_total", double(m.spec_head_rows_skipped_total),
         "Verify rows past a rejected draft that the LM head skipped.");
  metric("counter", "dsv4:spec_head_second_passes_total", double(m.spec_head_second_passes_total),
         "Verify steps whose LM head ran a second pass for sequences that accepted more than expected.");
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
  metric("gauge", "sglang:prefix_cache_bytes", double(m.prefix_cache_bytes), "Memory held by the prefix cache (L1 + L2).");
  render_hicache(o, h, labels);
  std::lock_guard<std::mutex> lock(mutex_);
  o << ttft_.render("sglang:time_to_first_token_seconds", labels);
  o << e2e_.render("sglang:e2e_request_latency_seconds", labels);
  o << tpot_.render("sglang:time_per_output_token_seconds", labels);
  return o.str();
}

}  // namespace dsv4
