// Numeric building blocks and the model's other operations against scalar
// references (the weight products: test_linear.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vector_ops.h"
#include "kernels/rope.h"
#include "random_floats.h"
#include "simd_paths.h"

namespace dsv4 {
namespace {

using test::expect_simd_gives_scalar_bits;
using test::normal_floats;

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

// round_to_e2m1 is bit arithmetic; the plain formula (v / step through
// nearbyint) is the reference, signs and zeros included. Then the whole round
// trip against the formula per block (maximum, scale, quotient, rounding),
// on blocks with ties, negative zeros, subnormals, NaN and a partial block.
TEST(Numeric, Fp4RoundingMatchesFormula) {
  auto formula = [](float v) {
    const float a = std::fabs(v), step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
    return std::nearbyint(v / step) * step;
  };
  for (uint32_t bits = 0; bits <= float_to_bits(6.0f); bits += 61)
    for (float v : {bits_to_float(bits), -bits_to_float(bits)})
      ASSERT_EQ(float_to_bits(round_to_e2m1(v)), float_to_bits(formula(v))) << v;
  for (float tie : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f})
    for (float v : {tie, -tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 8.0f)})
      ASSERT_EQ(float_to_bits(round_to_e2m1(v)), float_to_bits(formula(v))) << v;

  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(32 * 40 + 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, int(i / 32 % 13) * 9 - 60);
  x[3] = -0.0f;
  x[40] = 0.25f;  // ties in a block of amax 6 (scale 1)
  x[41] = 6.0f;
  x[42] = -1.25f;
  x[43] = 2.5f;
  x[100] = std::numeric_limits<float>::denorm_min();
  x[200] = NAN;
  for (int i = 0; i < 32; ++i) x[32 * 20 + i] = std::ldexp(float(i % 5) - 2.0f, -140);  // subnormal block
  std::vector<float> expected = x;
  for (size_t b0 = 0; b0 < expected.size(); b0 += 32) {
    const size_t b1 = std::min(expected.size(), b0 + 32);
    float amax = 6.0f * std::ldexp(1.0f, -126);
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(expected[i]));
    const float scale = pow2_ceil(amax * (1.0f / 6.0f));
    for (size_t i = b0; i < b1; ++i) expected[i] = formula(std::clamp(expected[i] / scale, -6.0f, 6.0f)) * scale;
  }
  fp4_round_trip(x.data(), int64_t(x.size()), 32);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(x[i])) << i;
      continue;
    }
    ASSERT_EQ(float_to_bits(x[i]), float_to_bits(expected[i])) << i << " " << x[i] << " " << expected[i];
  }
}

