// The attention's softmax (kernels/cpu/softmax.h): exp_fixed and the
// softmax with a sink give the scalar definition's bits on every path, and
// stay close to the exact values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "kernels/cpu/softmax.h"

namespace dsv4 {
namespace {

std::vector<KernelIsa> paths() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512})
    if (kernel_isa_supported(isa)) out.push_back(isa);
  return out;
}

// Distance in units in the last place between two positive floats.
int64_t ulps(float a, float b) { return std::llabs(int64_t(float_to_bits(a)) - int64_t(float_to_bits(b))); }

TEST(Softmax, ExpFixedIsCloseToExpAndRangesAreDefined) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> range(-87.3f, 88.0f);
  int64_t worst = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = range(rng);
    const float want = float(std::exp(double(x)));
    if (want < std::numeric_limits<float>::min()) continue;  // subnormal results: see below
    worst = std::max(worst, ulps(exp_fixed(x), want));
  }
  EXPECT_LE(worst, 2);
  EXPECT_EQ(exp_fixed(0.0f), 1.0f);
  EXPECT_EQ(exp_fixed(-0.0f), 1.0f);
  EXPECT_EQ(exp_fixed(-87.4f), 0.0f);
  EXPECT_EQ(exp_fixed(-INFINITY), 0.0f);
  EXPECT_EQ(exp_fixed(INFINITY), exp_fixed(88.0f));
  EXPECT_TRUE(std::isnan(exp_fixed(NAN)));
  // The smallest results are subnormal products, rounded once more.
  EXPECT_NEAR(exp_fixed(-87.33f), std::exp(double(-87.33f)), 2e-45);
}

TEST(Softmax, ExpFixedHasTheScalarBitsOnEveryPath) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> range(-100.0f, 100.0f);
  std::vector<float> x(100003);
  for (float& v : x) v = range(rng);
  // The edges of the defined range and the special values.
  const float special[] = {0.0f, -0.0f, -87.33654f, -87.33653f, -87.33655f, 88.0f, 88.1f, -INFINITY, INFINITY, NAN,
                           1e-30f, -1e-30f, 0.5f * 0.693359375f, -0.5f * 0.693359375f};
  std::copy(std::begin(special), std::end(special), x.begin());
  // Subnormal results near the lower end, and the rounding of n near +-0.5.
  for (int i = 0; i < 5000; ++i) x[size_t(100 + i)] = -87.4f + float(i) * 1e-4f;
  for (int i = 0; i < 5000; ++i) x[size_t(5100 + i)] = -0.36f + float(i) * 1.5e-4f;
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = exp_fixed(x[i]);
  for (KernelIsa isa : paths()) {
    SCOPED_TRACE(kernel_isa_name(isa));
    std::vector<float> got(x.size());
    exp_fixed_rows(x.data(), int64_t(x.size()), got.data(), isa);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(float_to_bits(got[i]), float_to_bits(want[i])) << "x = " << x[i];
  }
}

// The definition written out: scaled logits, their maximum with the sink,
// exponentials summed in 16 lanes and folded, the sink's term, divisions.
std::vector<float> softmax_definition(std::vector<float> x, float scale, float sink) {
  float top = sink;
  for (float& v : x) top = std::max(top, v *= scale);
  float lanes[16] = {};
  for (size_t j = 0; j < x.size(); ++j) lanes[j % 16] += (x[j] = exp_fixed(x[j] - top));
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  const float denominator = lanes[0] + exp_fixed(sink - top);
  for (float& v : x) v /= denominator;
  return x;
}

TEST(Softmax, WithSinkHasTheDefinitionBitsOnEveryPathAndIsAccurate) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int64_t n : {1, 5, 8, 15, 16, 17, 24, 33, 640, 1001})
    for (float sink : {-3.0f, 0.5f, 40.0f}) {
      SCOPED_TRACE(std::to_string(n) + " logits, sink " + std::to_string(sink));
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = nd(rng);
      const float scale = 1.0f / std::sqrt(512.0f) * 8.0f;
      const std::vector<float> want = softmax_definition(x, scale, sink);
      for (KernelIsa isa : paths()) {
        SCOPED_TRACE(kernel_isa_name(isa));
        std::vector<float> got = x;
        softmax_with_sink(got.data(), n, scale, sink, isa);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), size_t(n) * 4));
      }
      // Against the softmax in double: the float subtraction x - max
      // (relative error |x - max| 2^-24 in the result) and a few roundings.
      double top = sink, denominator = 0.0;
      for (float v : x) top = std::max(top, double(v * scale));
      for (float v : x) denominator += std::exp(double(v * scale) - top);
      denominator += std::exp(double(sink) - top);
      for (int64_t j = 0; j < n; ++j) {
        const double argument = double(x[size_t(j)] * scale) - top, exact = std::exp(argument) / denominator;
        EXPECT_NEAR(want[size_t(j)], exact, (std::fabs(argument) + 8.0) * 0x1p-23 * exact) << j;
      }
    }
}


