#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsv4 {

// Compiled for AVX-512, AVX2 and baseline x86-64, picked at load time; with
// floating-point contraction off every clone does the same multiplies and
// adds in the same lanes, so they give the same bits.
#define DSV4_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

DSV4_VECTOR_CLONES float dot_fixed(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

void rms_norm(float* x, const float* w, int64_t n, float eps) {
  float inv = 1.0f / std::sqrt(sum_of_squares(x, n) / float(n) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) x[i] = w[i] * (x[i] * inv);
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  }
}

DSV4_VECTOR_CLONES void add_scaled(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void hadamard_transform(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float scale = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

RopeTable::RopeTable(const ModelConfig& c, bool compressed_layer) {
  const int64_t dim = c.rope_dim;
  const float base = float(compressed_layer ? c.compress_rope_theta : c.rope_theta);
  freqs_.resize(size_t(dim / 2));
  // fp32 throughout, like the reference's precompute_freqs_cis.
  for (int64_t j = 0; j < dim / 2; ++j)
    freqs_[size_t(j)] = 1.0f / std::pow(base, float(2 * j) / float(dim));
  if (compressed_layer && c.original_seq_len > 0) {
    auto correction_dim = [&](double rotations) {
      return double(dim) * std::log(double(c.original_seq_len) / (rotations * 2 * M_PI)) /
             (2 * std::log(double(base)));
    };
    double low = std::max(std::floor(correction_dim(c.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(c.beta_slow)), double(dim - 1));
    if (low == high) high += 0.001;
    const float factor = float(c.rope_factor);
    for (int64_t j = 0; j < dim / 2; ++j) {
      float ramp = (float(j) - float(low)) / (float(high) - float(low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      float f = freqs_[size_t(j)];
      freqs_[size_t(j)] = f / factor * (1.0f - smooth) + f * smooth;
    }
  }
}

void RopeTable::apply(float* x, int64_t pos, bool inverse) const {
  for (size_t j = 0; j < freqs_.size(); ++j) {
    float angle = float(pos) * freqs_[j];
    float c = std::cos(angle), s = std::sin(angle);
    if (inverse) s = -s;
    float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * c - b * s;
    x[2 * j + 1] = a * s + b * c;
  }
}

std::vector<int32_t> top_k_indices(const float* scores, int64_t n, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace dsv4
