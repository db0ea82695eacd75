// The weight products (linear_forward) against the scalar reference: the
// canonical reduction order gives the same bits on every SIMD path, kernel
// shape, batch, thread count and row slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_internal.h"
#include "kernels/cpu/random_linear.h"
#include "random_floats.h"
#include "simd_paths.h"

namespace dsv4 {
namespace {

using test::expect_simd_gives_scalar_bits;
using test::normal_floats;

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

// The SIMD paths follow the canonical reduction order exactly: same bits.
// Tokens: register groups of 1-4 (FP4 below 8, F32 below 17, FP8 to 32 and
// BF16 to 64 in balanced blocks of at most 16 tokens), the dot form's packed
// groups of 6 (to 127), the outer form's groups of 12 (from 128). 70 rows leave
// remainders after row groups of 4, 16 and 32 and row blocks of 64; 2304
// columns are two chunks and a partial one.
TEST_P(LinearFormats, SimdPathsGiveScalarBits) {
  for (int64_t cols : {512, 2304})
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 10, 13, 16, 17, 33, 64, 65, 127, 128, 141, 200}) {
      SCOPED_TRACE("tokens " + std::to_string(n) + ", columns " + std::to_string(cols));
      const int64_t rows = 70;
      RandomLinear w = random_linear(GetParam(), rows, cols, 21);
      const std::vector<float> x = normal_floats(size_t(n * cols), 4);
      expect_simd_gives_scalar_bits(size_t(n * rows), [&](float* y) { linear_forward(w.linear, x.data(), n, y); });
    }
}

// The FP4 register path with VDPBF16PS (linear_fp4_pairs.cpp) runs on
// FP8-rounded inputs (expert matrices): 1-7 tokens, rows that leave
// remainders after the four streams, a partial last chunk (in 2400
// columns, three blocks after the last whole cache line); with
// a block scale below 2^-50's bound in one row (its row group takes the
// fp32 kernel) and with a block of inputs below 2^-50 (the whole product
// does). expect_simd_gives_scalar_bits runs AVX-512 with the bf16 kernels
// on and off, and without the VBMI kernels (FP4 then takes the fp32 one).
TEST(Linear, Fp4StepPairsGiveScalarBits) {
  const int64_t rows = 70;
  for (int64_t cols : {2304, 2400})
    for (int variant = 0; variant < 3; ++variant) {
      RandomLinear w(WeightFormat::FP4_BLOCK32, rows, cols, 41, 100, 40);
      w.linear.quantize_input = true;
      if (variant == 1) w.scale[size_t(9 * w.linear.scale_cols + 5)] = 60;
      for (int64_t n : {1, 2, 3, 4, 5, 7}) {
        SCOPED_TRACE("columns " + std::to_string(cols) + ", variant " + std::to_string(variant) + ", tokens " +
                     std::to_string(n));
        std::vector<float> x = normal_floats(size_t(n * cols), 12);
        if (variant == 2)
          for (int64_t c = 256; c < 384; ++c) x[size_t(c)] = 1e-20f * x[size_t(c)];
        expect_simd_gives_scalar_bits(size_t(n * rows), [&](float* y) { linear_forward(w.linear, x.data(), n, y); });
      }
    }
}

