#include "engine/scheduler.h"

#include <algorithm>

namespace dsv4 {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Queued: return "queued";
    case Phase::Prefilling: return "prefilling";
    case Phase::Decoding: return "decoding";
    case Phase::Finished: return "finished";
  }
  return "";
}

Admission schedule_admission(const std::vector<WaitingSummary>& waiting, int64_t running, int64_t used_tokens,
                             const SchedulerBudgets& budgets) {
  Admission a;
  a.used_tokens = used_tokens;
  bool full = false;
  for (size_t i = 0; i < waiting.size(); ++i) {
    const WaitingSummary& w = waiting[i];
    // Cancelled requests leave the queue at once, wherever they stand, so
    // that the client hears back without waiting for a slot.
    if (w.cancelled) {
      a.dropped.push_back(i);
      continue;
    }
    // Strict FCFS: once a request does not fit, no later one may pass it
    // (a small request slipping past a large one forever would starve it).
    if (full || !w.ready) continue;
    const int64_t now_running = running + int64_t(a.admitted.size());
    if (now_running >= budgets.max_running_requests) {
      full = true;
      continue;
    }
    // The token budget never stops the first request of an idle engine: a
    // request larger than the budget would otherwise never run.
    if (budgets.max_total_tokens > 0 && now_running > 0 &&
        a.used_tokens + w.reserved_tokens > budgets.max_total_tokens) {
      full = true;
      continue;
    }
    a.used_tokens += w.reserved_tokens;
    a.admitted.push_back(i);
  }
  return a;
}

StepPlan schedule_batch(const std::vector<RunningSummary>& running, const SchedulerBudgets& budgets) {
  StepPlan plan;
  int64_t prefill_budget = budgets.chunked_prefill_size;
  for (size_t i = 0; i < running.size(); ++i) {
    const RunningSummary& s = running[i];
    if (s.cancelled) continue;  // retired after the step; feeding it would be wasted work
    const int64_t todo = s.known - s.fed;
    if (s.phase == Phase::Prefilling) {
      // A full prefix-cache hit: the logits that follow the prompt are
      // stored, so the first token is sampled without the model.
      if (s.cached_logits) {
        plan.sample_cached.push_back(i);
        continue;
      }
      if (todo <= 0) continue;
      // Prompt chunks share the step's prefill budget first come, first
      // served, so that a long prompt cannot stall the decoding sequences
      // batched with it. A last lone token costs what a decode costs and is
      // neither held back nor charged.
      int64_t take = todo;
      if (todo > 1) {
        take = std::min(todo, prefill_budget);
        if (take <= 0) continue;
        // A chunk ends where the prefix cache takes a checkpoint (the
        // forward pass is chunk-invariant: same bits, one more chunk).
        if (s.checkpoint_at > s.fed && s.checkpoint_at < s.fed + take) take = s.checkpoint_at - s.fed;
        prefill_budget -= take;
      }
      plan.items.push_back({i, s.fed, take, true, take == todo ? LogitRows::Last : LogitRows::None});
    } else if (s.phase == Phase::Decoding) {
      // Decode items are never chunked: the last sampled token, then any
      // drafts, whose every row is needed to accept or reject them.
      const int64_t n = todo + s.draft_tokens;
      if (n <= 0) continue;
      plan.items.push_back({i, s.fed, n, false, s.draft_tokens > 0 ? LogitRows::All : LogitRows::Last});
    }
  }
  return plan;
}

}  // namespace dsv4
