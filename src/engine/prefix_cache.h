// Prefix reuse by decode-state snapshots. DeepSeek-V4's per-sequence state
// (window ring, compressed rows, compressor partial windows) is restored
// byte-exactly, and the forward pass is chunk-invariant, so a cache hit gives
// the very same bits as recomputing the prefix.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "model/state.h"

namespace dsv4 {

class PrefixCache {
 public:
  explicit PrefixCache(int64_t budget_bytes) : budget_(budget_bytes) {}

  struct Hit {
    int64_t matched = 0;  // tokens covered by the state
    SequenceState state;
    std::vector<float> last_logits;  // logits after the last matched token, if stored
  };

  // Longest stored prefix of `tokens`. A hit covering all of `tokens` is
  // returned only when it carries the logits needed to sample next.
  bool lookup(const std::vector<int32_t>& tokens, Hit* hit);
  // Stores the state after `tokens` (and optionally the logits that follow).
  void insert(const std::vector<int32_t>& tokens, const SequenceState& state, std::vector<float> last_logits = {});
  void clear();
  int64_t bytes() const;
  int64_t entries() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    SequenceState state;
    std::vector<float> last_logits;
    int64_t bytes = 0;
    uint64_t last_used = 0;
  };
  void evict_locked();

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;
  int64_t budget_;
  int64_t used_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace dsv4
