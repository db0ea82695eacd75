// V4.1's Engram addressing (docs/v41.md): every position is hashed with the
// few token ids before it into row ids of each Engram layer's table. Pure
// integer bookkeeping, decided once at load; the lookup and the gated add
// are the kernel backend's (engram_lookup, engram_gate).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"

namespace dsv4 {

class EngramHasher {
 public:
  EngramHasher() = default;
  // token_map: the compressed id of every vocabulary id (its class count
  // must be the config's engram_compressed_vocab_size); multipliers: one
  // row of engram_max_ngram_size odd int64 values per Engram layer. Throws
  // Error when the tables do not fit the config (wrong sizes, a table whose
  // row count is not the sum of its primes).
  EngramHasher(const ModelConfig& config, std::vector<int32_t> token_map,
               std::vector<std::vector<int64_t>> multipliers);

  bool empty() const { return layers_ == 0; }
  // Row ids per position and column (hash columns = (max_ngram - 1) x heads,
  // n-gram size major) of Engram layer `slot`, offsets included: out is
  // [n, columns]. history: the token ids before `tokens` (positions 0 ..).
  void hash(int64_t slot, const std::vector<int32_t>& history, const int32_t* tokens, int64_t n, int64_t* out) const;
  int64_t columns() const { return (max_ngram_ - 1) * heads_; }
  const std::vector<int64_t>& primes(int64_t slot) const { return primes_[size_t(slot)]; }

 private:
  int64_t layers_ = 0, max_ngram_ = 0, heads_ = 0, pad_ = 0;
  std::vector<int32_t> token_map_;
  std::vector<std::vector<int64_t>> multipliers_, primes_, offsets_;  // per slot
};

// The primes of the hash columns: for each Engram layer, each n-gram size
// and each head, the next prime above engram_vocab_size - 1 (restarting for
// every n-gram size) that no earlier column took.
std::vector<std::vector<int64_t>> engram_primes(const ModelConfig& config);

}  // namespace dsv4
