// The indexer's integer FP4 scores (kernels/cpu/indexer_fp4.h): the query's
// integer form, and every path's scores against the definition computed
// here independently (exact block dot products in double).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "kernels/cpu/indexer_fp4.h"
#include "kernels/cpu/isa.h"
#include "random_floats.h"

namespace dsv4 {
namespace {

using test::normal_floats;

// Query rows on the FP4 grid, each 32-block scaled by 2^(shift * block)
// before rounding: with shift > 0 the blocks' magnitudes lie far apart, so
// that a sum that mixes blocks in fp32 lanes rounds where the definition's
// exact blocks do not.
std::vector<float> fp4_queries(int64_t heads, int64_t dim, int shift, uint32_t seed) {
  std::vector<float> q = normal_floats(size_t(heads * dim), seed);
  for (int64_t i = 0; i < heads * dim; ++i) q[size_t(i)] = std::ldexp(q[size_t(i)], shift * int((i % dim) / 32));
  for (int64_t h = 0; h < heads; ++h) fp4_round_trip(q.data() + h * dim, dim, 32);
  return q;
}

TEST(IndexerFp4, QueryCodesGiveBackTheQuery) {
  const int64_t heads = 5, dim = 128;
  const std::vector<float> q = fp4_queries(heads, dim, 3, 1);
  cpu::Fp4Query form;
  ASSERT_TRUE(cpu::fp4_query(q.data(), heads, dim, form));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t b = d / 32, j = d % 32;
      const int64_t stored = b * 32 + (j % 2 ? 16 + j / 2 : j / 2);  // even dims first, then odd
      const float value = float(form.codes[size_t(h * dim + stored)]) * form.half_scale[size_t(b * heads + h)];
      ASSERT_EQ(value, q[size_t(h * dim + d)]) << "head " << h << " dim " << d;
    }
  // The offset undoes the keys' +12: -12 times each block's sum of codes.
  int32_t sum = 0;
  for (int64_t j = 0; j < 32; ++j) sum += form.codes[size_t(j)];
  EXPECT_EQ(form.offset[0], -12 * sum);
}

TEST(IndexerFp4, QueriesOffTheGridAreRefused) {
  const int64_t heads = 2, dim = 64;
  cpu::Fp4Query form;
  std::vector<float> q = normal_floats(size_t(heads * dim), 2);  // not rounded
  EXPECT_FALSE(cpu::fp4_query(q.data(), heads, dim, form));
  q = fp4_queries(heads, dim, 0, 3);
  EXPECT_TRUE(cpu::fp4_query(q.data(), heads, dim, form));
  q[70] = NAN;
  EXPECT_FALSE(cpu::fp4_query(q.data(), heads, dim, form));
  q = fp4_queries(heads, dim, 0, 3);
  q[3] = std::nextafter(q[3], 100.0f);  // one value off the grid
  EXPECT_FALSE(cpu::fp4_query(q.data(), heads, dim, form));
  EXPECT_FALSE(cpu::fp4_query(q.data(), heads, 48, form));  // not whole 32-blocks
  // All-zero blocks are on the grid (codes 0).
  std::vector<float> zeros(size_t(heads * dim), 0.0f);
  EXPECT_TRUE(cpu::fp4_query(zeros.data(), heads, dim, form));
}

// The integer form is the same on every path: the same answer, and where it
// is given, the same codes, half scales, offsets and words. Blocks on the
// grid at scales from 2^-140 (subnormal values) to 2^100, all-zero blocks
// and negative zeros, and blocks one change away from refusal: a value off
// the grid, NaN, an infinity, a nonzero value whose code underflows to zero.
void scores_follow_the_definition(int64_t dim);

TEST(IndexerFp4, QueryFormIsTheSameOnEveryPath) {
  const int64_t heads = 3, dim = 128;
  for (int shift : {-35, -5, 0, 4, 25}) {
    for (int change = 0; change < 6; ++change) {
      SCOPED_TRACE("block shift " + std::to_string(shift) + ", change " + std::to_string(change));
      std::vector<float> q = fp4_queries(heads, dim, shift, uint32_t(40 + change));
      for (int64_t d = 0; d < 32; ++d) q[size_t(dim + d)] = d % 3 ? 0.0f : -0.0f;  // head 1, block 0
      const size_t at = size_t(2 * dim + 64 + 7);                                  // head 2, block 2
      if (change == 1) q[at] = std::nextafter(q[at], 1e30f);
      if (change == 2) q[at] = NAN;
      if (change == 3) q[at] = -INFINITY;
      if (change == 4) q[at] = std::ldexp(1.0f, -149);  // beside larger values: code 0
      if (change == 5) q[at] = q[at] * 0.5f;            // on the grid at twice the precision: refused or kept
      std::vector<cpu::Fp4Query> forms;
      std::vector<bool> answers;
      for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
        if (!kernel_isa_supported(isa)) continue;
        forms.emplace_back();
        answers.push_back(cpu::fp4_query(q.data(), heads, dim, forms.back(), isa));
      }
      if (change == 0) {
        EXPECT_TRUE(answers[0]);
      } else if (change <= 4) {
        EXPECT_FALSE(answers[0]);
      }
      for (size_t k = 1; k < forms.size(); ++k) {
        ASSERT_EQ(answers[k], answers[0]) << "path " << k;
        if (!answers[0]) continue;
        EXPECT_EQ(forms[k].codes, forms[0].codes);
        EXPECT_EQ(forms[k].half_scale, forms[0].half_scale);
        EXPECT_EQ(forms[k].offset, forms[0].offset);
        EXPECT_EQ(forms[k].words_by_group, forms[0].words_by_group);
        EXPECT_EQ(forms[k].one_sum, forms[0].one_sum);
        EXPECT_EQ(forms[k].scaled_words, forms[0].scaled_words);
        EXPECT_EQ(forms[k].scaled_offset, forms[0].scaled_offset);
        EXPECT_EQ(forms[k].head_half_scale, forms[0].head_half_scale);
      }
    }
  }
}

