// When the engine consults and fills the prefix cache. The cache itself
// (engine/prefix_cache.h) only stores and finds states; this decides which
// states are worth keeping and where a new sequence starts.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/prefix_cache.h"

namespace dsv4 {

class CachePolicy {
 public:
  explicit CachePolicy(int64_t budget_bytes) : cache_(budget_bytes) {}

  // Where a new sequence starts: the longest stored prefix of its prompt (with
  // the logits that follow, when the whole prompt is stored). False: from
  // scratch.
  bool start(const std::vector<int32_t>& prompt, PrefixCache::Hit* hit) { return cache_.lookup(prompt, hit); }

  // A token was just sampled from `logits`, before it joins `output`. The
  // first token of a sequence follows exactly its prompt: the state and the
  // logits are kept, so an identical prompt later skips the model entirely.
  void on_sampled(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                  const SequenceState& state, const float* logits, int64_t vocab);

  // The sequence ended with `output` (its last token sampled, never fed). The
  // conversation so far is kept for a follow-up turn, whose prompt repeats it.
  void on_finished(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                   const SequenceState& state);

  void clear() { cache_.clear(); }
  int64_t bytes() const { return cache_.bytes(); }
  int64_t entries() const { return cache_.entries(); }

 private:
  PrefixCache cache_;
};

}  // namespace dsv4
