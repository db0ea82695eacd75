#include "kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/numeric.h"

namespace dsv4 {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::FP8_BLOCK128: return "FP8 (e4m3, 128x128 ue8m0 blocks)";
    case WeightFormat::FP4_BLOCK32: return "FP4 (e2m1, 1x32 ue8m0 blocks)";
  }
  return "?";
}

int64_t Linear::weight_bytes() const {
  switch (format) {
    case WeightFormat::F32: return rows * cols * 4;
    case WeightFormat::BF16: return rows * cols * 2;
    case WeightFormat::FP8_BLOCK128: return rows * cols + ((rows + 127) / 128) * scale_cols;
    case WeightFormat::FP4_BLOCK32: return rows * cols / 2 + rows * scale_cols;
  }
  return 0;
}

namespace {

constexpr int kLanes = 16;

// Accumulation is in double. With fp32 lanes, the summation-order noise of a
// GEMM is enough to flip the FP8 rounding of a downstream activation now and
// then (on tiny-flash-fp8 one flip at position 95 moved 12% of the next 128
// logits rows by up to 0.06); double sums make the engine agree with a
// float64 evaluation of the reference math, which the golden data are
// stabilised against.

// Sum of lanes in a fixed pairwise tree.
inline float reduce_lanes(const double* acc) {
  double s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// All formats go through the same shape: decode a span of weights into
// floats, multiply-accumulate lane by lane, reduce in a fixed tree.
inline float dot_f32(const float* w, const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += w[i + l] * x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += w[i] * x[i];
  return reduce_lanes(acc);
}

inline float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += bf16_to_float(w[i + l]) * x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += bf16_to_float(w[i]) * x[i];
  return reduce_lanes(acc);
}

inline float dot_e4m3(const uint8_t* w, const float* x, int64_t n) {
  const float* lut = kNumericTables.e4m3;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += lut[w[i + l]] * x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += lut[w[i]] * x[i];
  return reduce_lanes(acc);
}

inline float dot_e2m1_32(const uint8_t* w, const float* x) {
  const float* lut = kNumericTables.e2m1;
  double acc[kLanes] = {};
  for (int k = 0; k < 16; k += 8)
    for (int l = 0; l < 8; ++l) {
      uint8_t b = w[k + l];
      acc[2 * l] += lut[b & 15] * x[2 * (k + l)];
      acc[2 * l + 1] += lut[b >> 4] * x[2 * (k + l) + 1];
    }
  return reduce_lanes(acc);
}

}  // namespace

float linear_dot(const Linear& w, int64_t row, const float* x) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32:
      return dot_f32(reinterpret_cast<const float*>(w.data) + row * n, x, n);
    case WeightFormat::BF16:
      return dot_bf16(reinterpret_cast<const uint16_t*>(w.data) + row * n, x, n);
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* wr = w.data + row * n;
      const uint8_t* sr = w.scale + (row / 128) * w.scale_cols;
      float sum = 0.0f;
      for (int64_t b = 0; b * 128 < n; ++b) {
        int64_t len = std::min<int64_t>(128, n - b * 128);
        sum += e8m0_to_float(sr[b]) * dot_e4m3(wr + b * 128, x + b * 128, len);
      }
      return sum;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* wr = w.data + row * (n / 2);
      const uint8_t* sr = w.scale + row * w.scale_cols;
      float sum = 0.0f;
      for (int64_t b = 0; b * 32 < n; ++b)
        sum += e8m0_to_float(sr[b]) * dot_e2m1_32(wr + b * 16, x + b * 32);
      return sum;
    }
  }
  return 0.0f;
}

void linear_decode_row(const Linear& w, int64_t row, float* out) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32:
      std::copy_n(reinterpret_cast<const float*>(w.data) + row * n, n, out);
      return;
    case WeightFormat::BF16: {
      const uint16_t* wr = reinterpret_cast<const uint16_t*>(w.data) + row * n;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(wr[i]);
      return;
    }
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* wr = w.data + row * n;
      const uint8_t* sr = w.scale + (row / 128) * w.scale_cols;
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_float(wr[i]) * e8m0_to_float(sr[i / 128]);
      return;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* wr = w.data + row * (n / 2);
      const uint8_t* sr = w.scale + row * w.scale_cols;
      for (int64_t i = 0; i < n; ++i) {
        uint8_t b = wr[i / 2];
        out[i] = e2m1_to_float((i & 1) ? (b >> 4) : (b & 15)) * e8m0_to_float(sr[i / 32]);
      }
      return;
    }
  }
}

double linear_dot_reference(const Linear& w, int64_t row, const float* x) {
  std::vector<float> wr(static_cast<size_t>(w.cols));
  linear_decode_row(w, row, wr.data());
  double sum = 0.0;
  for (int64_t i = 0; i < w.cols; ++i) sum += double(wr[size_t(i)]) * double(x[i]);
  return sum;
}

void linear_forward(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin,
                    int64_t row_end, int64_t y_stride) {
  if (row_end < 0) row_end = w.rows;
  const int64_t out = row_end - row_begin;
  if (y_stride < 0) y_stride = out;
  const int64_t cols = w.cols;
  std::vector<float> quantized;
  if (w.quantize_input) {
    quantized.assign(x, x + n * cols);
    for (int64_t t = 0; t < n; ++t) fp8_round_trip(quantized.data() + t * cols, cols, 128);
    x = quantized.data();
  }
  // Tiles of rows so that each weight tile is read once for all n tokens.
  const int64_t tile = 16;
  const int64_t n_tiles = (out + tile - 1) / tile;
  const bool parallel = out * cols * std::max<int64_t>(n, 1) >= (1 << 15);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t k = 0; k < n_tiles; ++k) {
    int64_t o0 = k * tile, o1 = std::min(out, o0 + tile);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = o0; o < o1; ++o)
        y[t * y_stride + o] = linear_dot(w, row_begin + o, x + t * cols);
  }
}

}  // namespace dsv4
