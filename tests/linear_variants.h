// What the tests of an AVX-512 product path that only some products take
// (VDPBF16PS, AMX) share: inputs whose FP8 rounding meets every e4m3 code,
// and the comparison of that path's products with the scalar path's.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear.h"

namespace dsv4::test {

// n normal floats times `magnitude`, spread over exponents: within a
// 128-value FP8 block the small values land on e4m3's subnormal codes;
// some values are exact zeros.
inline std::vector<float> spread_floats(size_t n, uint32_t seed, float magnitude) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) {
    v = nd(rng) * magnitude;
    if (rng() % 7 == 0) v *= std::ldexp(1.0f, -int(rng() % 12));
    if (rng() % 31 == 0) v = 0.0f;
  }
  return x;
}

// linear_forward with the scalar kernels, then on AVX-512 inside
// `with_path` (which switches the path on, runs the product it is given and
// restores the setting); expects the same bits.
inline void expect_path_gives_scalar_bits(const Linear& w, const std::vector<float>& x, int64_t n, int64_t row_begin,
                                          int64_t row_end,
                                          const std::function<void(const std::function<void()>&)>& with_path) {
  const int64_t rows = (row_end < 0 ? w.rows : row_end) - row_begin;
  const KernelIsa saved_isa = active_kernel_isa();
  std::vector<float> scalar(size_t(n * rows), -1.0f), path(size_t(n * rows), -2.0f);
  set_kernel_isa(KernelIsa::Scalar);
  linear_forward(w, x.data(), n, scalar.data(), row_begin, row_end);
  set_kernel_isa(KernelIsa::Avx512);
  with_path([&] { linear_forward(w, x.data(), n, path.data(), row_begin, row_end); });
  set_kernel_isa(saved_isa);
  size_t differ = 0;
  for (size_t i = 0; i < scalar.size(); ++i) differ += std::memcmp(&scalar[i], &path[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "of " << scalar.size() << " outputs";
}

}  // namespace dsv4::test