// 128 dims (V4's keys: the VNNI kernel's one-register tile) and 64 and 256
// (its general tile through a row buffer); head counts that leave the
// kernel's groups of four and eight a remainder; runs of keys that end in
// a whole or part tile after one or two.
TEST(IndexerFp4, ScoresFollowTheDefinitionOnEveryPath) {
  for (int64_t dim : {128, 64, 256}) scores_follow_the_definition(dim);
}

// Scales where a block's term sum * q_half * k_half is not exact in fp32:
// keys whose four block scales are all 2^-127 .. 2^-124 (with the whole
// query scaled down by 2^-16 .. 2^-24, every head's terms of such a key
// fall below the smallest subnormal or round there), keys with single
// extreme blocks (2^-127 .. 2^127, the NaN scale) and plain ones in runs
// of 16. The VNNI kernel keeps the definition's operations where a tile's
// terms are not all exact (its fused form only where they are) and gives
// the portable path's bits: with the fused form everywhere this fails.
TEST(IndexerFp4, ScoresWithExtremeScalesGiveThePortableBits) {
  if (!cpu::fp4_scores_use_vnni(KernelIsa::Avx512)) GTEST_SKIP() << "no AVX512-VNNI";
  const int64_t dim = 128, heads = 12, keys = 200, blocks = dim / 32;
  std::mt19937 rng(21);
  std::vector<uint8_t> nibbles(size_t(keys * dim / 2)), scales(size_t(keys * blocks));
  for (auto& b : nibbles) b = uint8_t(rng());
  const uint8_t extreme[] = {0, 1, 2, 5, 20, 250, 254, 255};
  for (int64_t k = 0; k < keys; ++k)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t kind = k / 16 % 3;
      scales[size_t(k * blocks + b)] = kind == 0   ? uint8_t(118 + rng() % 8)
                                       : kind == 1 ? uint8_t(rng() % 4)
                                                   : (rng() % 2 ? extreme[rng() % 8] : uint8_t(118 + rng() % 8));
    }
  const Fp4RowsView view{nibbles.data(), scales.data(), dim, 32};
  for (int shift : {0, 16, 20, 24}) {
    SCOPED_TRACE("query scaled by 2^-" + std::to_string(shift));
    std::vector<float> q = fp4_queries(heads, dim, 0, 23);
    for (float& v : q) v = std::ldexp(v, -shift);
    cpu::Fp4Query form;
    ASSERT_TRUE(cpu::fp4_query(q.data(), heads, dim, form));
    const std::vector<float> weights = normal_floats(size_t(heads), 24);
    std::vector<float> want(static_cast<size_t>(keys)), got(static_cast<size_t>(keys));
    cpu::fp4_scores(KernelIsa::Scalar, form, weights.data(), view, 0, keys, want.data());
    cpu::fp4_scores(KernelIsa::Avx512, form, weights.data(), view, 0, keys, got.data());
    for (int64_t i = 0; i < keys; ++i) {
      if (std::isnan(want[size_t(i)]) && std::isnan(got[size_t(i)])) continue;
      ASSERT_EQ(0, std::memcmp(&got[size_t(i)], &want[size_t(i)], 4))
          << "key " << i << ": " << got[size_t(i)] << " != " << want[size_t(i)];
    }
  }
}

