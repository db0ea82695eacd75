// The scheduler: what one engine step does, decided from summaries alone.
//
// It never sees the model, a decode state or a request handle, only numbers
// (how many tokens a sequence has fed, how many it knows, what it reserved),
// so the policy can be tested, and changed, without running anything.
//
// A step is planned in two stages, as in TensorRT-LLM's capacity and
// micro-batch schedulers:
//  1. schedule_admission, under the queue lock: which waiting requests leave
//     the queue (cancelled) and which start running (FCFS, within the running
//     request and token budgets);
//  2. schedule_batch, once the prefix cache has told each admitted sequence
//     where it starts: which sequences feed which tokens in the forward pass,
//     and whose logits are wanted.
// They are two calls because the second depends on the cache's answer for the
// sequences the first admitted (a full hit needs no forward pass at all; a
// partial one shrinks the prefill).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv4 {

// Where a sequence is in its life. Queued: waiting, or admitted but not yet
// given a decode state. Prefilling: feeding its prompt, up to and including
// the sampling of its first token. Decoding: one sampled token (or more, when
// drafts are verified) per step. Finished: no more tokens; retired at the end
// of the step.
enum class Phase { Queued, Prefilling, Decoding, Finished };
const char* phase_name(Phase p);

struct SchedulerBudgets {
  int64_t max_running_requests = 64;
  int64_t max_total_tokens = 0;         // tokens reserved by running requests; 0 = unlimited
  int64_t chunked_prefill_size = 2048;  // prompt tokens fed per step, over all sequences
};

struct WaitingSummary {
  int64_t reserved_tokens = 0;  // prompt + max_new_tokens
  bool cancelled = false;
  // False while the prefix cache still reads its prompt's prefix from
  // storage under a waiting prefetch policy: skipped (later requests may
  // start before it), as SGLang's admission skips such a request.
  bool ready = true;
};

struct Admission {
  std::vector<size_t> dropped;   // cancelled: leave the queue (indices into `waiting`)
  std::vector<size_t> admitted;  // start running, in queue order (indices into `waiting`)
  int64_t used_tokens = 0;       // reserved tokens of all running requests afterwards
};

// `running`: sequences running now (cancelled ones included: they hold their
// slot and reservation until the engine retires them); `used_tokens`: what
// they reserved.
Admission schedule_admission(const std::vector<WaitingSummary>& waiting, int64_t running, int64_t used_tokens,
                             const SchedulerBudgets& budgets);

struct RunningSummary {
  Phase phase = Phase::Queued;
  int64_t fed = 0;             // tokens already in the decode state
  int64_t known = 0;           // prompt + generated tokens, all of which must be fed
  int64_t draft_tokens = 0;    // proposed tokens after `known` to verify in the same pass
  bool cached_logits = false;  // the logits after the last known token are at hand
  bool cancelled = false;
  // A prompt position where the prefix cache takes a checkpoint (a prefill
  // chunk ends there); -1: none.
  int64_t checkpoint_at = -1;
};

// Which logits rows an item needs: none (a prefill chunk that does not end
// the prompt), the last (to sample the next token), or all (to check each
// drafted token against the model's own distribution at its position).
enum class LogitRows { None, Last, All };

struct PlanItem {
  size_t seq = 0;     // index into the running summaries
  int64_t start = 0;  // position of the first token fed (the sequence's `fed`)
  int64_t n = 0;      // tokens fed: known ones from `start`, then the drafts
  bool prefill = false;
  LogitRows logits = LogitRows::None;
};

// What one forward pass does (the admissions of the step came before it).
struct StepPlan {
  std::vector<PlanItem> items;        // the forward pass, in running order
  std::vector<size_t> sample_cached;  // sample from stored logits, without a forward pass
};

StepPlan schedule_batch(const std::vector<RunningSummary>& running, const SchedulerBudgets& budgets);

}  // namespace dsv4
