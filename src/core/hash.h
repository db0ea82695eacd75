// A fast 128-bit non-cryptographic hash: prefix-cache keys (a chain over
// token ids) and checksums of stored records. Two 64-bit lanes with
// different multipliers, each finished by MurmurHash3's fmix64; a chance
// collision of two distinct inputs is about 2^-128 per pair, far below a
// disk's own undetected error rate. Not meant to resist a forger: records
// on disk are the server's own files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace dsv4 {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128&) const = default;
  std::string hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)lo);
    return buf;
  }
};

inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0) : a_(seed ^ 0x9e3779b97f4a7c15ULL), b_(~seed ^ 0x632be59bd9b4e019ULL) {}
  Hasher& bytes(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    if (i < n) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, n - i);
      word(w ^ (uint64_t(n - i) << 56));
    }
    len_ += n;
    return *this;
  }
  Hasher& u64(uint64_t v) { return bytes(&v, 8); }
  Hasher& hash(const Hash128& h) { return u64(h.lo).u64(h.hi); }
  Hash128 digest() const {
    const uint64_t a = fmix64(a_ ^ len_), b = fmix64(b_ + len_);
    return {fmix64(a + b), fmix64(b ^ (a << 1))};
  }

 private:
  void word(uint64_t w) {
    a_ = (a_ ^ (w * 0x87c37b91114253d5ULL));
    a_ = ((a_ << 31) | (a_ >> 33)) * 0x4cf5ad432745937fULL;
    b_ = (b_ + (w ^ 0x52dce729da3ed9b1ULL)) * 0x9fb21c651e98df25ULL;
    b_ ^= (b_ >> 29) ^ a_;
  }
  uint64_t a_, b_, len_ = 0;
};

// The chain hash of a token sequence: h(t0..tn) = step(h(t0..tn-1), tn), so
// the keys of every prefix of a prompt come in one pass.
inline Hash128 chain_hash(const Hash128& h, int32_t token) {
  const uint64_t t = uint64_t(uint32_t(token));
  return {fmix64(h.lo ^ fmix64(t + 0x2545f4914f6cdd1dULL)) + h.hi, fmix64((h.hi + t * 0x9e3779b97f4a7c15ULL) ^ h.lo)};
}

}  // namespace dsv4