TEST(Softmax, ExpFixedF64IsCloseToExpAndHasTheScalarBitsOnEveryPath) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<double> range(-708.0, 709.0);
  int64_t worst = 0;
  for (int i = 0; i < 1000000; ++i) {
    const double x = range(rng), got = exp_fixed_f64(x), want = std::exp(x);
    int64_t a, b;
    std::memcpy(&a, &got, 8);
    std::memcpy(&b, &want, 8);
    worst = std::max<int64_t>(worst, std::llabs(a - b));
  }
  EXPECT_LE(worst, 2);
  EXPECT_EQ(exp_fixed_f64(0.0), 1.0);
  EXPECT_EQ(exp_fixed_f64(-708.5), 0.0);
  EXPECT_EQ(exp_fixed_f64(-INFINITY), 0.0);
  EXPECT_EQ(exp_fixed_f64(INFINITY), exp_fixed_f64(709.0));
  EXPECT_TRUE(std::isnan(exp_fixed_f64(NAN)));

  // Logit-like rows (a vocabulary's worth and odd lengths), shifted by
  // their maximum as the sampler does, plus the range edges.
  std::normal_distribution<float> nd(0.0f, 6.0f);
  for (int64_t n : {1, 7, 8, 9, 15, 129280}) {
    SCOPED_TRACE(std::to_string(n) + " values");
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = nd(rng);
    if (n >= 9) x[3] = -1000.0f, x[5] = NAN, x[7] = 700.0f;
    double top = 0;
    for (float v : x) top = std::max(top, double(v));
    std::vector<double> want_terms(x.size());
    double lanes[8] = {};
    for (size_t j = 0; j < x.size(); ++j) lanes[j % 8] += (want_terms[j] = exp_fixed_f64(double(x[j]) - top));
    for (int w = 4; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
    for (KernelIsa isa : paths()) {
      SCOPED_TRACE(kernel_isa_name(isa));
      std::vector<double> terms(x.size());
      const double sum = exp_sum_f64(x.data(), n, top, terms.data(), isa);
      EXPECT_EQ(0, std::memcmp(&sum, &lanes[0], 8));
      const double without_terms = exp_sum_f64(x.data(), n, top, nullptr, isa);
      EXPECT_EQ(0, std::memcmp(&sum, &without_terms, 8));
      ASSERT_EQ(0, std::memcmp(terms.data(), want_terms.data(), x.size() * 8));
    }
  }
}

// The sampler's maximum and argmax against std::max_element: ties, signed
// zeros, NaNs anywhere (at 0 std::max_element keeps it), odd lengths.
TEST(Softmax, MaxAndFirstMaxIndexMatchTheStandardLibraryOnEveryPath) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-3, 3);
  for (int64_t n : {1, 2, 7, 8, 9, 16, 17, 33, 1000}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = float(small(rng));  // many ties
      if (trial % 4 == 1) x[size_t(rng() % n)] = NAN;
      if (trial % 4 == 2) x[0] = NAN;
      if (trial % 4 == 3)
        for (float& v : x) v = v > 0 ? 0.0f : (v < 0 ? -0.0f : v);
      const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
      float want_max = -INFINITY;
      for (float v : x) want_max = std::max(want_max, v);
      for (KernelIsa isa : paths()) {
        SCOPED_TRACE(std::string(kernel_isa_name(isa)) + ", " + std::to_string(n) + " values, trial " +
                     std::to_string(trial));
        EXPECT_EQ(first_max_index(x.data(), n, isa), want);
        EXPECT_EQ(max_value(x.data(), n, isa), want_max);  // +0 == -0
      }
    }
  }
}

}  // namespace
}  // namespace dsv4
