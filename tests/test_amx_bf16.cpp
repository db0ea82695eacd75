// What AMX's TDPBF16PS computes, pinned on the CPUs that have it: the
// contract an AMX product kernel would build on (docs/kernels.md, "AMX").
//
// Operands are what the FP8 and FP4 products feed a bf16 path: e4m3-like
// values times powers of two, exact in bf16, every product of two exact in
// fp32. Measured on an Intel Xeon with AMX (2026-12-03):
// - with one nonzero product per bf16 pair, C[m][n] becomes
//   round(C + S), S being the products of the instruction's 16 steps added
//   in order in fp32 starting from zero, each addition rounded to nearest
//   even. That is a chain the canonical order could be defined around.
// - with both products of a pair nonzero, about a quarter of the lanes
//   match no IEEE sequence of roundings tried (in order, pairs first, groups
//   of 4, 8 or 32 summed exactly): not a chain the other paths can give.
#include <gtest/gtest.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "core/machine.h"

namespace dsv4 {
namespace {

#define DSV4_AMX __attribute__((target("amx-tile,amx-bf16")))

// Linux hands out the tile data state only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
bool request_tile_data() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// c (16 x 16 fp32) += a (16 x 32 bf16) . b (16 pairs x 16 columns x 2 bf16).
DSV4_AMX void tile_dot_bf16(const uint16_t (&a)[16][32], const uint16_t (&b)[16][32], float (&c)[16][16]) {
  TileConfig config;
  for (int t = 0; t < 3; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
  _tile_loadd(0, c, 64);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, 64);
  _tile_release();
}

uint16_t to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return uint16_t(bits >> 16);  // exact: the values have at most 8 significant bits
}

float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

class AmxBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!detect_cpu_features().amx_bf16) GTEST_SKIP() << "this CPU has no AMX-BF16";
    if (!request_tile_data()) GTEST_SKIP() << "the kernel refused the AMX tile data state";
  }

  // An e4m3-like value (4 significant bits) times 2^e, e spread over
  // `spread` exponents; a sixteenth are zeros.
  uint16_t operand(int spread) {
    const int mantissa = 8 + int(rng_() % 8);
    const int exponent = int(rng_() % uint64_t(spread)) - spread / 2 - 3;
    float v = std::ldexp(float(mantissa), exponent);
    if (rng_() % 2) v = -v;
    if (rng_() % 16 == 0) v = 0.0f;
    return to_bf16(v);
  }

  // Random operands (odd elements of a's pairs zero unless both_products)
  // through the instruction; counts the lanes that differ from
  // round(c + S) and from the chain in order starting at c.
  void run(bool both_products, int64_t& lanes, int64_t& differ_from_zero_then_add, int64_t& differ_from_chain) {
    alignas(64) uint16_t a[16][32], b[16][32];
    alignas(64) float c[16][16], c0[16][16];
    for (int trial = 0; trial < 400; ++trial) {
      const int spread = 1 + trial % 24;
      for (int m = 0; m < 16; ++m)
        for (int k = 0; k < 32; ++k) a[m][k] = (k % 2 == 1 && !both_products) ? 0 : operand(spread);
      for (auto& row : b)
        for (auto& v : row) v = operand(spread);
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n)
          c[m][n] = c0[m][n] = std::ldexp(float(int(rng_() % 2000) - 1000), int(rng_() % 10) - 8);
      tile_dot_bf16(a, b, c);
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n) {
          float from_zero = 0.0f, chain = c0[m][n];
          for (int k = 0; k < 16; ++k)
            for (int e = 0; e < 2; ++e) {
              const float product = from_bf16(a[m][2 * k + e]) * from_bf16(b[k][2 * n + e]);
              from_zero += product;
              chain += product;
            }
          const float zero_then_add = c0[m][n] + from_zero;
          ++lanes;
          differ_from_zero_then_add += std::memcmp(&c[m][n], &zero_then_add, 4) != 0;
          differ_from_chain += std::memcmp(&c[m][n], &chain, 4) != 0;
        }
    }
  }

  std::mt19937_64 rng_{2026};
};

TEST_F(AmxBf16, OneProductPerPairAddsTheStepsFromZeroThenTheAccumulator) {
  int64_t lanes = 0, differ = 0, differ_from_chain = 0;
  run(false, lanes, differ, differ_from_chain);
  EXPECT_EQ(differ, 0) << "of " << lanes << " lanes";
  // The accumulator is not the chain's start: a canonical order for this
  // instruction would add each 16-step segment to the lane's sum.
  std::printf("one product per pair: %lld of %lld lanes differ from the chain started at the accumulator\n",
              (long long)differ_from_chain, (long long)lanes);
  // Both products of a pair: reported, not asserted (no chain matches).
  int64_t both_lanes = 0, both_differ = 0, both_differ_from_chain = 0;
  run(true, both_lanes, both_differ, both_differ_from_chain);
  std::printf("both products: %lld of %lld lanes differ from round(c + S), %lld from the chain\n",
              (long long)both_differ, (long long)both_lanes, (long long)both_differ_from_chain);
}

}  // namespace
}  // namespace dsv4
