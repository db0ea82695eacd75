// Written from NumPy's documented algorithms (SeedSequence, PCG64 and the
// Lemire bounded-integer method of Generator.integers); see numpy_random.h.
#include "core/numpy_random.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dsv4 {
namespace {

using u128 = unsigned __int128;

// SeedSequence's hashing constants: two multiplicative hash streams (A mixes
// the entropy into the pool, B draws the output words) and the pool mixer.
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// A non-negative Python int becomes its little-endian 32-bit words; zero is
// one word, not none.
std::vector<uint32_t> entropy_words(uint64_t seed) {
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed != 0);
  return words;
}

std::vector<uint32_t> seed_pool(uint64_t seed) {
  const std::vector<uint32_t> entropy = entropy_words(seed);
  std::vector<uint32_t> pool(kPoolSize);
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < static_cast<int>(entropy.size()) ? entropy[i] : 0u, hash_const);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  // A uint64 seed has at most two words, never more than the pool holds, so
  // SeedSequence's "extra entropy" pass has nothing to do here.
  return pool;
}

// High and low 64-bit halves of a 128-bit value.
uint64_t hi64(u128 x) { return static_cast<uint64_t>(x >> 64); }
uint64_t lo64(u128 x) { return static_cast<uint64_t>(x); }

// PCG's 128-bit default multiplier (high, low).
constexpr u128 kPcgMult = (static_cast<u128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

}  // namespace

std::vector<uint64_t> numpy_seed_sequence_state(uint64_t seed, int n_uint64_words) {
  const std::vector<uint32_t> pool = seed_pool(seed);
  std::vector<uint32_t> words(static_cast<size_t>(n_uint64_words) * 2);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t v = pool[i % kPoolSize] ^ hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    words[i] = v;
  }
  // uint64 words are the uint32 stream read as little-endian pairs.
  std::vector<uint64_t> out(n_uint64_words);
  for (int i = 0; i < n_uint64_words; ++i) out[i] = words[2 * i] | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  // default_rng hands PCG64 four uint64 words: (state high, state low,
  // stream high, stream low); PCG's srandom then makes the increment odd and
  // steps once before and once after adding the initial state.
  const std::vector<uint64_t> v = numpy_seed_sequence_state(seed, 4);
  const u128 initstate = (static_cast<u128>(v[0]) << 64) | v[1];
  const u128 initseq = (static_cast<u128>(v[2]) << 64) | v[3];
  inc_ = (initseq << 1) | 1u;
  state_ = 0;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyPcg64::next_uint64() {
  state_ = state_ * kPcgMult + inc_;
  // XSL-RR: xor the halves, rotate right by the top 6 bits.
  const uint64_t x = hi64(state_) ^ lo64(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

namespace {

// Lemire's nearly-divisionless method on [0, rng]; rng < 2^64 - 1. The
// rejection threshold is only computed when the cheap bound says it may
// matter, and the order of draws is what NumPy's is.
uint64_t bounded_lemire64(NumpyPcg64& gen, uint64_t rng) {
  const uint64_t range = rng + 1;
  u128 m = static_cast<u128>(gen.next_uint64()) * range;
  uint64_t leftover = lo64(m);
  if (leftover < range) {
    const uint64_t threshold = (UINT64_MAX - rng) % range;
    while (leftover < threshold) {
      m = static_cast<u128>(gen.next_uint64()) * range;
      leftover = lo64(m);
    }
  }
  return hi64(m);
}

// The same on 32-bit draws, which NumPy uses whenever rng fits in 32 bits
// (so one 64-bit output serves two values); rng < 2^32 - 1.
uint32_t bounded_lemire32(NumpyPcg64& gen, uint32_t rng) {
  const uint32_t range = rng + 1;
  uint64_t m = static_cast<uint64_t>(gen.next_uint32()) * range;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < range) {
    const uint32_t threshold = (UINT32_MAX - rng) % range;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(gen.next_uint32()) * range;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

}  // namespace

std::vector<int64_t> numpy_integers_int64(NumpyPcg64& gen, int64_t low, int64_t high, int64_t count, bool endpoint) {
  if (count < 0) throw std::invalid_argument("numpy integers: negative count");
  if (endpoint ? low > high : low >= high)
    throw std::invalid_argument("numpy integers: empty range [" + std::to_string(low) + ", " + std::to_string(high) +
                                (endpoint ? "]" : ")"));
  // Values are drawn as unsigned offsets in [0, rng] (rng = size of the
  // range - 1) and wrapped back onto int64 by adding low modulo 2^64, as
  // NumPy does.
  const uint64_t off = static_cast<uint64_t>(low);
  const uint64_t rng = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) - (endpoint ? 0u : 1u);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (auto& v : out) {
    uint64_t r;
    if (rng == 0) {
      r = 0;  // a single possible value consumes no randomness
    } else if (rng == UINT32_MAX) {
      r = gen.next_uint32();
    } else if (rng < UINT32_MAX) {
      r = bounded_lemire32(gen, static_cast<uint32_t>(rng));
    } else if (rng == UINT64_MAX) {
      r = gen.next_uint64();  // the full int64 range (endpoint=True only)
    } else {
      r = bounded_lemire64(gen, rng);
    }
    v = static_cast<int64_t>(off + r);
  }
  return out;
}

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, int64_t count) {
  NumpyPcg64 gen(seed);
  return numpy_integers_int64(gen, low, high, count);
}

std::vector<int64_t> engram_hash_multipliers(int64_t layer_id, int64_t max_ngram_size, int64_t compressed_vocab_size) {
  if (layer_id < 0 || compressed_vocab_size <= 0 || max_ngram_size < 0)
    throw std::invalid_argument("engram_hash_multipliers: need layer_id >= 0, max_ngram_size >= 0, vocab > 0");
  const int64_t bound = std::max<int64_t>(1, INT64_MAX / compressed_vocab_size / 2);
  std::vector<int64_t> m =
      numpy_default_rng_integers(10007u * static_cast<uint64_t>(layer_id), 0, bound, max_ngram_size);
  for (auto& v : m) v = v * 2 + 1;
  return m;
}

}  // namespace dsv4
