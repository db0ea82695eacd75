// Small per-vector operations of the DeepSeek-V4 forward pass on the CPU.
// All of them work on one token's vector with a fixed reduction order, and
// every KernelIsa gives the same bits (the default is the process's path).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.h"

namespace dsv4 {

// Dot product with a fixed 16-lane order (per-token results never depend on
// how work is split): lane l is the fused multiply-add chain over i = l mod
// 16, then the lanes fold l += l + 8, + 4, + 2, + 1.
float dot_fixed(const float* a, const float* b, int64_t n, KernelIsa isa = active_kernel_isa());
inline float sum_of_squares(const float* x, int64_t n, KernelIsa isa = active_kernel_isa()) {
  return dot_fixed(x, x, n, isa);
}
// y += a * x, element by element (one fused multiply-add each).
void add_scaled(float* y, float a, const float* x, int64_t n, KernelIsa isa = active_kernel_isa());
// Attention over the keys of one token for several heads at once, with the
// bits of the per-pair functions: scores[h * n_keys + j] = dot_fixed(q + h *
// dim, keys[j], dim); out + h * dim gets add_scaled(p[h * n_keys + j],
// keys[j]) for j = 0, 1, ... in order.
void dot_fixed_rows(const float* q, int64_t heads, const float* const* keys, int64_t n_keys, int64_t dim, float* scores,
                    KernelIsa isa = active_kernel_isa());
void add_scaled_rows(float* out, int64_t heads, const float* p, const float* const* keys, int64_t n_keys, int64_t dim,
                     KernelIsa isa = active_kernel_isa());
// The same for part of a longer row of keys, so that a caller can take the
// keys a tile at a time: scores[h * score_stride + j] for the n_keys keys
// given; and out[h * out_stride + d] for d in [d_begin, d_end) only, with
// p[h * p_stride + j]. Each output still gets its FMAs in increasing j, so
// tiles taken in order give add_scaled_rows' bits.
void dot_fixed_rows_strided(const float* q, int64_t heads, const float* const* keys, int64_t n_keys, int64_t dim,
                            float* scores, int64_t score_stride, KernelIsa isa = active_kernel_isa());
void add_scaled_rows_range(float* out, int64_t out_stride, int64_t heads, const float* p, int64_t p_stride,
                           const float* const* keys, int64_t n_keys, int64_t d_begin, int64_t d_end,
                           KernelIsa isa = active_kernel_isa());
// x <- w * x / sqrt(mean(x^2) + eps); w may be null (unweighted norm).
void rms_norm(float* x, const float* w, int64_t n, float eps, KernelIsa isa = active_kernel_isa());
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// PyTorch softplus with threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
// RoPE's rotation of one row: pairs (x[2j], x[2j + 1]) by (cos[j], sin[j]),
// x[2j] = x[2j] cos - x[2j + 1] sin and x[2j + 1] = x[2j] sin + x[2j + 1] cos,
// each product and the sum rounded (no FMA): RopeTable::apply's bits on
// every path. `dim` is even (2 x the pairs).
void rotate_pairs(float* x, int64_t dim, const float* cos, const float* sin, KernelIsa isa = active_kernel_isa());
// Sylvester-order Walsh-Hadamard transform scaled by n^-1/2 (n a power of two).
void hadamard_transform(float* x, int64_t n);

// Indices of the k largest scores (ties: lower index first), returned sorted
// ascending by index (float scores, or the exact numerics' doubles).
// The order (score descending, then index) is total for scores without
// NaN, so the k selected are those above the k-th largest score and, of the
// scores equal to it, the ones of lowest index, whichever selection finds
// that score: nth_element on a copy of the scores (linear on average, no
// indirection through indices), then one pass in index order. 1M tokens of
// context: 262,144 rows a decode step, 1.4 ms as nth_element over indices.
// With a NaN among the scores the comparison of indices decides, as before.
//
// Float scores from kTopKHistogramMin on (the indexer's: 262,144 a decode
// step at 1M tokens) go through top_k_float_many instead. The scores are
// cut into blocks, eight per id kept; the k-th largest of the blocks'
// maxima is a value that at least k scores reach, so the k-th largest score
// is at or above it. One pass keeps the scores at or above it (in id order:
// about k of them for scores in random order), nth_element finds the k-th
// largest among them, and the ids follow as below. Where that threshold
// keeps more than an eighth of the scores (their order puts many low
// scores in every block), a radix histogram finds the k-th instead: one
// pass counts the scores by the top 11 bits of an order-preserving key, a
// second keeps the keys of the bin that holds the k-th, and a third takes
// the ids. The k-th largest score is one value whichever way it is found,
// so the ids are the same. 262,144 scores: nth_element 2.2-2.9 ms, the
// histogram 0.6-0.9, the threshold 0.04 (docs/long_context.md, "The top-k
// from block maxima").
constexpr int64_t kTopKHistogramMin = 4096;
// False (and `out` untouched) when a score is NaN. Each path (`isa`) takes
// the same ids.
bool top_k_float_many(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out,
                      KernelIsa isa = active_kernel_isa());

template <typename T>
std::vector<int32_t> top_k_indices(const T* scores, int64_t n, int64_t k) {
  std::vector<int32_t> idx;
  if (k >= n) {
    idx.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::iota(idx.begin(), idx.end(), 0);
    return idx;
  }
  if (k <= 0) return idx;
  if constexpr (std::is_same_v<T, float>)
    if (n >= kTopKHistogramMin && top_k_float_many(scores, n, k, idx)) return idx;
  std::vector<T> values(scores, scores + n);
  if (std::any_of(values.begin(), values.end(), [](T v) { return std::isnan(v); })) {
    idx.resize(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(),
                     [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
    idx.resize(size_t(k));
    std::sort(idx.begin(), idx.end());
    return idx;
  }
  std::nth_element(values.begin(), values.begin() + (k - 1), values.end(), std::greater<T>());
  const T kth = values[size_t(k - 1)];
  int64_t ties = k;  // how many scores equal to kth are taken: k less those above it
  for (int64_t i = 0; i < n; ++i) ties -= scores[i] > kth;
  idx.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < n; ++i)
    if (scores[i] > kth || (scores[i] == kth && ties-- > 0)) idx.push_back(int32_t(i));
  return idx;
}

}  // namespace dsv4
