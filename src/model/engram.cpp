#include "model/engram.h"

#include <algorithm>
#include <set>
#include <string>

#include "core/error.h"

namespace dsv4 {

namespace {

bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2)
    if (v % d == 0) return false;
  return true;
}

}  // namespace

std::vector<std::vector<int64_t>> engram_primes(const ModelConfig& c) {
  std::set<int64_t> taken;
  std::vector<std::vector<int64_t>> primes(c.engram_layer_ids.size());
  for (auto& layer : primes)
    for (int64_t n = 1; n < c.engram_max_ngram_size; ++n) {
      int64_t current = c.engram_vocab_size - 1;
      for (int64_t h = 0; h < c.engram_n_heads; ++h) {
        do ++current;
        while (!is_prime(current) || taken.count(current));
        taken.insert(current);
        layer.push_back(current);
      }
    }
  return primes;
}

EngramHasher::EngramHasher(const ModelConfig& c, std::vector<int32_t> token_map,
                           std::vector<std::vector<int64_t>> multipliers)
    : layers_(int64_t(c.engram_layer_ids.size())),
      max_ngram_(c.engram_max_ngram_size),
      heads_(c.engram_n_heads),
      token_map_(std::move(token_map)),
      multipliers_(std::move(multipliers)) {
  if (int64_t(token_map_.size()) != c.vocab_size)
    throw Error("Engram token map has " + std::to_string(token_map_.size()) + " entries, the vocabulary " +
                std::to_string(c.vocab_size));
  int32_t classes = 0;
  for (int32_t id : token_map_) {
    if (id < 0) throw Error("Engram token map holds a negative class");
    classes = std::max(classes, id + 1);
  }
  if (classes != c.engram_compressed_vocab_size)
    throw Error("Engram token map has " + std::to_string(classes) + " classes, config.json says " +
                std::to_string(c.engram_compressed_vocab_size) + " (engram_compressed_vocab_size)");
  pad_ = token_map_[size_t(c.engram_pad_token_id)];
  if (int64_t(multipliers_.size()) != layers_) throw Error("Engram hash multipliers: one row per Engram layer needed");
  // Products stay below 2^63 (the reference bounds its multipliers so).
  const int64_t bound = INT64_MAX / std::max<int64_t>(c.engram_compressed_vocab_size, 1);
  for (auto& row : multipliers_) {
    if (int64_t(row.size()) != max_ngram_) throw Error("Engram hash multipliers: one per n-gram position needed");
    for (int64_t m : row)
      if (m <= 0 || m > bound) throw Error("Engram hash multiplier " + std::to_string(m) + " out of range");
  }
  primes_ = engram_primes(c);
  for (int64_t slot = 0; slot < layers_; ++slot) {
    std::vector<int64_t> offsets;
    int64_t sum = 0;
    for (int64_t p : primes_[size_t(slot)]) offsets.push_back(sum), sum += p;
    if (sum != c.engram_num_embeddings[size_t(slot)])
      throw Error("Engram layer " + std::to_string(c.engram_layer_ids[size_t(slot)]) + ": table has " +
                  std::to_string(c.engram_num_embeddings[size_t(slot)]) + " rows, its hash primes sum to " +
                  std::to_string(sum));
    offsets_.push_back(std::move(offsets));
  }
}

void EngramHasher::hash(int64_t slot, const std::vector<int32_t>& history, const int32_t* tokens, int64_t n,
                        int64_t* out) const {
  const std::vector<int64_t>& mult = multipliers_[size_t(slot)];
  const std::vector<int64_t>& primes = primes_[size_t(slot)];
  const std::vector<int64_t>& offsets = offsets_[size_t(slot)];
  const int64_t start = int64_t(history.size()), cols = columns();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = start + t;
    // Lookback k reads the token k positions back, or the pad id before
    // the sequence starts (text has no dead tokens to stop at).
    int64_t hash = 0;
    for (int64_t k = 0; k < max_ngram_; ++k) {
      const int64_t at = pos - k;
      const int64_t id = at < 0 ? pad_ : token_map_[size_t(at >= start ? tokens[at - start] : history[size_t(at)])];
      const int64_t product = id * mult[size_t(k)];
      hash = k == 0 ? product : hash ^ product;
      if (k == 0) continue;
      for (int64_t h = 0; h < heads_; ++h) {
        const size_t col = size_t((k - 1) * heads_ + h);
        out[t * cols + int64_t(col)] = hash % primes[col] + offsets[col];
      }
    }
  }
}

}  // namespace dsv4
