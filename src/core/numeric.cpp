#include "core/numeric.h"

#include <algorithm>

// ThreadSanitizer instruments the ifunc resolver that picks a clone, which
// the dynamic loader runs before the sanitizer's runtime is up (a crash at
// start): TSan builds use the default clone only (the same bits).
#if defined(__SANITIZE_THREAD__)
#define DSV4_FP8_CLONES
#else
#define DSV4_FP8_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace dsv4 {

NumericTables::NumericTables() {
  for (int b = 0; b < 256; ++b) {
    int sign = b >> 7, exponent = (b >> 3) & 15, mantissa = b & 7;
    float value = exponent == 0 ? std::ldexp(float(mantissa), -9) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    if ((b & 0x7f) == 0x7f) value = NAN;
    e4m3[b] = sign ? -value : value;
    e8m0[b] = b == 255 ? NAN : std::ldexp(1.0f, b - 127);
  }
  static const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int n = 0; n < 16; ++n) e2m1[n] = (n & 8) ? -magnitudes[n & 7] : magnitudes[n & 7];
}
const NumericTables kNumericTables;

namespace {
// fl32(1/448) and fl32(1/6): the reference multiplies by the fp32-rounded
// reciprocal, which moves the scale jump of an amax of exactly 448*2^k.
const float kInv448 = 1.0f / 448.0f;
const float kInv6 = 1.0f / 6.0f;

// The largest |x[i]| of a block, at least `floor` (NaN ignored), kept in
// 16 lanes so that the clones vectorize it without reassociating anything:
// a maximum is exact, so every clone gives the same value. Inlined into
// each clone below with its target.
__attribute__((always_inline)) inline float block_amax(const float* x, int64_t n, float floor) {
  float lanes[16];
  std::fill_n(lanes, 16, floor);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lanes[j] = std::max(lanes[j], std::fabs(x[i + j]));
  for (; i < n; ++i) lanes[0] = std::max(lanes[0], std::fabs(x[i]));
  float amax = lanes[0];
  for (int j = 1; j < 16; ++j) amax = std::max(amax, lanes[j]);
  return amax;
}
}  // namespace

// Runs on every matrix product's input (3-4% of a prefill when scalar).
// The clones let the compiler vectorize both loops (the maximum as
// block_amax takes it), and every step is exact, so all clones give the
// same bits.
DSV4_FP8_CLONES void fp8_round_trip(float* x, int64_t n, int64_t block) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    int64_t b1 = std::min(n, b0 + block);
    const float scale = pow2_ceil(block_amax(x + b0, b1 - b0, 1e-4f) * kInv448);
    const float inverse = 1.0f / scale;  // exact: scale is a power of two, so x * inverse == x / scale
    for (int64_t i = b0; i < b1; ++i) {
      float q = std::clamp(x[i] * inverse, -448.0f, 448.0f);
      x[i] = round_to_e4m3(q) * scale;
    }
  }
}

void fp8_round_trip_reference(float* x, int64_t n, int64_t block) {
  // Exhaustive nearest-value search over the 254 finite e4m3 values.
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    int64_t b1 = std::min(n, b0 + block);
    double amax = 1e-4;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, double(std::fabs(x[i])));
    float scale = pow2_ceil(float(amax) * kInv448);
    for (int64_t i = b0; i < b1; ++i) {
      double target = std::clamp(double(x[i]) / scale, -448.0, 448.0);
      float best = 0.0f;
      double best_err = 1e30;
      int best_code = 0;
      for (int code = 0; code < 256; ++code) {
        float v = e4m3_to_float(uint8_t(code));
        if (std::isnan(v)) continue;
        double err = std::fabs(double(v) - target);
        bool even = (code & 1) == 0;
        if (err < best_err || (err == best_err && even && (best_code & 1))) {
          best = v, best_err = err, best_code = code;
        }
      }
      x[i] = (target < 0 && best == 0.0f ? -0.0f : best) * scale;
    }
  }
}

// As fp8_round_trip: every step exact, so all clones give the same bits.
DSV4_FP8_CLONES void fp4_round_trip(float* x, int64_t n, int64_t block) {
  const float min_amax = 6.0f * std::ldexp(1.0f, -126);
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    int64_t b1 = std::min(n, b0 + block);
    const float scale = pow2_ceil(block_amax(x + b0, b1 - b0, min_amax) * kInv6);
    const float inverse = 1.0f / scale;  // exact, as in fp8_round_trip
    for (int64_t i = b0; i < b1; ++i) {
      float q = std::clamp(x[i] * inverse, -6.0f, 6.0f);
      x[i] = round_to_e2m1(q) * scale;
    }
  }
}

namespace {
// The e4m3 byte of a value on the e4m3 grid (|v| <= 448).
uint8_t e4m3_grid_code(float v) {
  // Ascending search over the positive codes; values are on the grid.
  const float a = std::fabs(v);
  int code = 0;
  while (code < 0x7e && e4m3_to_float(uint8_t(code)) < a) ++code;
  return uint8_t(code | (std::signbit(v) ? 0x80 : 0));
}

// The e2m1 nibble of a value on the e2m1 grid (|v| <= 6).
uint8_t e2m1_grid_code(float v) {
  const float a = std::fabs(v);
  int code = 0;
  while (code < 7 && e2m1_to_float(uint8_t(code)) < a) ++code;
  return uint8_t(code | (std::signbit(v) ? 8 : 0));
}
}  // namespace

void fp4_e4m3_round_trip(float* x, int64_t n, int64_t block, uint8_t* codes, uint8_t* scales) {
  const float min_amax = 6.0f * std::ldexp(1.0f, -9);
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min(n, b0 + block);
    float amax = min_amax;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    // Division, not a reciprocal product: the scale is not a power of two.
    const float scale = round_to_e4m3(std::min(amax / 6.0f, 448.0f));
    if (scales) scales[b0 / block] = e4m3_grid_code(scale);
    for (int64_t i = b0; i < b1; ++i) {
      const float q = round_to_e2m1(std::clamp(x[i] / scale, -6.0f, 6.0f));
      if (codes) codes[i] = e2m1_grid_code(q);
      x[i] = q * scale;
    }
  }
}

}  // namespace dsv4
