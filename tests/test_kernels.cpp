// Numeric building blocks against scalar references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_internal.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/random_linear.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vector_ops.h"
#include "kernels/rope.h"
#include "random_floats.h"

namespace dsv4 {
namespace {

TEST(Numeric, E4m3TableMatchesFormat) {
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(130), 8.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e2m1_to_float(7), 6.0f);
  EXPECT_EQ(e2m1_to_float(9), -0.5f);
}

TEST(Numeric, Pow2CeilIsExact) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(1.0000001f), 2.0f);
  EXPECT_EQ(pow2_ceil(0.3f), 0.5f);
  EXPECT_EQ(pow2_ceil(std::ldexp(1.0f, -100)), std::ldexp(1.0f, -100));
}

TEST(Numeric, E2m1RoundsTiesToEven) {
  const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.0f, 0.2f, 5.9f};
  const float out[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -4.0f, 0.0f, 6.0f};
  for (size_t i = 0; i < std::size(in); ++i) {
    EXPECT_EQ(round_to_e2m1(in[i]), out[i]) << in[i];
  }
}

// round_to_e4m3 is bit arithmetic; the plain formula (step from frexp,
// nearbyint) is the reference. Every midpoint of adjacent e4m3 values and its
// float neighbours, and a sweep over the float bit patterns up to 448.
TEST(Numeric, E4m3RoundingMatchesFormula) {
  auto formula = [](float v) {
    float a = std::fabs(v);
    if (a == 0.0f) return v;
    int exponent;
    std::frexp(a, &exponent);
    const float step = std::ldexp(1.0f, std::max(exponent - 1, -6) - 3);
    return std::nearbyint(v / step) * step;
  };
  auto check = [&](float v) {
    for (float s : {v, -v}) {
      ASSERT_EQ(float_to_bits(round_to_e4m3(s)), float_to_bits(formula(s))) << s;
    }
  };
  for (int code = 0; code < 0x7e; ++code) {
    const float mid = (e4m3_to_float(uint8_t(code)) + e4m3_to_float(uint8_t(code + 1))) / 2;
    check(mid);
    check(std::nextafter(mid, 0.0f));
    check(std::nextafter(mid, 1000.0f));
  }
  for (uint32_t bits = 0; bits <= float_to_bits(448.0f); bits += 97) check(bits_to_float(bits));
  check(448.0f);
}

TEST(Numeric, Fp8RoundTripMatchesExhaustiveReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(256);
    float spread = std::ldexp(1.0f, int(rng() % 30) - 15);
    for (auto& v : x) v = normal(rng) * spread * (rng() % 5 == 0 ? 1e-3f : 1.0f);
    // Exact ties and subnormal-range values.
    x[3] = x[0] > 0 ? 0.0f : -0.0f;
    std::vector<float> a = x, b = x;
    fp8_round_trip(a.data(), 256, 128);
    fp8_round_trip_reference(b.data(), 256, 128);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(a[i], b[i]) << "value " << x[i];
    }
  }
}

TEST(Numeric, Fp8ScaleFollowsFp32Product) {
  // The scale is pow2_ceil(fp32(amax * fl32(1/448))). For amax = 448 the fp32
  // product rounds to exactly 1, so the scale stays 1 (architecture.md §6.2
  // claims 2; the fp32 arithmetic of the reference, and the golden data, say 1).
  // The scale is visible in the subnormal grid: 5*2^-11 rounds to 2^-9 with
  // scale 1 but to 2^-8 with scale 2.
  std::vector<float> x(128, 0.0f);
  x[0] = 448.0f;
  x[1] = 5 * std::ldexp(1.0f, -11);
  fp8_round_trip(x.data(), 128, 128);
  EXPECT_EQ(x[0], 448.0f);
  EXPECT_EQ(x[1], std::ldexp(1.0f, -9));
  std::vector<float> y(128, 0.0f);
  y[0] = 449.0f;
  y[1] = 5 * std::ldexp(1.0f, -11);
  fp8_round_trip(y.data(), 128, 128);
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], std::ldexp(1.0f, -8));
}