// The one-sum form of a query: each block's codes times 2^(its exponent
// above the head's smallest), where they all stay within [-127, 127].
TEST(IndexerFp4, OneSumQueryScalesEachBlockByItsExponent) {
  const int64_t heads = 4, dim = 128;
  for (int shift : {0, 1, 2, -1}) {
    SCOPED_TRACE("block shift " + std::to_string(shift));
    const std::vector<float> q = fp4_queries(heads, dim, shift, 5);
    cpu::Fp4Query form;
    ASSERT_TRUE(cpu::fp4_query(q.data(), heads, dim, form));
    // Codes reach 12 in every block of these rows: blocks 2^6 apart leave it.
    EXPECT_EQ(form.one_sum, shift == 0 || shift == 1 || shift == -1);
    if (!form.one_sum) continue;
    for (int64_t h = 0; h < heads; ++h) {
      float low = INFINITY;
      for (int64_t b = 0; b < dim / 32; ++b) low = std::min(low, form.half_scale[size_t(b * heads + h)]);
      EXPECT_EQ(form.head_half_scale[size_t(h)], low);
      int32_t sum = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const int32_t factor = int32_t(form.half_scale[size_t(d / 32 * heads + h)] / low);
        const int32_t code = form.codes[size_t(h * dim + d)] * factor;
        int8_t got;
        std::memcpy(&got, reinterpret_cast<const int8_t*>(&form.scaled_words[size_t(d / 4 * heads + h)]) + d % 4, 1);
        EXPECT_EQ(got, code) << "head " << h << ", dim " << d;
        sum += code;
      }
      EXPECT_EQ(form.scaled_offset[size_t(h)], -cpu::kScaledKeyBias * sum);
    }
  }
}

// Tiles in the one-sum form (each key's block exponents at most 3 apart,
// the query's blocks within the range) against the portable path's bits:
// keys whose blocks lie 0-3 exponents apart, each with its own smallest;
// tiles with one key 4 apart (the per-block form); scales near the one-sum
// form's limits (products near 2^100 and 2^-126) and past them; runs that
// end in part tiles. A wrong table, bias or smallest scale changes the bits.
TEST(IndexerFp4, OneSumTilesGiveThePortableBits) {
  if (!cpu::fp4_scores_use_vnni(KernelIsa::Avx512)) GTEST_SKIP() << "no AVX512-VNNI";
  const int64_t dim = 128, heads = 12, keys = 230, blocks = dim / 32;
  std::mt19937 rng(31);
  std::vector<uint8_t> nibbles(size_t(keys * dim / 2));
  for (auto& b : nibbles) b = uint8_t(rng());
  for (int base : {100, 127, 150, 225, 235, 3}) {
    for (int query_shift : {0, 1}) {
      SCOPED_TRACE("key scales from " + std::to_string(base) + ", query block shift " + std::to_string(query_shift));
      std::vector<uint8_t> scales(size_t(keys * blocks));
      for (int64_t k = 0; k < keys; ++k) {
        const int lowest = base + int(rng() % 5);
        const int spread = k / 16 % 4 == 3 && k % 16 == 7 ? 4 : int(rng() % 4);  // one key in every fourth tile: 4
        for (int64_t b = 0; b < blocks; ++b)
          scales[size_t(k * blocks + b)] = uint8_t(lowest + int(rng() % (spread + 1)));
        scales[size_t(k * blocks + rng() % blocks)] = uint8_t(lowest);
        scales[size_t(k * blocks + rng() % blocks)] = uint8_t(lowest + spread);
      }
      const Fp4RowsView view{nibbles.data(), scales.data(), dim, 32};
      std::vector<float> q = fp4_queries(heads, dim, 0, uint32_t(base + query_shift));
      for (int64_t h = 0; h < heads && query_shift; ++h)  // one block of each head 2 or 4 times larger
        for (int64_t d = h % blocks * 32; d < h % blocks * 32 + 32; ++d)
          q[size_t(h * dim + d)] = std::ldexp(q[size_t(h * dim + d)], 1 + int(h % 2));
      cpu::Fp4Query form;
      ASSERT_TRUE(cpu::fp4_query(q.data(), heads, dim, form));
      ASSERT_TRUE(form.one_sum);
      const std::vector<float> weights = normal_floats(size_t(heads), 32);
      std::vector<float> want(static_cast<size_t>(keys));
      cpu::fp4_scores(KernelIsa::Scalar, form, weights.data(), view, 0, keys, want.data());
      for (int64_t first : {0, 3}) {
        for (int64_t count : {keys - first, int64_t(1), int64_t(16), int64_t(17), int64_t(45)}) {
          std::vector<float> got(static_cast<size_t>(count));
          cpu::fp4_scores(KernelIsa::Avx512, form, weights.data(), view, first, count, got.data());
          for (int64_t i = 0; i < count; ++i) {
            if (std::isnan(want[size_t(first + i)]) && std::isnan(got[size_t(i)])) continue;
            ASSERT_EQ(0, std::memcmp(&got[size_t(i)], &want[size_t(first + i)], 4))
                << "key " << first + i << " of a run of " << count << ": " << got[size_t(i)]
                << " != " << want[size_t(first + i)];
          }
        }
      }
    }
  }
}