// The FP4 pairs kernel keeps its lanes in a permuted order (see
// linear_fp4_pairs.cpp) and must fold them in the storage order, whose
// fixed tree decides what survives a cancellation. Every weight 1.0 and
// three nonzero inputs, each in its own 128-column block (so FP8 rounding
// keeps them): 2^60 in storage lane 0, 1 in lane 4 and -2^60 in lane 8.
// In storage order lanes 0 and 8 cancel first and the 1 survives; in the
// kernel's order the 1 would meet 2^60 first and be lost.
TEST(Linear, Fp4PairLanesFoldInStorageOrder) {
  const int64_t rows = 8, cols = 512;
  RandomLinear w(WeightFormat::FP4_BLOCK32, rows, cols, 43);
  w.linear.quantize_input = true;
  std::fill(w.data.begin(), w.data.end(), uint8_t(0x22));  // e2m1 code 2: 1.0, both nibbles
  std::fill(w.scale.begin(), w.scale.end(), uint8_t(127));
  for (int64_t n : {1, 2}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    std::vector<float> x(size_t(n * cols), 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      // Storage lane j of a block holds its columns 2j and 2j + 1.
      x[size_t(t * cols + 0)] = 0x1p60f;          // block 0, lane 0
      x[size_t(t * cols + 256 + 8)] = 1.0f;       // block 8, lane 4
      x[size_t(t * cols + 128 + 16)] = -0x1p60f;  // block 4, lane 8
    }
    const std::vector<float> y = expect_simd_gives_scalar_bits(
        size_t(n * rows), [&](float* out) { linear_forward(w.linear, x.data(), n, out); });
    for (float v : y) EXPECT_EQ(1.0f, v);
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
    for (int64_t b = 0; b < 32; ++b)
      w.scale[size_t(r * w.linear.scale_cols + b)] = uint8_t(std::min<int64_t>(254, 32 * r + b));
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
// go into a copy of the input (AVX-512 and AVX2; the AVX-512 path also for
// three tokens, kFp8PrescaledMaxTokens), except
// for the spans whose scale would push an input out of the normal floats
// or past the fp16 decoding's range. Scales from 0 to 250 per (block,
// span), a row range that starts and ends inside a block, and an input with
// a huge value (few prescalable spans) all give the scalar bits.
TEST(Linear, Fp8OneTokenPrescaledBlocksGiveScalarBits) {
  // Two threads: pieces of 256 rows (of 248 in the inner range), so most
  // hold whole blocks (with many threads, pieces shrink below a block).
  const int saved_threads = compute_threads();
  set_compute_threads(2);
  const int64_t rows = 2048, cols = 256;
  RandomLinear w(WeightFormat::FP8_BLOCK128, rows, cols, 31);
  const uint8_t scales[] = {0, 90, 119, 127, 200, 246, 247, 250, 5, 140, 119, 60};
  for (size_t k = 0; k < w.scale.size(); ++k) w.scale[k] = scales[k % 12];
  for (int64_t n : {1, 3}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    std::vector<float> x = normal_floats(size_t(n * cols), 9);
    for (bool huge : {false, true}) {
      SCOPED_TRACE(huge ? "an input of 1e30" : "normal inputs");
      if (huge) x[size_t((n - 1) * cols + 100)] = 1e30f;
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, rows}, {32, 2016}, {128, 1920}}) {
        SCOPED_TRACE("rows " + std::to_string(begin) + "-" + std::to_string(end));
        expect_simd_gives_scalar_bits(size_t(n * (end - begin)),
                                      [&](float* y) { linear_forward(w.linear, x.data(), n, y, begin, end); });
      }
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

// Inputs read with a stride (the grouped output projection reads each group
// of heads in place) give the bits of the same inputs packed, on every path:
// the register kernels (also fused in linear_forward_many), both packed
// forms, AMX and the exact numerics. The gaps between the tokens hold NaN,
// so reading one would show.
TEST_P(LinearFormats, InputStrideGivesPackedBits) {
  const int64_t rows = 70, cols = 512, x_stride = cols + 48;
  RandomLinear w = random_linear(GetParam(), rows, cols, 24);
  for (bool quantize : {false, true}) {
    w.linear.quantize_input = quantize;
    for (int64_t n : {1, 3, 17, 33, 130}) {
      SCOPED_TRACE("tokens " + std::to_string(n) + (quantize ? ", FP8-rounded inputs" : ""));
      const std::vector<float> packed = normal_floats(size_t(n * cols), 7);
      std::vector<float> strided(size_t(n * x_stride), NAN);
      for (int64_t t = 0; t < n; ++t) std::copy_n(packed.begin() + t * cols, cols, strided.begin() + t * x_stride);
      std::vector<float> want(size_t(n * rows));
      linear_forward(w.linear, packed.data(), n, want.data());
      const std::vector<float> scalar = expect_simd_gives_scalar_bits(
          size_t(n * rows), [&](float* y) { linear_forward(w.linear, strided.data(), n, y, 0, -1, -1, x_stride); });
      EXPECT_EQ(0, std::memcmp(scalar.data(), want.data(), want.size() * 4));
      // Fused with another product in one call.
      std::vector<float> y(size_t(n * rows)), other(size_t(n * rows));
      const LinearProduct products[] = {{&w.linear, packed.data(), n, other.data()},
                                        {&w.linear, strided.data(), n, y.data(), 0, -1, -1, x_stride}};
      linear_forward_many(products, 2);
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), want.size() * 4));
      std::vector<float> exact_packed(size_t(n * rows)), exact_strided(size_t(n * rows));
      linear_forward_exact(active_kernel_isa(), w.linear, packed.data(), n, exact_packed.data());
      linear_forward_exact(active_kernel_isa(), w.linear, strided.data(), n, exact_strided.data(), 0, -1, -1, x_stride);
      EXPECT_EQ(0, std::memcmp(exact_strided.data(), exact_packed.data(), want.size() * 4));
    }
  }
}