TEST(Numeric, Fp4RoundTripUsesPowerOfTwoScales) {
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;  // fp32(6 * fl32(1/6)) == 1: scale 1
  x[1] = 1.0f;
  x[2] = 2.9f;   // -> 3
  x[3] = -0.4f;  // -> -0.5
  x[4] = 0.25f;  // tie -> 0
  fp4_round_trip(x.data(), 32, 32);
  EXPECT_EQ(x[0], 6.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_EQ(x[2], 3.0f);
  EXPECT_EQ(x[3], -0.5f);
  EXPECT_EQ(x[4], 0.0f);
  std::vector<float> y(32, 0.0f);
  y[0] = 6.5f;  // scale 2: 3.25 -> 3 -> 6
  y[1] = 0.4f;  // 0.2 -> 0
  fp4_round_trip(y.data(), 32, 32);
  EXPECT_EQ(y[0], 6.0f);
  EXPECT_EQ(y[1], 0.0f);
}

// Random weights of each format (see random_linear.h) whose first scale
// blocks take the kernels' other decoding paths: 2^120 and more (FP8: with
// small codes only, so that nothing overflows), 2^-127 (a subnormal float)
// and, for FP4, 2^127 (the large magnitudes overflow to inf in float, on
// every path).
RandomLinear random_linear(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed) {
  RandomLinear w(format, rows, cols, seed);
  auto& scale = w.scale;
  if (format == WeightFormat::FP8_BLOCK128) {
    scale[0] = 247;
    for (int64_t r = 0; r < std::min<int64_t>(rows, 128); ++r)
      for (int64_t i = 0; i < std::min<int64_t>(cols, 128); ++i) w.data[size_t(r * cols + i)] &= 0xb7;
    if (scale.size() > 1) scale[1] = 0;
  }
  if (format == WeightFormat::FP4_BLOCK32) {
    scale[0] = 250;
    if (scale.size() > 1) scale[1] = 0;
    if (scale.size() > 2) scale[2] = 254;
  }
  return w;
}

class LinearFormats : public ::testing::TestWithParam<WeightFormat> {};

// The canonical order sums at most 64 products per fp32 lane and chunk, so
// the result is within 66 fp32 rounding units of the sum of |products| of
// the exact value. 2560 columns: two full chunks and a half one.
TEST_P(LinearFormats, DotMatchesScalarReference) {
  const int64_t rows = 300, cols = 2560;
  RandomLinear w = random_linear(GetParam(), rows, cols, 11);
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = n(rng);
  for (int64_t r = 0; r < rows; ++r) {
    double ref = linear_dot_reference(w.linear, r, x.data());
    double mag = 0;
    std::vector<float> row(static_cast<size_t>(cols));
    linear_decode_row(w.linear, r, row.data());
    for (int64_t i = 0; i < cols; ++i) mag += std::fabs(double(row[size_t(i)]) * x[size_t(i)]);
    const double got = linear_dot(w.linear, r, x.data());
    if (!std::isfinite(ref)) {  // a weight past the float range (extreme scale)
      EXPECT_FALSE(std::isfinite(got)) << "row " << r;
      continue;
    }
    EXPECT_NEAR(got, ref, 66 * 0x1p-24 * mag + 1e-30) << "row " << r;
  }
}

TEST_P(LinearFormats, BatchAndThreadsDoNotChangeBits) {
  const int64_t rows = 520, cols = 256, n = 9;
  static_assert(rows * cols * n >= kMinParallelWork, "the batched call must run on several threads");
  RandomLinear w = random_linear(GetParam(), rows, cols, 5);
  w.linear.quantize_input = GetParam() == WeightFormat::FP8_BLOCK128 || GetParam() == WeightFormat::FP4_BLOCK32;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(n * cols));
  for (auto& v : x) v = nd(rng);
  std::vector<float> batched(size_t(n * rows)), single(size_t(n * rows));
  const int saved = compute_threads();
  set_compute_threads(3);
  linear_forward(w.linear, x.data(), n, batched.data());
  set_compute_threads(1);
  for (int64_t t = 0; t < n; ++t) linear_forward(w.linear, x.data() + t * cols, 1, single.data() + t * rows);
  set_compute_threads(saved);
  EXPECT_EQ(0, std::memcmp(batched.data(), single.data(), batched.size() * 4));
}

// Runs `product` (which fills an output of `size` floats, first set to -1)
// with the scalar kernels and with every SIMD path this CPU has; all must
// give the same bits. Returns the scalar output.
std::vector<float> expect_simd_gives_scalar_bits(size_t size, const std::function<void(float*)>& product) {
  const KernelIsa saved = active_kernel_isa();
  set_kernel_isa(KernelIsa::Scalar);
  std::vector<float> scalar(size, -1.0f);
  product(scalar.data());
  for (KernelIsa isa : {KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) {
      std::printf("skipping %s: not supported by this CPU\n", kernel_isa_name(isa));
      continue;
    }
    set_kernel_isa(isa);
    std::vector<float> simd(size, -1.0f);
    product(simd.data());
    EXPECT_EQ(0, std::memcmp(simd.data(), scalar.data(), size * 4)) << kernel_isa_name(isa);
    if (isa == KernelIsa::Avx512 && bf16_dot_supported()) {  // and with the other bf16 dot setting
      const bool bf16 = bf16_dot_enabled();
      set_bf16_dot(!bf16);
      std::vector<float> other(size, -1.0f);
      product(other.data());
      set_bf16_dot(bf16);
      EXPECT_EQ(0, std::memcmp(other.data(), scalar.data(), size * 4)) << "avx512, bf16 dot " << !bf16;
    }
  }
  set_kernel_isa(saved);
  return scalar;
}

using test::normal_floats;

// The SIMD paths follow the canonical reduction order exactly: same bits.
// Tokens: register groups of 1-4 (FP4 below 8, the others below 17), the dot form's
// packed groups of 6 (to 127), the outer form's groups of 12 (from 128). 70 rows leave
// remainders after row groups of 4, 16 and 32 and row blocks of 64; 2304
// columns are two chunks and a partial one.
TEST_P(LinearFormats, SimdPathsGiveScalarBits) {
  for (int64_t cols : {512, 2304})
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 10, 13, 16, 17, 127, 128, 141, 200}) {
      SCOPED_TRACE("tokens " + std::to_string(n) + ", columns " + std::to_string(cols));
      const int64_t rows = 70;
      RandomLinear w = random_linear(GetParam(), rows, cols, 21);
      const std::vector<float> x = normal_floats(size_t(n * cols), 4);
      expect_simd_gives_scalar_bits(size_t(n * rows), [&](float* y) { linear_forward(w.linear, x.data(), n, y); });
    }
}

