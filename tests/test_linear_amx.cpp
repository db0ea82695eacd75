// The AMX packed GEMM (kernels/cpu/linear_amx.cpp) against the scalar
// kernels: the same bits for the shapes it meets (token groups of 16 with a
// partial last one, two groups at a time and an odd one left, row groups of
// 32 with partial ones, chunks of one to four segments), and the products
// it must leave to the other kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// linear_forward with the scalar kernels, then on AVX-512 with AMX; the same
// bits, and `amx_runs` says whether the AMX kernel must have run.
void expect_amx_gives_scalar_bits(const Linear& w, const std::vector<float>& x, int64_t n, bool amx_runs,
                                  int64_t row_begin = 0, int64_t row_end = -1) {
  SCOPED_TRACE(std::string(weight_format_name(w.format)) + ", " + std::to_string(n) + " tokens, " +
               std::to_string(w.cols) + " columns");
  test::expect_path_gives_scalar_bits(w, x, n, row_begin, row_end, [&](const std::function<void()>& product) {
    const bool saved = amx_enabled();
    set_amx(true);
    const int64_t before = linear_detail::amx_products();
    product();
    EXPECT_EQ(linear_detail::amx_products() - before, amx_runs ? 1 : 0);
    set_amx(saved);
  });
}

class LinearAmx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!amx_supported()) GTEST_SKIP() << "this CPU has no AMX-BF16 (or the kernel refused the tile data)";
  }
};

// 70 rows: two row groups of 32 and a partial one; 512 columns: one chunk of
// two segments; 2304: two whole chunks and one of a single segment; 2560:
// two and one of two. 16-48 tokens: one to three groups; 141 and 300 the
// last group partial.
TEST_F(LinearAmx, PackedProductsGiveScalarBits) {
  for (WeightFormat format : {WeightFormat::FP8_BLOCK128, WeightFormat::FP4_BLOCK32})
    for (int64_t cols : {512, 2304, 2560})
      for (int64_t n : {16, 17, 32, 33, 48, 141, 300}) {
        SCOPED_TRACE(std::string(weight_format_name(format)) + ", tokens " + std::to_string(n) + ", columns " +
                     std::to_string(cols));
        RandomLinear w(format, 70, cols, uint32_t(cols + n), 110, 25);
        w.linear.quantize_input = true;
        expect_amx_gives_scalar_bits(w.linear, spread_floats(size_t(n * cols), uint32_t(n), 3.0f), n, true);
      }
}

// A row slice that starts inside an FP8 128-row scale block; V4.1's
// 32-column input blocks; rows past one task (kRowBlock).
TEST_F(LinearAmx, RowSlicesAndInputBlocksGiveScalarBits) {
  RandomLinear w(WeightFormat::FP8_BLOCK128, 300, 1024, 7, 115, 20);
  w.linear.quantize_input = true;
  expect_amx_gives_scalar_bits(w.linear, spread_floats(size_t(150 * 1024), 9, 1.0f), 150, true, 40, 290);
  w.linear.input_block = 32;
  expect_amx_gives_scalar_bits(w.linear, spread_floats(size_t(40 * 1024), 10, 100.0f), 40, true);
}

// What must take the other kernels (same bits): fewer than kAmxMinTokens
// tokens, unrounded inputs, a width that is not whole segments, a scale
// that puts a weight below 2^-50.
TEST_F(LinearAmx, ProductsThatCannotTakeTilesTakeTheOtherKernels) {
  RandomLinear fp8(WeightFormat::FP8_BLOCK128, 256, 512, 3, 110, 20);
  fp8.linear.quantize_input = true;
  expect_amx_gives_scalar_bits(fp8.linear, spread_floats(size_t(15 * 512), 1, 1.0f), 15, false);
  fp8.linear.quantize_input = false;
  expect_amx_gives_scalar_bits(fp8.linear, spread_floats(size_t(40 * 512), 2, 1.0f), 40, false);
  fp8.linear.quantize_input = true;
  fp8.scale[fp8.linear.scale_cols + 1] = 127 - 50 + 8;  // row block 1: the smallest e4m3 value times it is 2^-51
  expect_amx_gives_scalar_bits(fp8.linear, spread_floats(size_t(40 * 512), 3, 1.0f), 40, false);
  expect_amx_gives_scalar_bits(fp8.linear, spread_floats(size_t(40 * 512), 3, 1.0f), 40, true, 0, 128);

  RandomLinear fp4(WeightFormat::FP4_BLOCK32, 64, 2400, 5, 110, 20);  // 2400: not whole segments
  fp4.linear.quantize_input = true;
  expect_amx_gives_scalar_bits(fp4.linear, spread_floats(size_t(40 * 2400), 6, 1.0f), 40, false);

  // (Inputs below 2^-50 cannot reach the kernels: the FP8 rounding clamps
  // a block's largest magnitude to 1e-4 before it scales, so what it keeps
  // is 2^-31 or more; bf16_dot_inputs_qualify stays as a guard.)
  RandomLinear w(WeightFormat::FP8_BLOCK128, 128, 256, 8, 120, 5);
  w.linear.quantize_input = true;
  expect_amx_gives_scalar_bits(w.linear, spread_floats(size_t(130 * 256), 12, 1.0f), 130, true);
}

}  // namespace
}  // namespace dsv4
