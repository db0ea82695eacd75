// Small per-vector operations of the DeepSeek-V4 forward pass. All of them
// work on one token's vector with a fixed reduction order.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// Dot product with a fixed 16-lane order (per-token results never depend on
// how work is split): lane l is the fused multiply-add chain over i = l mod
// 16, then the lanes fold l += l + 8, + 4, + 2, + 1.
float dot_fixed(const float* a, const float* b, int64_t n);
inline float sum_of_squares(const float* x, int64_t n) { return dot_fixed(x, x, n); }
// y += a * x, element by element (one fused multiply-add each).
void add_scaled(float* y, float a, const float* x, int64_t n);
// Attention over the keys of one token for several heads at once, with the
// bits of the per-pair functions: scores[h * n_keys + j] = dot_fixed(q + h *
// dim, keys[j], dim); out + h * dim gets add_scaled(p[h * n_keys + j],
// keys[j]) for j = 0, 1, ... in order.
void dot_fixed_rows(const float* q, int64_t heads, const float* const* keys, int64_t n_keys, int64_t dim,
                    float* scores);
void add_scaled_rows(float* out, int64_t heads, const float* p, const float* const* keys, int64_t n_keys,
                     int64_t dim);
// x <- w * x / sqrt(mean(x^2) + eps); w may be null (unweighted norm).
void rms_norm(float* x, const float* w, int64_t n, float eps);
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// PyTorch softplus with threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
// Sylvester-order Walsh-Hadamard transform scaled by n^-1/2 (n a power of two).
void hadamard_transform(float* x, int64_t n);

// RoPE frequencies of one layer kind (interleaved pairs on the tail dims).
class RopeTable {
 public:
  RopeTable() = default;
  // yarn: apply the YaRN ramp (compressed layers only).
  RopeTable(const ModelConfig& config, bool compressed_layer);
  // Rotates the `rope_dim` values at x (pairs (2j, 2j+1)) by pos * f_j;
  // inverse rotates by -pos * f_j.
  void apply(float* x, int64_t pos, bool inverse = false) const;
  const std::vector<float>& frequencies() const { return freqs_; }

 private:
  std::vector<float> freqs_;
};

// Indices of the k largest scores (ties: lower index first), returned sorted
// ascending by index.
std::vector<int32_t> top_k_indices(const float* scores, int64_t n, int64_t k);

}  // namespace dsv4