// The FP4 register path with VDPBF16PS (linear_fp4_pairs.cpp) runs on
// FP8-rounded inputs (expert matrices): 1-7 tokens, rows that leave
// remainders after the four streams, a partial last chunk; with a block
// scale below 2^-50's bound in one row (its row group takes the fp32
// kernel) and with a block of inputs below 2^-50 (the whole product does).
// expect_simd_gives_scalar_bits runs AVX-512 with the bf16 kernels on and
// off.
TEST(Linear, Fp4StepPairsGiveScalarBits) {
  const int64_t rows = 70, cols = 2304;
  for (int variant = 0; variant < 3; ++variant) {
    RandomLinear w(WeightFormat::FP4_BLOCK32, rows, cols, 41, 100, 40);
    w.linear.quantize_input = true;
    if (variant == 1) w.scale[size_t(9 * w.linear.scale_cols + 5)] = 60;
    for (int64_t n : {1, 2, 3, 4, 5, 7}) {
      SCOPED_TRACE("variant " + std::to_string(variant) + ", tokens " + std::to_string(n));
      std::vector<float> x = normal_floats(size_t(n * cols), 12);
      if (variant == 2)
        for (int64_t c = 256; c < 384; ++c) x[size_t(c)] = 1e-20f * x[size_t(c)];
      expect_simd_gives_scalar_bits(size_t(n * rows), [&](float* y) { linear_forward(w.linear, x.data(), n, y); });
    }
  }
}

// FP4 blocks under every scale byte but NaN's, 2^-127 to 2^127, row r
// taking bytes 32r to 32r + 31 (only the last row's products overflow the
// float range; the first row's are subnormal): each SIMD decoder (AVX2's
// byte lookups of the values' top halves among them) gives the scalar bits.
TEST(Linear, Fp4EveryScaleByteGivesScalarBits) {
  const int64_t rows = 8, cols = 32 * 32;
  RandomLinear w(WeightFormat::FP4_BLOCK32, rows, cols, 23);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < 32; ++b) w.scale[size_t(r * w.linear.scale_cols + b)] = uint8_t(std::min<int64_t>(254, 32 * r + b));
  for (int64_t n : {1, 3, 16}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    const std::vector<float> x = normal_floats(size_t(n * cols), 8);
    const std::vector<float> y = expect_simd_gives_scalar_bits(
        size_t(n * rows), [&](float* out) { linear_forward(w.linear, x.data(), n, out); });
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r + 1 < rows; ++r) EXPECT_TRUE(std::isfinite(y[size_t(t * rows + r)])) << r;
  }
}

// One token against FP8 rows that fill 128-row blocks: the block's scales
// go into a copy of the input (AVX-512 and AVX2), except for the spans
// whose scale would push an input out of the normal floats or past the
// fp16 decoding's range. Scales from 0 to 250 per (block, span), a row range
// that starts and ends inside a block, and an input with a huge value (few
// prescalable spans) all give the scalar bits.
TEST(Linear, Fp8OneTokenPrescaledBlocksGiveScalarBits) {
  // Two threads: pieces of 256 rows (of 248 in the inner range), so most
  // hold whole blocks (with many threads, pieces shrink below a block).
  const int saved_threads = compute_threads();
  set_compute_threads(2);
  const int64_t rows = 2048, cols = 256;
  RandomLinear w(WeightFormat::FP8_BLOCK128, rows, cols, 31);
  const uint8_t scales[] = {0, 90, 119, 127, 200, 246, 247, 250, 5, 140, 119, 60};
  for (size_t k = 0; k < w.scale.size(); ++k) w.scale[k] = scales[k % 12];
  std::vector<float> x = normal_floats(size_t(cols), 9);
  for (bool huge : {false, true}) {
    SCOPED_TRACE(huge ? "an input of 1e30" : "normal inputs");
    if (huge) x[100] = 1e30f;
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, rows}, {32, 2016}, {128, 1920}}) {
      SCOPED_TRACE("rows " + std::to_string(begin) + "-" + std::to_string(end));
      expect_simd_gives_scalar_bits(size_t(end - begin),
                                    [&](float* y) { linear_forward(w.linear, x.data(), 1, y, begin, end); });
    }
  }
  set_compute_threads(saved_threads);
}

DSV4_TARGET_AVX512 void folds_avx512(const float* lanes, double* one_by_one, double* four_at_once) {
  __m512 a[4];
  for (int k = 0; k < 4; ++k) {
    a[k] = _mm512_loadu_ps(lanes + 16 * k);
    one_by_one[k] = linear_detail::fold16_avx512(a[k]);
  }
  _mm256_storeu_pd(four_at_once, linear_detail::fold16x4_avx512(a[0], a[1], a[2], a[3]));
}

// The folds in registers against fold16 (the canonical tree), on lanes whose
// exponents are far enough apart that the double sums round: with lanes of
// one magnitude every sum of 16 floats is exact in double, and any tree
// would pass.
TEST(Linear, FoldsInRegistersFollowTheCanonicalTree) {
  if (!kernel_isa_supported(KernelIsa::Avx512)) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(-70, 70), sign(0, 1);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  int64_t rounded = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    float lanes[64];
    for (float& v : lanes) v = std::ldexp(mantissa(rng), exponent(rng)) * (sign(rng) ? -1.0f : 1.0f);
    double one_by_one[4], four_at_once[4];
    folds_avx512(lanes, one_by_one, four_at_once);
    for (int k = 0; k < 4; ++k) {
      const double expected = linear_detail::fold16(lanes + 16 * k);
      ASSERT_EQ(std::memcmp(&one_by_one[k], &expected, 8), 0) << "trial " << trial << " register " << k;
      ASSERT_EQ(std::memcmp(&four_at_once[k], &expected, 8), 0) << "trial " << trial << " register " << k;
      // How often another tree (lanes in order) would give other bits here.
      double in_order = 0;
      for (int l = 0; l < 16; ++l) in_order += double(lanes[16 * k + l]);
      rounded += in_order != expected;
    }
  }
  EXPECT_GT(rounded, 1000) << "the lanes should make the tree matter";
}

