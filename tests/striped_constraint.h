// A test stand-in for a grammar (engine/constraint.h), shared by the
// speculative-decoding tests: it has a free span, forced positions and
// refused tokens, and exact rollback.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/constraint.h"

namespace dsv4::test {

// A grammar stand-in: free for the first `free` tokens (like a reasoning
// span before the constrained answer), then every fifth token is forced and
// the others must not be multiples of 3, up to `length` constrained tokens,
// after which the output may end. It keeps its whole history, so rollback is
// exact.
class StripedConstraint : public TokenConstraint {
 public:
  StripedConstraint(int64_t free, int64_t length) : free_(free), length_(length) {}
  static int32_t forced(int64_t k) { return int32_t((k * 37) % 500 + 10); }
  static bool allowed(int64_t k, int32_t token) {
    return k % 5 == 4 ? token == forced(k) : token > 0 && token % 3 != 0;
  }
  bool fill_mask(TokenMask& mask) override {
    const int64_t k = int64_t(history_.size()) - free_;
    if (k < 0) return false;
    if (k >= length_) return true;  // complete: only the stop tokens
    for (int32_t t = 0; t < int32_t(mask.size() * 64); ++t)
      if (allowed(k, t)) mask_set(mask, t);
    return true;
  }
  bool can_finish() const override { return int64_t(history_.size()) - free_ >= length_; }
  bool accept(int32_t token) override {
    const int64_t k = int64_t(history_.size()) - free_;
    if (k >= length_ || (k >= 0 && !allowed(k, token))) return false;
    history_.push_back(token);
    return true;
  }
  void rollback(int64_t n) override { history_.resize(size_t(std::max<int64_t>(0, int64_t(history_.size()) - n))); }
  int64_t max_rollback() const override { return 1 << 20; }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<StripedConstraint>(*this); }

 private:
  int64_t free_, length_;
  std::vector<int32_t> history_;
};

class StripedFactory : public ConstraintFactory {
 public:
  StripedFactory(int64_t free, int64_t length) : free_(free), length_(length) {}
  std::unique_ptr<TokenConstraint> start() const override {
    return std::make_unique<StripedConstraint>(free_, length_);
  }

 private:
  int64_t free_, length_;
};

}  // namespace dsv4::test
