// A test stand-in for a grammar of fixed positions (engine/constraint.h),
// shared by the speculative-decoding tests of EAGLE and DSpark.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/constraint.h"

namespace dsv4::test {

// A grammar stand-in of `length` positions: position k allows the tokens
// allowed(k), then only the stop tokens.
class PositionsFactory : public ConstraintFactory {
 public:
  using Allowed = std::vector<int32_t> (*)(int32_t k);
  PositionsFactory(int32_t length, Allowed allowed) : length_(length), allowed_(allowed) {}
  std::unique_ptr<TokenConstraint> start() const override {
    class Positions : public TokenConstraint {
     public:
      Positions(int32_t length, Allowed allowed) : length_(length), allowed_(allowed) {}
      bool fill_mask(TokenMask& mask) override {
        if (count_ < length_)
          for (int32_t t : allowed_(count_)) mask_set(mask, t);
        return true;
      }
      bool can_finish() const override { return count_ >= length_; }
      bool accept(int32_t token) override {
        if (count_ >= length_) return false;
        const std::vector<int32_t> allowed = allowed_(count_);
        if (std::find(allowed.begin(), allowed.end(), token) == allowed.end()) return false;
        ++count_;
        return true;
      }
      void rollback(int64_t n) override { count_ -= int32_t(n); }
      int64_t max_rollback() const override { return length_; }
      std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<Positions>(*this); }

     private:
      int32_t length_;
      Allowed allowed_;
      int32_t count_ = 0;
    };
    return std::make_unique<Positions>(length_, allowed_);
  }

 private:
  int32_t length_;
  Allowed allowed_;
};

}  // namespace dsv4::test