// The range of scales a one-token FP8 product may put into its inputs,
// computed per piece of rows: the AVX-512 version gives the scalar one's
// range for inputs whose smallest and largest nonzero values sit anywhere
// in the float range (subnormals among them), zeros of either sign, and
// infinities or NaN (no range).
TEST(Linear, PrescalableScalesAreTheSameOnEveryPath) {
  if (!kernel_isa_supported(KernelIsa::Avx512)) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(5);
  for (int round = 0; round < 200; ++round) {
    std::vector<float> x = normal_floats(size_t(16 * (1 + round % 9)), uint32_t(round));
    for (auto& v : x) {
      const unsigned pick = rng() % 16;
      if (pick == 0) v = 0.0f;
      if (pick == 1) v = -0.0f;
      if (pick == 2) v = std::ldexp(v, int(rng() % 250) - 125);  // from subnormal to near the top
    }
    if (round % 20 == 7) x[rng() % x.size()] = INFINITY;
    if (round % 20 == 13) x[rng() % x.size()] = NAN;
    if (round % 20 == 17) std::fill(x.begin(), x.end(), 0.0f);
    const auto scalar = linear_detail::prescalable_scales(x.data(), int64_t(x.size()));
    const auto avx512 = linear_detail::prescalable_scales_avx512(x.data(), int64_t(x.size()));
    EXPECT_EQ(scalar, avx512) << "round " << round;
  }
}

// More tokens than one packed task takes (4092): the second token block
// and its partial token group.
TEST_P(LinearFormats, TokensBeyondOneTaskGiveScalarBits) {
  const int64_t rows = 12, cols = 128, n = 4100;
  RandomLinear w = random_linear(GetParam(), rows, cols, 22);
  const std::vector<float> x = normal_floats(size_t(n * cols), 6);
  expect_simd_gives_scalar_bits(size_t(n * rows), [&](float* y) { linear_forward(w.linear, x.data(), n, y); });
}

// A slice of rows [6, 150) written with a stride (how the grouped output
// projection calls it), over 200 rows: row groups and panels straddle the
// FP8 128-row scale blocks.
TEST_P(LinearFormats, RowSliceWithStrideGivesScalarBits) {
  const int64_t rows = 200, cols = 256, row_begin = 6, row_end = 150, stride = 160;
  RandomLinear w = random_linear(GetParam(), rows, cols, 23);
  for (int64_t n : {1, 3, 9, 130}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    const std::vector<float> x = normal_floats(size_t(n * cols), 5);
    const std::vector<float> scalar = expect_simd_gives_scalar_bits(
        size_t(n * stride), [&](float* y) { linear_forward(w.linear, x.data(), n, y, row_begin, row_end, stride); });
    // Outside the slice nothing is written.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = row_end - row_begin; o < stride; ++o) {
        ASSERT_EQ(scalar[size_t(t * stride + o)], -1.0f);
      }
  }
}

// FP8 rows that fill 128-row blocks go in groups that share their scales,
// and a one-token product then puts each block's scales into a copy of
// its input where that is exact. The bits stay the scalar ones: for inputs
// near both ends of the float range (where a scaled input would overflow
// or lose bits, the scale goes into the weights again), for row ranges
// that start inside a block, and for more tokens (no prescaling).
TEST(Linear, Fp8SharedScalesGiveScalarBits) {
  const int64_t rows = 428, cols = 384;  // three whole row blocks
  RandomLinear w = random_linear(WeightFormat::FP8_BLOCK128, rows, cols, 24);
  for (auto& b : w.data) b &= 0xb7;  // |weight| < scale: 3e36 inputs make finite products
  // Row blocks 1 and 2 scale the inputs down and up; block 0 keeps
  // random_linear's extremes (2^120, 2^-127), which never prescale.
  const uint8_t scales[] = {100, 110, 119, 120, 127, 129};
  w.scale[2] = 119;
  for (size_t i = 3; i < w.scale.size(); ++i) w.scale[i] = scales[(i - 3) % 6];
  for (int64_t n : {1, 2, 5})
    for (float magnitude : {1.0f, 1e-37f, 3e36f})
      for (int64_t row_begin : {0, 100}) {
        char trace[96];
        std::snprintf(trace, sizeof trace, "tokens %lld, inputs times %g, rows from %lld", (long long)n,
                      double(magnitude), (long long)row_begin);
        SCOPED_TRACE(trace);
        std::vector<float> x = normal_floats(size_t(n * cols), 7);
        for (auto& v : x) v *= magnitude;
        expect_simd_gives_scalar_bits(size_t(n * (rows - row_begin)),
                                      [&](float* y) { linear_forward(w.linear, x.data(), n, y, row_begin, rows); });
      }
}

