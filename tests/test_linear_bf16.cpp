// The AVX512-BF16 packed GEMM (kernels/cpu/linear_bf16.cpp) against the
// scalar kernels: the same bits for every shape the dot and outer forms
// meet, and the products it must leave to the fp32 kernels (inputs or
// weights small enough for a subnormal sum, which VDPBF16PS flushes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_internal.h"
#include "kernels/cpu/random_linear.h"
#include "linear_variants.h"

namespace dsv4 {
namespace {

using test::spread_floats;

// linear_forward with the scalar kernels, then on AVX-512 with the bf16
// dot products; the same bits.
void expect_bf16_gives_scalar_bits(const Linear& w, const std::vector<float>& x, int64_t n, int64_t row_begin = 0,
                                   int64_t row_end = -1) {
  test::expect_path_gives_scalar_bits(w, x, n, row_begin, row_end, [](const std::function<void()>& product) {
    const bool saved = bf16_dot_enabled();
    set_bf16_dot(true);
    product();
    set_bf16_dot(saved);
  });
}

class LinearBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!bf16_dot_supported()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  }
};

// Dot form (FP4 from 8 tokens, FP8 from 33, to 127; FP8 with 17-32 tokens
// takes the register groups' eight-row kernel) and outer form (128 and
// more); 70 rows leave
// partial row groups; 1040 columns are a chunk of 65 steps (an odd count:
// the padded pair; FP8 only), 2304 two chunks and a partial one.
TEST_F(LinearBf16, PackedFormsGiveScalarBits) {
  for (WeightFormat format : {WeightFormat::FP8_BLOCK128, WeightFormat::FP4_BLOCK32})
    for (int64_t cols : {512, 1040, 2304})
      for (int64_t n : {17, 30, 33, 48, 127, 128, 141, 300}) {
        if (format == WeightFormat::FP4_BLOCK32 && cols % 32) continue;  // FP4 rows are whole 32-wide blocks
        SCOPED_TRACE(std::string(weight_format_name(format)) + ", tokens " + std::to_string(n) + ", columns " +
                     std::to_string(cols));
        RandomLinear w(format, 70, cols, uint32_t(cols + n), 110, 25);
        w.linear.quantize_input = true;
        ASSERT_TRUE(linear_detail::bf16_dot_weights_qualify(w.linear, 0, 70));
        expect_bf16_gives_scalar_bits(w.linear, spread_floats(size_t(n * cols), uint32_t(n), 3.0f), n);
      }
}

// A row slice that starts inside an FP8 128-row scale block; V4.1's
// 32-column input blocks.
TEST_F(LinearBf16, RowSlicesAndInputBlocksGiveScalarBits) {
  RandomLinear w(WeightFormat::FP8_BLOCK128, 300, 1024, 7, 115, 20);
  w.linear.quantize_input = true;
  expect_bf16_gives_scalar_bits(w.linear, spread_floats(size_t(150 * 1024), 9, 1.0f), 150, 40, 290);
  w.linear.input_block = 32;
  expect_bf16_gives_scalar_bits(w.linear, spread_floats(size_t(40 * 1024), 10, 100.0f), 40);
}

// What must take the fp32 kernels: unrounded inputs, weights not exact in
// bf16 or scales that put a weight below 2^-50, inputs below 2^-50. The
// results keep the scalar bits either way.
TEST_F(LinearBf16, ProductsThatCouldFlushTakeTheFp32Kernels) {
  RandomLinear fp8(WeightFormat::FP8_BLOCK128, 256, 512, 3, 110, 20);
  EXPECT_FALSE(linear_detail::bf16_dot_weights_qualify(fp8.linear, 0, 256)) << "inputs not rounded through FP8";
  fp8.linear.quantize_input = true;
  EXPECT_TRUE(linear_detail::bf16_dot_weights_qualify(fp8.linear, 0, 256));
  fp8.scale[fp8.linear.scale_cols + 1] = 127 - 50 + 8;  // row block 1: the smallest e4m3 value times it is 2^-51
  EXPECT_TRUE(linear_detail::bf16_dot_weights_qualify(fp8.linear, 0, 128));
  EXPECT_FALSE(linear_detail::bf16_dot_weights_qualify(fp8.linear, 100, 256));
  expect_bf16_gives_scalar_bits(fp8.linear, spread_floats(size_t(130 * 512), 4, 1.0f), 130);

  RandomLinear fp4(WeightFormat::FP4_BLOCK32, 64, 256, 5, 110, 20);
  fp4.linear.quantize_input = true;
  fp4.scale[17] = 127 - 50;  // 0.5 * 2^-50
  EXPECT_FALSE(linear_detail::bf16_dot_weights_qualify(fp4.linear, 0, 64));
  expect_bf16_gives_scalar_bits(fp4.linear, spread_floats(size_t(40 * 256), 6, 1.0f), 40);

  RandomLinear bf16(WeightFormat::BF16, 64, 256, 5);
  bf16.linear.quantize_input = true;
  EXPECT_FALSE(linear_detail::bf16_dot_weights_qualify(bf16.linear, 0, 64));

  const float tiny[] = {0.0f, -0.0f, std::ldexp(1.0f, -50), std::ldexp(-1.5f, -40)};
  EXPECT_TRUE(linear_detail::bf16_dot_inputs_qualify(tiny, 4));
  const float tinier[] = {1.0f, std::ldexp(1.0f, -51)};
  EXPECT_FALSE(linear_detail::bf16_dot_inputs_qualify(tinier, 2));
  // Inputs around 2^-45 (the FP8 rounding clamps a block's largest magnitude
  // to 1e-4 before it scales, so these round to zero and no rounded input
  // falls below 2^-50; their bits are checked all the same).
  RandomLinear w(WeightFormat::FP8_BLOCK128, 128, 256, 8, 120, 5);
  w.linear.quantize_input = true;
  expect_bf16_gives_scalar_bits(w.linear, spread_floats(size_t(20 * 256), 11, std::ldexp(1.0f, -45)), 20);
  expect_bf16_gives_scalar_bits(w.linear, spread_floats(size_t(130 * 256), 12, std::ldexp(1.0f, -45)), 130);
}

}  // namespace
}  // namespace dsv4
