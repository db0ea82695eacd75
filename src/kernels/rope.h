// Rotary position embedding tables (interleaved pairs on a head's tail dims),
// with the YaRN frequency ramp of the compressed layers.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

struct RopeParams {
  int64_t dim = 0;      // rotated dims (pairs)
  double base = 10000;  // theta
  // YaRN: applied when original_seq_len > 0.
  int64_t original_seq_len = 0;
  double beta_fast = 32, beta_slow = 1, factor = 1;
};

class RopeTable {
 public:
  RopeTable() = default;
  explicit RopeTable(const RopeParams& params);
  // Rotates the `dim` values at x (pairs (2j, 2j+1)) by pos * f_j;
  // inverse rotates by -pos * f_j. The reference's fp32 cos/sin of the
  // fp32 angle, so every backend must compute the angle the same way.
  void apply(float* x, int64_t pos, bool inverse = false) const;
  // The cos and sin of each pair's angle (dim() / 2 of each) that apply()
  // rotates by, for backends that compute them once for the rows that
  // share a position (a token's heads) and rotate each row with them.
  void angles(int64_t pos, bool inverse, float* cos, float* sin) const;
  const std::vector<float>& frequencies() const { return freqs_; }
  int64_t dim() const { return int64_t(freqs_.size()) * 2; }

 private:
  std::vector<float> freqs_;
};

}  // namespace dsv4