// FP8 rows of whole 128-row blocks against 5-16 tokens go eight at a time
// with VDPBF16PS (linear_fp8_pairs.cpp, each chunk of the rows decoded once
// into step-pair words) where every scale of the block lies in [86, 246]
// (kBf16DotMinFp8Scale, kMaxHalfPathScale) and the inputs qualify: same
// bits. Blocks with a span just outside (85, 247) or far outside keep the
// four-row kernel. Scale 86 with the smallest codes, subnormal e4m3 among
// them, is the edge where no weight lies below 2^-50; rows from 100 start
// inside a block; tiny inputs keep every block off VDPBF16PS.
// expect_simd_gives_scalar_bits runs AVX-512 with the bf16 kernels on and
// off.
TEST(Linear, Fp8EightRowsGiveScalarBits) {
  const int saved_threads = compute_threads();
  set_compute_threads(2);
  const int64_t rows = 768, cols = 2304;  // six row blocks; two chunks and a partial one
  RandomLinear w(WeightFormat::FP8_BLOCK128, rows, cols, 43);
  w.linear.quantize_input = true;
  const int64_t spans = w.linear.scale_cols;
  const uint8_t block_scales[6][2] = {{86, 246}, {9, 120}, {120, 247}, {115, 125}, {85, 120}, {86, 86}};
  for (int64_t b = 0; b < 6; ++b)
    for (int64_t k = 0; k < spans; ++k) w.scale[size_t(b * spans + k)] = block_scales[b][k % 2];
  for (int64_t r : {0, 1, 512, 545, 640})
    for (int64_t i = 0; i < cols; ++i) w.data[size_t(r * cols + i)] = uint8_t((i % 16) | (i & 16 ? 0x80 : 0));
  for (int64_t i = 256 * cols; i < 384 * cols; ++i) w.data[size_t(i)] &= 0xb7;  // finite under scale 247
  for (bool tiny : {false, true})
    for (int64_t n : {5, 6, 9, 16})
      for (int64_t row_begin : {0, 100}) {
        SCOPED_TRACE(std::string(tiny ? "tiny inputs, " : "") + "tokens " + std::to_string(n) + ", rows from " +
                     std::to_string(row_begin));
        std::vector<float> x = normal_floats(size_t(n * cols), 17);
        if (tiny)
          for (int64_t c = 0; c < 128; ++c) x[size_t(cols + c)] *= 1e-20f;
        expect_simd_gives_scalar_bits(size_t(n * (rows - row_begin)),
                                      [&](float* y) { linear_forward(w.linear, x.data(), n, y, row_begin, rows); });
      }
  set_compute_threads(saved_threads);
}

// linear_forward_many (the routed experts of a step in one batch of
// products) gives each product the bits of its own linear_forward call, on
// every path: few-token products share one parallel region, many-token
// ones (packed GEMMs) run as single calls. Matrices of every format, rows
// that do not split in four streams per thread, and an empty product.
TEST(Linear, ManyProductsGiveEachProductsBits) {
  std::vector<RandomLinear> weights;
  weights.push_back(random_linear(WeightFormat::FP4_BLOCK32, 70, 512, 31));
  weights.push_back(random_linear(WeightFormat::FP8_BLOCK128, 130, 2304, 32));
  weights.push_back(random_linear(WeightFormat::BF16, 97, 256, 33));
  weights.push_back(random_linear(WeightFormat::F32, 40, 128, 34));
  weights.push_back(random_linear(WeightFormat::FP4_BLOCK32, 64, 256, 35));
  for (auto& w : weights)
    w.linear.quantize_input =
        w.linear.format == WeightFormat::FP8_BLOCK128 || w.linear.format == WeightFormat::FP4_BLOCK32;
  const int64_t tokens[] = {1, 3, 16, 5, 20, 0};
  const size_t count = 6;
  std::vector<std::vector<float>> x(count);
  std::vector<size_t> y_offset(count + 1, 0);
  for (size_t i = 0; i < count; ++i) {
    const Linear& w = weights[i % weights.size()].linear;
    x[i] = normal_floats(size_t(std::max<int64_t>(tokens[i], 1) * w.cols), uint32_t(40 + i));
    y_offset[i + 1] = y_offset[i] + size_t(tokens[i] * w.rows);
  }
  const KernelIsa saved = active_kernel_isa();
  for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) continue;
    SCOPED_TRACE(kernel_isa_name(isa));
    set_kernel_isa(isa);
    std::vector<float> one(y_offset[count], -1.0f), many(y_offset[count], -2.0f);
    std::vector<LinearProduct> products;
    for (size_t i = 0; i < count; ++i) {
      const Linear& w = weights[i % weights.size()].linear;
      linear_forward(w, x[i].data(), tokens[i], one.data() + y_offset[i]);
      products.push_back({&w, x[i].data(), tokens[i], many.data() + y_offset[i]});
    }
    linear_forward_many(products.data(), products.size());
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * 4));
  }
  set_kernel_isa(saved);
}