void scores_follow_the_definition(int64_t dim) {
  SCOPED_TRACE(std::to_string(dim) + " dims");
  const int64_t keys = 301;
  std::mt19937 rng(7);
  std::vector<uint8_t> nibbles(size_t(keys * dim / 2)), scales(size_t(keys * dim / 32));
  for (auto& b : nibbles) b = uint8_t(rng());
  for (auto& s : scales) s = uint8_t(110 + rng() % 30);  // 2^-17 .. 2^12
  const Fp4RowsView view{nibbles.data(), scales.data(), dim, 32};
  auto key_value = [&](int64_t key, int64_t d) {
    const uint8_t byte = nibbles[size_t(key * dim / 2 + d / 2)];
    return double(e2m1_to_float(uint8_t(d % 2 ? byte >> 4 : byte & 15))) *
           double(e8m0_to_float(scales[size_t(key * dim / 32 + d / 32)]));
  };
  for (int64_t heads : {8, 10, 12, 64}) {
    for (int shift : {0, 9}) {
      SCOPED_TRACE("heads " + std::to_string(heads) + ", block shift " + std::to_string(shift));
      const std::vector<float> q = fp4_queries(heads, dim, shift, uint32_t(heads + shift));
      std::vector<float> weights = normal_floats(size_t(heads), 11);
      for (int64_t h = 0; h < heads; ++h) weights[size_t(h)] *= h % 2 ? 1e-3f : 1e3f;  // the head order matters
      cpu::Fp4Query form;
      ASSERT_TRUE(cpu::fp4_query(q.data(), heads, dim, form));
      // The definition: each block's dot product exactly (in double, exact
      // for these values), added to the head's fp32 dot in block order;
      // the heads' weighted ReLUs added in head order.
      const int64_t first = 5, count = keys - first;
      std::vector<float> want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        float score = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          float dot = 0.0f;
          for (int64_t b = 0; b < dim / 32; ++b) {
            double block = 0.0;
            for (int64_t d = b * 32; d < b * 32 + 32; ++d)
              block += double(q[size_t(h * dim + d)]) * key_value(first + i, d);
            ASSERT_EQ(double(float(block)), block);  // exact in fp32 too
            dot += float(block);
          }
          score += std::max(dot, 0.0f) * weights[size_t(h)];
        }
        want[size_t(i)] = score;
      }
      for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
        if (!kernel_isa_supported(isa)) continue;
        SCOPED_TRACE(std::string(kernel_isa_name(isa)) + (cpu::fp4_scores_use_vnni(isa) ? " (VNNI)" : ""));
        std::vector<float> got(static_cast<size_t>(count));
        cpu::fp4_scores(isa, form, weights.data(), view, first, count, got.data());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4));
        for (int64_t i = 0; i < count; ++i)
          if (std::memcmp(&got[size_t(i)], &want[size_t(i)], 4) != 0) {
            ADD_FAILURE() << "key " << first + i << ": " << got[size_t(i)] << " != " << want[size_t(i)];
            break;
          }
        // Shorter runs: one tile, a tile and a part, two and a part.
        for (int64_t n : {1, 16, 17, 31, 32, 33, 50}) {
          std::vector<float> part(static_cast<size_t>(n));
          cpu::fp4_scores(isa, form, weights.data(), view, first, n, part.data());
          EXPECT_EQ(0, std::memcmp(part.data(), want.data(), part.size() * 4)) << n << " keys";
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsv4
