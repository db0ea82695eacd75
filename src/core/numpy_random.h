// Bit-exact reimplementation of the small part of NumPy's random module that
// DeepSeek-V4.1's Engram layers use to draw their n-gram hash multipliers:
// np.random.default_rng(seed).integers(low, high, size, dtype=np.int64).
// The multipliers are part of the model (they decide which embedding row a
// hashed n-gram reads), so any deviation from NumPy silently corrupts the
// output; that is why the stream is reproduced to the bit rather than
// approximated with <random>.
#pragma once

#include <cstdint>
#include <vector>

namespace dsv4 {

// NumPy's PCG64 bit generator (128-bit LCG, XSL-RR 64-bit output), seeded the
// way np.random.default_rng(seed) seeds it: through a SeedSequence built from
// the integer seed alone (no spawn key, pool of four 32-bit words).
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t seed);

  uint64_t next_uint64();
  // Half of a 64-bit draw, low half first; the high half is kept for the next
  // call (NumPy's has_uint32 buffer).
  uint32_t next_uint32();

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// SeedSequence(seed).generate_state(n_uint64_words, np.uint64); PCG64 takes
// four words. Exposed for tests.
std::vector<uint64_t> numpy_seed_sequence_state(uint64_t seed, int n_uint64_words);

// Generator.integers(low, high, size=count, dtype=np.int64, endpoint) drawn
// from `gen` (which advances). high is exclusive unless endpoint. Throws
// std::invalid_argument on an empty range or count < 0.
std::vector<int64_t> numpy_integers_int64(NumpyPcg64& gen, int64_t low, int64_t high, int64_t count,
                                          bool endpoint = false);

// np.random.default_rng(seed).integers(low, high, size=(count,), dtype=np.int64).
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, int64_t count);

// The Engram hash multipliers of one layer: odd numbers 2*v+1 with
// v = default_rng(10007 * layer_id).integers(0, bound, max_ngram_size), where
// bound = max(1, (2^63 - 1) // compressed_vocab_size // 2). Keeping every
// multiplier below 2^63 / vocab leaves room for multiplying a compressed
// token id without int64 overflow.
std::vector<int64_t> engram_hash_multipliers(int64_t layer_id, int64_t max_ngram_size, int64_t compressed_vocab_size);

}  // namespace dsv4