TEST(Linear, Fp4WidthMustBeWholeScaleBlocks) {
  RandomLinear w = random_linear(WeightFormat::FP4_BLOCK32, 4, 64, 1);
  w.linear.cols = 48;  // the scale blocks are 32 wide
  std::vector<float> x(48, 1.0f), y(4);
  EXPECT_THROW(linear_forward(w.linear, x.data(), 1, y.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(Kernels, LinearFormats,
                         ::testing::Values(WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8_BLOCK128,
                                           WeightFormat::FP4_BLOCK32));

// The many-head attention helpers give the bits of the per-pair functions
// (head and key counts that leave remainders after blocks of 4 and 8).
TEST(Ops, AttentionRowsMatchPerPairFunctions) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int64_t dim : {48, 512, 40})
    for (int64_t heads : {1, 4, 7, 9})
      for (int64_t n_keys : {1, 5, 13, 70, 133}) {
        SCOPED_TRACE(std::to_string(dim) + " dims, " + std::to_string(heads) + " heads, " + std::to_string(n_keys) +
                     " keys");
        std::vector<float> q(size_t(heads * dim)), k(size_t(n_keys * dim)), p(size_t(heads * n_keys));
        for (auto* v : {&q, &k, &p})
          for (auto& x : *v) x = nd(rng);
        std::vector<const float*> keys;
        for (int64_t j = 0; j < n_keys; ++j) keys.push_back(k.data() + j * dim);
        std::vector<float> scores(size_t(heads * n_keys)), expected(scores.size());
        dot_fixed_rows(q.data(), heads, keys.data(), n_keys, dim, scores.data());
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t j = 0; j < n_keys; ++j) {
            expected[size_t(h * n_keys + j)] = dot_fixed(q.data() + h * dim, keys[size_t(j)], dim);
            // dot_fixed's order written out here (compiled without the
            // AVX-512/AVX2 clones): the clone this CPU runs gives its bits.
            float lanes[16] = {};
            int64_t i = 0;
            for (; i + 16 <= dim; i += 16)
              for (int l = 0; l < 16; ++l)
                lanes[l] = std::fma(q[size_t(h * dim + i + l)], keys[size_t(j)][i + l], lanes[l]);
            for (int l = 0; i < dim; ++i, ++l)
              lanes[l] = std::fma(q[size_t(h * dim + i)], keys[size_t(j)][i], lanes[l]);
            for (int width = 8; width >= 1; width /= 2)
              for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
            ASSERT_EQ(float_to_bits(lanes[0]), float_to_bits(expected[size_t(h * n_keys + j)]));
          }
        EXPECT_EQ(0, std::memcmp(scores.data(), expected.data(), scores.size() * 4));
        std::vector<float> out(size_t(heads * dim), 0.5f), want = out;
        add_scaled_rows(out.data(), heads, p.data(), keys.data(), n_keys, dim);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t j = 0; j < n_keys; ++j)
            add_scaled(want.data() + h * dim, p[size_t(h * n_keys + j)], keys[size_t(j)], dim);
        EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * 4));
      }
}

// The backend's sink attention gives, on every path and thread count, the
// bits of its definition per (row, head): dot_fixed scores, softmax_with_sink,
// then add_scaled of each key in order into zeros. Rows long enough for the
// key-tiled path (more than 256 keys, tiles of 64 with a remainder) and short
// ones, in one call and alone; many long rows (a thread each); 64 heads (as V4-Flash) and 5; a dim that
// leaves a 16-value remainder after 32-wide blocks.
TEST(Ops, SinkAttentionGivesPerHeadBitsOnEveryPathAndSplit) {
  struct Case {
    int64_t heads, dim;
    std::vector<int64_t> row_keys;
  };
  for (const Case& c : {Case{64, 512, {1000}}, Case{5, 48, {300, 7, 1000, 257}}, Case{8, 64, {70, 3}},
                        Case{3, 40, {600, 600}},
                        Case{16, 64, std::vector<int64_t>(10, 300)}}) {
    const int64_t rows = int64_t(c.row_keys.size()), heads = c.heads, dim = c.dim;
    std::vector<int64_t> key_begin = {0};
    for (int64_t n : c.row_keys) key_begin.push_back(key_begin.back() + n);
    const std::vector<float> q = normal_floats(size_t(rows * heads * dim), 21),
                             k = normal_floats(size_t(key_begin.back() * dim), 22),
                             sink = normal_floats(size_t(heads), 23);
    std::vector<const float*> keys;
    // Rows share keys in a shuffled order, as gathered rows do.
    for (int64_t j = 0; j < key_begin.back(); ++j) keys.push_back(k.data() + (j * 7919 % key_begin.back()) * dim);
    const float scale = 1.0f / std::sqrt(float(dim));
    std::vector<float> want(size_t(rows * heads * dim), 0.0f);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t n = c.row_keys[size_t(t)];
        std::vector<float> p(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j)
          p[size_t(j)] = dot_fixed(q.data() + (t * heads + h) * dim, keys[size_t(key_begin[t] + j)], dim, KernelIsa::Scalar);
        softmax_with_sink(p.data(), n, scale, sink[size_t(h)], KernelIsa::Scalar);
        for (int64_t j = 0; j < n; ++j)
          add_scaled(want.data() + (t * heads + h) * dim, p[size_t(j)], keys[size_t(key_begin[t] + j)], dim,
                     KernelIsa::Scalar);
      }
    const int saved = compute_threads();
    for (int threads : {1, 2, 3})
      for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
        if (!kernel_isa_supported(isa)) continue;
        SCOPED_TRACE(std::string(kernel_isa_name(isa)) + ", " + std::to_string(heads) + " heads, dim " +
                     std::to_string(dim) + ", " + std::to_string(threads) + " threads");
        set_compute_threads(threads);
        std::vector<float> got(want.size(), NAN);
        backend_by_name(kernel_isa_name(isa))
            .sink_attention({q.data(), rows, heads, dim, keys.data(), key_begin.data(), sink.data(), scale, got.data()});
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
        // One row alone (a decode step's lone sequence).
        std::vector<float> alone(size_t(heads * dim), NAN);
        backend_by_name(kernel_isa_name(isa))
            .sink_attention({q.data(), 1, heads, dim, keys.data(), key_begin.data(), sink.data(), scale, alone.data()});
        EXPECT_EQ(0, std::memcmp(alone.data(), want.data(), alone.size() * 4));
      }
    set_compute_threads(saved);
  }
}

