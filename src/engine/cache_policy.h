// When the engine consults and fills the prefix cache. The cache itself
// (engine/radix_cache.h) stores, finds and moves states between tiers; this
// decides which states are worth keeping and where a new sequence starts
// (docs/hicache.md).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/radix_cache.h"

namespace dsv4 {

class CachePolicy {
 public:
  // `in_prompt_checkpoints`: false when a prompt's intermediate states are
  // not those of a plain run (V4.1 bounded replay).
  CachePolicy(std::shared_ptr<const Model> model, HiCacheOptions options, bool in_prompt_checkpoints);

  bool enabled() const { return cache_.enabled(); }
  // A request arrived: read what storage holds of its prompt beyond memory
  // (null: nothing to wait for).
  std::shared_ptr<PrefetchTicket> prefetch(const std::vector<int32_t>& prompt, std::function<void()> wake) {
    return cache_.prefetch(prompt, std::move(wake));
  }
  // Whether a request holding `ticket` may start now under the prefetch
  // policy (best_effort: always; wait_complete: once read; timeout: once
  // read or past its deadline).
  bool ready(const PrefetchTicket* ticket, double now) const;

  // Where a new sequence starts: the deepest stored checkpoint in its prompt
  // (with the logits that follow, when it covers the whole prompt). False:
  // from scratch.
  bool start(const std::vector<int32_t>& prompt, CacheHit* hit) { return cache_.lookup(prompt, hit); }

  // The next position after `fed` inside a prompt of `prompt_len` tokens
  // where a checkpoint is taken (prefill chunks end there); -1: none.
  int64_t next_checkpoint(int64_t fed, int64_t prompt_len) const;
  // A prefill chunk ended with `fed` prompt tokens in `state`.
  void on_prefilled(const std::vector<int32_t>& prompt, int64_t fed, const SequenceState& state);

  // A token was just sampled from `logits`, before it joins `output`. The
  // first token of a sequence follows exactly its prompt: the state and the
  // logits are kept, so an identical prompt later skips the model entirely.
  void on_sampled(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                  const SequenceState& state, const float* logits);

  // The sequence ended with `output` (its last token sampled, never fed). The
  // conversation so far is kept for a follow-up turn, whose prompt repeats it.
  void on_finished(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                   const SequenceState& state);

  void flush() { cache_.flush(); }
  void drain_storage() { cache_.drain_storage(); }
  HiCacheMetrics metrics() const { return cache_.metrics(); }

 private:
  RadixCache cache_;
  bool in_prompt_checkpoints_;
};

}  // namespace dsv4