// The many-head attention helpers give the bits of the per-pair functions
// (head, key and dim counts that leave remainders after the scores' blocks of
// 4 x 4 and the weighted sums' blocks of 6 heads x 64, 32 and 16 dims).
TEST(Ops, AttentionRowsMatchPerPairFunctions) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int64_t dim : {48, 112, 512, 40})
    for (int64_t heads : {1, 4, 7, 9, 13})
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
// ones, in one call and alone; many long rows (a thread each), and 2-4 even
// ones (whole rows where they balance); 64 heads (as V4-Flash) and 5; a dim that
// leaves a 16-value remainder after 32-wide blocks.
TEST(Ops, SinkAttentionGivesPerHeadBitsOnEveryPathAndSplit) {
  struct Case {
    int64_t heads, dim;
    std::vector<int64_t> row_keys;
  };
  for (const Case& c :
       {Case{64, 512, {1000}}, Case{5, 48, {300, 7, 1000, 257}}, Case{8, 64, {70, 3}}, Case{3, 40, {600, 600}},
        Case{4, 32, {400, 400, 400, 400}}, Case{4, 32, {400, 400, 400}}, Case{16, 64, std::vector<int64_t>(10, 300)}}) {
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

// The backend rotates rows that share a position with one set of angles:
// each row gets apply()'s bits on every path, inverse too, for groups of
// several heads and a last group cut short.
TEST(Ops, BackendRopeMatchesApplyPerRow) {
  const int64_t stride = 80, rows = 3 * 5 + 2, per_position = 5;
  const std::vector<int64_t> positions = {7, 65535, 1048000, 3};
  for (int64_t dim : {64, 40}) {  // 40: two steps of eight pairs and four pairs after
    RopeParams c;
    c.dim = dim;
    c.base = 160000;
    c.original_seq_len = 65536;
    c.factor = 16;
    const RopeTable table(c);
    for (bool inverse : {false, true}) {
      std::vector<float> x = normal_floats(size_t(rows * stride), 23), want = x;
      for (int64_t r = 0; r < rows; ++r)
        table.apply(want.data() + r * stride, positions[size_t(r / per_position)], inverse);
      for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
        if (!kernel_isa_supported(isa)) continue;
        SCOPED_TRACE(std::string(kernel_isa_name(isa)) + ", " + std::to_string(dim) + " dims");
        std::vector<float> got = x;
        backend_by_name(kernel_isa_name(isa))
            .rope(got.data(), rows, stride, positions.data(), per_position, table, inverse);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(float_to_bits(got[i]), float_to_bits(want[i])) << i;
      }
    }
  }
}

TEST(Ops, TopKBreaksTiesByLowerIndexAndSortsIds) {
  std::vector<float> s = {0.5f, 2.0f, 0.0f, 2.0f, 0.0f, 1.0f};
  EXPECT_EQ(top_k_indices(s.data(), 6, 3), (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(top_k_indices(s.data(), 6, 5), (std::vector<int32_t>{0, 1, 2, 3, 5}));
  EXPECT_EQ(top_k_indices(s.data(), 2, 5), (std::vector<int32_t>{0, 1}));
}

// The selection against a full sort by (score descending, index), on scores
// drawn from a few values (many ties), for k below, at and above n.
TEST(Ops, TopKMatchesAFullSort) {
  std::mt19937 rng(31);
  for (int64_t n : {1, 7, 300, 1024})
    for (int64_t k : {int64_t(0), int64_t(1), n / 3, n / 2, n - 1, n, n + 5}) {
      std::vector<float> s(static_cast<size_t>(n));
      for (auto& v : s) v = float(int(rng() % 9) - 4) * 0.5f;
      std::vector<int32_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
      order.resize(size_t(std::clamp<int64_t>(k, 0, n)));
      std::sort(order.begin(), order.end());
      EXPECT_EQ(top_k_indices(s.data(), n, k), order) << n << " " << k;
    }
  // From kTopKHistogramMin scores on, top_k_float_many on every path:
  // scores spread over both signs and many exponents, scores in a few
  // values (many ties at the k-th), -0 and +0 mixed (equal scores: the
  // lower index first), scores rising with the index (the blocks' maxima
  // and the k-th in the last blocks), the high scores in one stretch, and
  // nine in ten scores equal (the threshold keeps them all: the histogram
  // takes over); the k-th at either end; lengths that leave a part block.
  std::normal_distribution<float> nd;
  for (int kind = 0; kind < 6; ++kind) {
    for (int64_t n : {kTopKHistogramMin * 3 + 5, int64_t(70001)}) {
      std::vector<float> s(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        s[size_t(i)] = kind == 0   ? std::ldexp(nd(rng), int(rng() % 40) - 20)
                       : kind == 1 ? float(int(rng() % 9) - 4) * 0.5f
                       : kind == 2 ? (rng() % 2 ? 0.0f : -0.0f) + (rng() % 5 == 0 ? float(rng() % 3) : 0.0f)
                       : kind == 3 ? float(i) * 0.25f + float(rng() % 3)
                       : kind == 4 ? nd(rng) + (i > n / 3 && i < n / 3 + 900 ? 10.0f : 0.0f)
                                   : (rng() % 10 ? 1.0f : nd(rng));
      for (int64_t k : {int64_t(1), int64_t(512), n / 3, n - 1}) {
        std::vector<int32_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
        order.resize(size_t(k));
        std::sort(order.begin(), order.end());
        EXPECT_EQ(top_k_indices(s.data(), n, k), order) << "kind " << kind << " n " << n << " k " << k;
        for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
          if (!kernel_isa_supported(isa)) continue;
          std::vector<int32_t> got;
          ASSERT_TRUE(top_k_float_many(s.data(), n, k, got, isa));
          EXPECT_EQ(got, order) << kernel_isa_name(isa) << " kind " << kind << " n " << n << " k " << k;
        }
      }
    }
  }
  // With a NaN the selection still returns k ids in ascending order, the
  // same every time (both paths).
  std::vector<float> many(static_cast<size_t>(kTopKHistogramMin * 2 + 3), 1.0f);
  many[3000] = 2.0f;
  for (size_t nan_at : {size_t(77), many.size() - 1}) {  // in a block, and past the last whole block
    many[nan_at] = NAN;
    const std::vector<int32_t> picked_many = top_k_indices(many.data(), int64_t(many.size()), 3);
    EXPECT_EQ(picked_many.size(), 3u);
    EXPECT_TRUE(std::is_sorted(picked_many.begin(), picked_many.end()));
    for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx512}) {
      std::vector<int32_t> untouched{7};
      if (kernel_isa_supported(isa)) {
        EXPECT_FALSE(top_k_float_many(many.data(), int64_t(many.size()), 3, untouched, isa));
      }
      EXPECT_EQ(untouched, std::vector<int32_t>{7});
    }
    many[nan_at] = 1.0f;
  }
  std::vector<float> s = {1.0f, NAN, 3.0f, 2.0f, NAN, 0.5f};
  const std::vector<int32_t> picked = top_k_indices(s.data(), 6, 3);
  EXPECT_EQ(picked.size(), 3u);
  EXPECT_TRUE(std::is_sorted(picked.begin(), picked.end()));
  EXPECT_EQ(top_k_indices(s.data(), 6, 3), picked);
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