// hc_post: x[k][i] = post[k] * y[i] + sum_j comb[j][k] * old x[j][i], the
// sums in j order with separate roundings; the scalar and AVX-512 paths
// give the bits of that definition (a width that leaves a remainder after
// 16-column vectors, three tokens).
TEST(Ops, HcPostGivesDefinitionBitsOnEveryPath) {
  HcShape c;
  c.copies = 4;
  c.dim = 4096 + 8;
  const int64_t h = c.copies, d = c.dim, n = 3;
  HcMix mix;
  mix.post = normal_floats(size_t(n * h), 51);
  mix.comb = normal_floats(size_t(n * h * h), 52);
  const std::vector<float> y = normal_floats(size_t(n * d), 53), x0 = normal_floats(size_t(n * h * d), 54);
  std::vector<float> want = x0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < h; ++k)
      for (int64_t i = 0; i < d; ++i) {
        volatile float s = 0.0f;  // volatile: one rounding per operation, as written
        for (int64_t j = 0; j < h; ++j) {
          volatile float p = mix.comb[size_t(t * h * h + j * h + k)] * x0[size_t(t * h * d + j * d + i)];
          s = s + p;
        }
        volatile float py = mix.post[size_t(t * h + k)] * y[size_t(t * d + i)];
        want[size_t(t * h * d + k * d + i)] = py + s;
      }
  const std::vector<float> scalar = expect_simd_gives_scalar_bits(want.size(), [&](float* out) {
    std::copy(x0.begin(), x0.end(), out);
    default_backend().hc_post(c, mix, y.data(), out, n);
  });
  EXPECT_EQ(0, std::memcmp(scalar.data(), want.data(), want.size() * 4));
}

// hc_pre's collapse: y[i] = sum_j pre[j] * x[j][i] in j order with separate
// roundings, the same bits on every path.
TEST(Ops, HcPreCollapseGivesDefinitionBitsOnEveryPath) {
  HcShape c;
  c.copies = 4;
  c.dim = 4096 + 8;
  c.sinkhorn_iters = 3;
  c.eps = 1e-6f;
  c.norm_eps = 1e-6f;
  const int64_t h = c.copies, d = c.dim, n = 3, mixes = (2 + h) * h;
  std::vector<float> fn = normal_floats(size_t(mixes * h * d), 61);
  for (auto& v : fn) v *= 0.01f;
  Linear fn_linear;
  fn_linear.format = WeightFormat::F32;
  fn_linear.rows = mixes;
  fn_linear.cols = h * d;
  fn_linear.data = reinterpret_cast<const uint8_t*>(fn.data());
  const std::vector<float> base = normal_floats(size_t(mixes), 62), scale = {0.5f, 0.7f, 0.9f};
  const HcSite w{&fn_linear, base.data(), scale.data()};
  const std::vector<float> x = normal_floats(size_t(n * h * d), 63);
  HcMix mix;
  const std::vector<float> y = expect_simd_gives_scalar_bits(
      size_t(n * d), [&](float* out) { default_backend().hc_pre(c, w, x.data(), n, out, &mix); });
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) {
      volatile float s = 0.0f;
      for (int64_t j = 0; j < h; ++j) {
        volatile float p = mix.pre[size_t(t * h + j)] * x[size_t(t * h * d + j * d + i)];
        s = s + p;
      }
      ASSERT_EQ(float(s), y[size_t(t * d + i)]) << "token " << t << ", column " << i;
    }
}

TEST(Ops, HadamardMatchesSylvesterMatrix) {
  const int n = 128;
  std::vector<float> x(n);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  std::vector<float> y = x;
  hadamard_transform(y.data(), n);
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < n; ++j) s += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * x[size_t(j)];
    EXPECT_NEAR(y[size_t(i)], s / std::sqrt(double(n)), 1e-5);
  }
}

TEST(Ops, RopeInverseUndoesRotation) {
  RopeParams c;
  c.dim = 64;
  c.base = 10000;
  RopeTable plain(c);
  c.base = 160000;
  RopeTable unscaled_c(c);
  c.original_seq_len = 65536;
  c.factor = 16;
  RopeTable yarn(c);
  // YaRN keeps pairs 0..15, divides pairs >= 25 by the factor.
  for (int j = 0; j < 32; ++j) {
    float f = unscaled_c.frequencies()[size_t(j)], g = yarn.frequencies()[size_t(j)];
    if (j <= 15) {
      EXPECT_EQ(f, g);
    } else if (j >= 25) {
      EXPECT_FLOAT_EQ(g, f / 16);
    } else {
      EXPECT_TRUE(g < f && g > f / 16);
    }
  }
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = float(i) * 0.1f - 3;
  std::vector<float> y = x;
  plain.apply(y.data(), 1234);
  // Pair 0 rotates by pos * 1 radian.
  EXPECT_NEAR(y[0], x[0] * std::cos(1234.0f) - x[1] * std::sin(1234.0f), 1e-4);
  plain.apply(y.data(), 1234, true);
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5);
  }
}