// FP8 rows that fill 128-row blocks go in groups that share their scales,
// and a product of 1-4 tokens then puts each block's scales into a copy of
// its inputs where that is exact. The bits stay the scalar ones: for inputs
// near both ends of the float range (where a scaled input would overflow
// or lose bits, the scale goes into the weights again), for row ranges
// that start inside a block, and for more tokens (prescaled up to
// kFp8PrescaledMaxTokens, not beyond; 5 and 8 tokens as two whole-row
// passes, kFp8WholeRowsMaxTokens).
TEST(Linear, Fp8SharedScalesGiveScalarBits) {
  const int64_t rows = 428, cols = 384;  // three whole row blocks
  RandomLinear w = random_linear(WeightFormat::FP8_BLOCK128, rows, cols, 24);
  for (auto& b : w.data) b &= 0xb7;  // |weight| < scale: 3e36 inputs make finite products
  // Row blocks 1 and 2 scale the inputs down and up; block 0 keeps
  // random_linear's extremes (2^120, 2^-127), which never prescale.
  const uint8_t scales[] = {100, 110, 119, 120, 127, 129};
  w.scale[2] = 119;
  for (size_t i = 3; i < w.scale.size(); ++i) w.scale[i] = scales[(i - 3) % 6];
  for (int64_t n : {1, 2, 4, 5, 8})
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
// off, and without the VBMI byte tables (the chunks then take the fp16
// decoding).
TEST(Linear, Fp8EightRowsGiveScalarBits) {
  const int saved_threads = compute_threads();
  set_compute_threads(2);
  // Two chunks and a partial one (of 256 columns, or of 288: the byte-table
  // decoding's 64 columns at a time, then a 32-column tail).
  for (int64_t cols : {2304, 2336}) {
    const int64_t rows = 768;  // six row blocks
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
          SCOPED_TRACE(std::string(tiny ? "tiny inputs, " : "") + "columns " + std::to_string(cols) + ", tokens " +
                       std::to_string(n) + ", rows from " + std::to_string(row_begin));
          std::vector<float> x = normal_floats(size_t(n * cols), 17);
          if (tiny)
            for (int64_t c = 0; c < 128; ++c) x[size_t(cols + c)] *= 1e-20f;
          expect_simd_gives_scalar_bits(size_t(n * (rows - row_begin)),
                                        [&](float* y) { linear_forward(w.linear, x.data(), n, y, row_begin, rows); });
        }
  }
  set_compute_threads(saved_threads);
}