TEST(Ops, TopKBreaksTiesByLowerIndexAndSortsIds) {
  std::vector<float> s = {0.5f, 2.0f, 0.0f, 2.0f, 0.0f, 1.0f};
  EXPECT_EQ(top_k_indices(s.data(), 6, 3), (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(top_k_indices(s.data(), 6, 5), (std::vector<int32_t>{0, 1, 2, 3, 5}));
  EXPECT_EQ(top_k_indices(s.data(), 2, 5), (std::vector<int32_t>{0, 1}));
}

TEST(Ops, RmsNormMatchesDefinition) {
  std::vector<float> x = {1, 2, 3, 4}, w = {1, 0.5f, 2, 1};
  std::vector<float> y = x;
  rms_norm(y.data(), w.data(), 4, 1e-6f);
  double inv = 1.0 / std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(y[size_t(i)], w[size_t(i)] * x[size_t(i)] * inv, 1e-6);
  }
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// The indexer scores FP4 keys as the decode state stores them, decoding a
// tile at a time (on every path, and split over threads for a lone query
// row): the selection of every path equals the one computed from keys
// decoded in full, with dot_fixed per (head, key) and the head sum in order.
TEST(Ops, IndexerScoresStoredFp4KeysOnEveryPath) {
  const int64_t heads = 8, dim = 128, keys = 1000, top_k = 37;
  std::mt19937 rng(5);
  std::vector<uint8_t> nibbles(size_t(keys * dim / 2)), scales(size_t(keys * dim / 32));
  for (auto& b : nibbles) b = uint8_t(rng());
  for (auto& s : scales) s = uint8_t(120 + rng() % 10);
  const Fp4RowsView view{nibbles.data(), scales.data(), dim, 32};
  for (int64_t rows : {1, 3}) {
    SCOPED_TRACE("query rows " + std::to_string(rows));
    std::vector<float> q = normal_floats(size_t(rows * heads * dim), 8), weights = normal_floats(size_t(rows * heads), 9);
    for (int64_t i = 0; i < rows * heads; ++i) fp4_round_trip(q.data() + i * dim, dim, 32);
    std::vector<Fp4RowsView> views(size_t(rows), view);
    std::vector<int64_t> visible(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) visible[size_t(r)] = keys - 100 * r;
    // The reference: keys decoded in full.
    std::vector<float> decoded(size_t(keys * dim));
    for (int64_t i = 0; i < keys * dim; ++i) {
      const uint8_t byte = nibbles[size_t(i / 2)];
      decoded[size_t(i)] = e2m1_to_float(uint8_t(i % 2 ? byte >> 4 : byte & 15)) * e8m0_to_float(scales[size_t(i / 32)]);
    }
    for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
      if (!kernel_isa_supported(isa)) continue;
      SCOPED_TRACE(kernel_isa_name(isa));
      std::vector<std::vector<int32_t>> selected;
      backend_by_name(kernel_isa_name(isa))
          .indexer_select({q.data(), weights.data(), rows, heads, dim, views.data(), visible.data(), top_k, &selected});
      // Row r's scores from the fully decoded keys: dot_fixed per (head,
      // key), the head sum in order with head weights `w`. The fast path
      // scores FP4 queries with exact integer block sums
      // (test_indexer_fp4.cpp tests that definition); with these key and
      // query ranges every fp32 lane sum is exact too, so both give these
      // bits, through the tiles, threads and selection of indexer_select.
      auto reference_scores = [&](int64_t r, const std::vector<float>& w) {
        std::vector<float> out(size_t(visible[size_t(r)]));
        for (int64_t i = 0; i < visible[size_t(r)]; ++i) {
          float s = 0.0f;
          for (int64_t h = 0; h < heads; ++h)
            s += std::max(dot_fixed(q.data() + (r * heads + h) * dim, decoded.data() + i * dim, dim, KernelIsa::Scalar),
                          0.0f) *
                 w[size_t(r * heads + h)];
          out[size_t(i)] = s;
        }
        return out;
      };
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> scores = reference_scores(r, weights);
        EXPECT_EQ(selected[size_t(r)], top_k_indices(scores.data(), visible[size_t(r)], top_k)) << "row " << r;
        // The scores themselves, bit for bit (a selection rarely shows an
        // ulp), with weights that make the head sum's order matter.
        std::vector<float> got(scores.size());
        std::vector<float> odd_weights = weights;
        for (size_t h = 0; h < odd_weights.size(); ++h) odd_weights[h] *= h % 2 ? 1e-3f : 1e3f;
        const IndexerSelect problem{q.data(), odd_weights.data(), rows, heads, dim, views.data(), visible.data(),
                                    top_k, &selected};
        cpu::indexer_row_scores(isa, problem, r, got.data());
        const std::vector<float> want = reference_scores(r, odd_weights);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << "row " << r;
      }
    }
  }
}


// Cached FP8 rows decode to the scalar definition's bits on every path
// (every e4m3 code, NaNs included; block scales from tiny to huge; a width
// whose e4m3 part leaves a remainder after 16-value vectors).
TEST(Ops, DecodeFp8RowsGivesTheDefinitionBitsOnEveryPath) {
  for (int64_t nope : {448, 40}) {
    const int64_t width = nope + 64, block = 64, blocks = (nope + block - 1) / block, rows = 300;
    std::mt19937 rng(12);
    std::vector<uint8_t> codes(size_t(rows * nope)), scales(size_t(rows * blocks));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i % 256 == 0 ? rng() : i);
    for (auto& v : scales) v = uint8_t(rng() % 256);
    std::vector<float> rope = normal_floats(size_t(rows * (width - nope)), 13);
    const Fp8RowsView view{codes.data(), scales.data(), rope.data(), width, nope, block};
    const std::vector<int64_t> ids = {299, 0, 7, 7, 150, 1};
    std::vector<float> want(ids.size() * size_t(width));
    for (size_t k = 0; k < ids.size(); ++k) {
      for (int64_t i = 0; i < nope; ++i)
        want[k * size_t(width) + size_t(i)] =
            e4m3_to_float(codes[size_t(ids[k] * nope + i)]) * e8m0_to_float(scales[size_t(ids[k] * blocks + i / block)]);
      for (int64_t i = nope; i < width; ++i)
        want[k * size_t(width) + size_t(i)] = rope[size_t(ids[k] * (width - nope) + i - nope)];
    }
    for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
      if (!kernel_isa_supported(isa)) continue;
      SCOPED_TRACE(std::string(kernel_isa_name(isa)) + ", nope " + std::to_string(nope));
      std::vector<float> got(want.size());
      backend_by_name(kernel_isa_name(isa)).decode_fp8_rows(view, ids.data(), int64_t(ids.size()), got.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
    }
  }
}

}  // namespace
}  // namespace dsv4