// FP8 rows of whole 128-row blocks against 9-16 inputs in fp32 (V4's wo_a,
// whose inputs are not FP8-rounded; any FP8 product where VDPBF16PS is off)
// go eight at a time, each chunk decoded once into bf16
// (dot8_fp8_as_bf16_avx512) where every scale of the block lies in [10,
// 246] (kBf16ExactMinFp8Scale, kMaxHalfPathScale): same bits. Scale 10 with
// the smallest codes (subnormal e4m3 among them, both signs) is the edge
// where every weight is still a normal float; blocks with a span at 9 or
// 247 keep the four-row kernel; 2320 columns (not a multiple of 32) keep
// it for every block. With AVX512-VBMI the chunks are decoded by byte
// tables, 64 columns at a time (2336 columns: a 32-column tail by the fp16
// decoding); expect_simd_gives_scalar_bits also runs without them.
TEST(Linear, Fp8EightRowsThroughBf16GiveScalarBits) {
  const int saved_threads = compute_threads();
  set_compute_threads(2);
  for (int64_t cols : {2304, 2320, 2336}) {  // two chunks and a partial one
    const int64_t rows = 640;          // five row blocks
    RandomLinear w(WeightFormat::FP8_BLOCK128, rows, cols, 47);
    const int64_t spans = w.linear.scale_cols;
    const uint8_t block_scales[5][2] = {{10, 246}, {9, 120}, {120, 247}, {100, 140}, {10, 10}};
    for (int64_t b = 0; b < 5; ++b)
      for (int64_t k = 0; k < spans; ++k) w.scale[size_t(b * spans + k)] = block_scales[b][k % 2];
    for (int64_t r : {0, 1, 130, 520, 639})
      for (int64_t i = 0; i < cols; ++i) w.data[size_t(r * cols + i)] = uint8_t((i % 16) | (i & 16 ? 0x80 : 0));
    for (int64_t i = 256 * cols; i < 384 * cols; ++i) w.data[size_t(i)] &= 0xb7;  // finite under scale 247
    for (int64_t n : {9, 12, 16})
      for (int64_t row_begin : {0, 100}) {
        SCOPED_TRACE("columns " + std::to_string(cols) + ", tokens " + std::to_string(n) + ", rows from " +
                     std::to_string(row_begin));
        const std::vector<float> x = normal_floats(size_t(n * cols), 19);
        expect_simd_gives_scalar_bits(size_t(n * (rows - row_begin)),
                                      [&](float* y) { linear_forward(w.linear, x.data(), n, y, row_begin, rows); });
      }
  }
  set_compute_threads(saved_threads);
}

// FP8 rows against 1-4 FP8-rounded tokens go four at a time with VDPBF16PS
// where the CPU also has AVX512-VBMI (dot4_fp8_pairs): the rows walk as
// four long streams whose rows lie in different 128-row blocks, each
// decoded with its own block's scales. Same bits for blocks whose scales
// lie in [86, 246] (kBf16DotMinFp8Scale, kMaxHalfPathScale; both edges
// here) and for those that send their rows' groups to the fp32 kernel
// (scales 0, 9 and 60), for a huge input (1e30: infinite products on
// both) and for a tiny one (1e-20: the whole product on the fp32 kernel).
// Rows with every small code (subnormal e4m3 and -0 among them) and both
// signs; rows from 100 start inside a block, and 770 rows leave a tail
// that does not split in four streams. 2304 columns are whole segments (the
// one-token kernel's straight form), 2368 end in a partial one (its loop).
TEST(Linear, Fp8FourRowPairsGiveScalarBits) {
  const int saved_threads = compute_threads();
  set_compute_threads(2);
  const int64_t rows = 770;
  for (int64_t cols : {2304, 2368}) {  // two chunks and a partial one
    SCOPED_TRACE("columns " + std::to_string(cols));
    RandomLinear w(WeightFormat::FP8_BLOCK128, rows, cols, 47);
    w.linear.quantize_input = true;
    const int64_t spans = w.linear.scale_cols;
    const uint8_t block_scales[7][2] = {{120, 127}, {0, 0}, {100, 246}, {9, 130}, {86, 140}, {160, 160}, {127, 60}};
    for (int64_t b = 0; b < 7; ++b)
      for (int64_t k = 0; k < spans; ++k) w.scale[size_t(b * spans + k)] = block_scales[b][k % 2];
    for (int64_t r : {0, 1, 300, 545, 700})
      for (int64_t i = 0; i < cols; ++i) w.data[size_t(r * cols + i)] = uint8_t((i % 16) | (i & 16 ? 0x80 : 0));
    for (int64_t i = 256 * cols; i < 384 * cols; ++i) w.data[size_t(i)] &= 0xb7;  // finite under scale 246
    for (const char* inputs : {"normal", "tiny", "huge"})
      for (int64_t n : {1, 2, 3, 4})
        for (int64_t row_begin : {0, 100}) {
          SCOPED_TRACE(std::string(inputs) + " inputs, tokens " + std::to_string(n) + ", rows from " +
                       std::to_string(row_begin));
          std::vector<float> x = normal_floats(size_t(n * cols), 19);
          if (std::string(inputs) == "tiny")
            for (int64_t c = 0; c < 128; ++c) x[size_t((n - 1) * cols + c)] *= 1e-20f;
          if (std::string(inputs) == "huge") x[100] = 1e30f;
          expect_simd_gives_scalar_bits(size_t(n * (rows - row_begin)),
                                        [&](float* y) { linear_forward(w.linear, x.data(), n, y, row_begin, rows); });
        }
  }
  set_compute_threads(saved_threads);
}

// A stream of the four-row kernel runs on through several 128-row blocks
// (one thread: four pieces of five blocks, streams of 160 rows), and the
// VDPBF16PS kernel may take a group only while all four of its rows' blocks
// have scales in its range. Every fifth block has scale 9 (products too
// small for the bf16 kernel, which flushes subnormals): the last stream of
// a piece enters it while the other three are still in blocks that
// qualify, so a group that kept a stream's first verdict would lose bits.
TEST(Linear, Fp8FourRowPairsCheckEveryBlockOfAStream) {
  const int saved_threads = compute_threads();
  set_compute_threads(1);
  const int64_t rows = 20 * 128, cols = 256;
  RandomLinear w(WeightFormat::FP8_BLOCK128, rows, cols, 53);
  w.linear.quantize_input = true;
  const int64_t spans = w.linear.scale_cols;
  for (int64_t b = 0; b < rows / 128; ++b)
    for (int64_t k = 0; k < spans; ++k) w.scale[size_t(b * spans + k)] = b % 5 == 4 ? 9 : 127;
  for (int64_t n : {1, 2, 3, 4}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    const std::vector<float> x = normal_floats(size_t(n * cols), 23);
    expect_simd_gives_scalar_bits(size_t(n * rows), [&](float* y) { linear_forward(w.linear, x.data(), n, y); });
  }
  set_compute_threads(saved_threads);
}

// linear_forward_many (the routed experts of a step in one batch of
// products) gives each product the bits of its own linear_forward call, on
// every path: few-token products share one parallel region, many-token
// ones (packed GEMMs) run as single calls. Matrices of every format, rows
// that do not split in four streams per thread, and an empty product;
// then row ranges written with a stride (a grouped projection's slices).
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

// Row ranges of one matrix, each against its own inputs and written into
// its columns of a shared output (as V4's grouped wo_a slices are): the
// bits of linear_forward on each range, whatever the batch. Ranges that
// start inside an FP8 128-row block and ones that end past a four-stream
// split; the rest of each output row is left alone.
TEST(Linear, ManyRowRangesGiveEachRangesBits) {
  const int64_t rows = 448, stride = 460;
  const std::pair<int64_t, int64_t> ranges[] = {{0, 128}, {128, 200}, {200, 333}, {333, 448}};
  for (WeightFormat format :
       {WeightFormat::FP8_BLOCK128, WeightFormat::FP4_BLOCK32, WeightFormat::BF16, WeightFormat::F32}) {
    RandomLinear w = random_linear(format, rows, 512, 51);
    w.linear.quantize_input = format == WeightFormat::FP8_BLOCK128 || format == WeightFormat::FP4_BLOCK32;
    for (int64_t n : {int64_t(1), int64_t(4), int64_t(16), int64_t(40)}) {
      std::vector<std::vector<float>> x;
      for (size_t g = 0; g < std::size(ranges); ++g) x.push_back(normal_floats(size_t(n * 512), uint32_t(60 + g)));
      const KernelIsa saved = active_kernel_isa();
      for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
        if (!kernel_isa_supported(isa)) continue;
        SCOPED_TRACE(std::string(weight_format_name(format)) + " n=" + std::to_string(n) + " " + kernel_isa_name(isa));
        set_kernel_isa(isa);
        std::vector<float> one(size_t(n * stride), -1.0f), many(size_t(n * stride), -1.0f);
        std::vector<LinearProduct> products;
        for (size_t g = 0; g < std::size(ranges); ++g) {
          const auto [begin, end] = ranges[g];
          linear_forward(w.linear, x[g].data(), n, one.data() + begin, begin, end, stride);
          products.push_back({&w.linear, x[g].data(), n, many.data() + begin, begin, end, stride});
        }
        linear_forward_many(products.data(), products.size());
        EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * 4));
        for (int64_t t = 0; t < n; ++t)
          for (int64_t o = rows; o < stride; ++o) EXPECT_EQ(-1.0f, many[size_t(t * stride + o)]);
      }
      set_kernel_isa(saved);
    }
  }
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

}  // namespace
}  // namespace dsv4
