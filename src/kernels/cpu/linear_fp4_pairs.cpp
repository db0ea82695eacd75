// The FP4 register path with AVX512-BF16's VDPBF16PS: four rows against up
// to seven tokens (a decode step's routed experts), where the CPU runs that
// instruction at least as fast as the fp32 FMAs (bf16_dot_enabled).
//
// Why it gives the canonical bits: see linear_bf16.cpp. A 32-column FP4
// block in storage order is two steps of the 16 lanes (byte j: the low
// nibble is step k of lane j, the high nibble step k + 1), so each byte
// gives lane j's step pair directly: one word lookup (vpermw) turns a
// widened block into the 16 pair words, where the fp32 kernel needs two
// float lookups (vpermps) and two FMAs per token. Those lookups compete with
// the FMAs for the vector ports, and on AMD Zen 5 the pair form decodes and
// multiplies a one-token expert about a quarter faster (docs/kernels.md,
// "FP4 step pairs").
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_BF16 DSV4_TARGET_AVX512_BF16

namespace dsv4::linear_detail {

namespace {

// Per scale byte, the bf16 of the 16 e2m1 codes times the scale (the top
// half of the float, exact: two significant bits), twice: entries 16-31
// repeat 0-15, since the lookup's index for a low nibble is the whole byte,
// of which vpermw reads the low five bits.
struct E2m1PairTables {
  alignas(64) uint16_t words[256][32];
  E2m1PairTables() {
    const E2m1Tables& values = e2m1_tables();
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 16; ++c) {
        uint32_t bits;
        std::memcpy(&bits, &values.values[s][c], 4);
        words[s][c] = words[s][16 + c] = uint16_t(bits >> 16);
      }
  }
};
const E2m1PairTables& e2m1_pair_tables() {
  static const E2m1PairTables tables;
  return tables;
}

// A block's 16 bytes as 16 pair words: word 2j + 1 (the first step, which
// VDPBF16PS adds first) the low nibble's value, word 2j the high nibble's.
DSV4_BF16 inline __m512bh e2m1_block_pairs(const uint8_t* bytes16, __m512i table) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)bytes16));
  return (__m512bh)_mm512_permutexvar_epi16(_mm512_or_si512(_mm512_srli_epi32(b, 4), _mm512_slli_epi32(b, 16)), table);
}

// Whether every block scale of the four rows keeps the weights at 2^-50 or
// above (see linear_bf16.cpp).
DSV4_BF16 bool scales_qualify(const uint8_t* const* scales, int64_t count) {
  const __m512i min_scale = _mm512_set1_epi8(char(kBf16DotMinFp4Scale));
  for (int r = 0; r < 4; ++r)
    for (int64_t i = 0; i < count; i += 64) {
      const __mmask64 live = count - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (count - i)) - 1;
      if (_mm512_mask_cmplt_epu8_mask(live, _mm512_maskz_loadu_epi8(live, scales[r] + i), min_scale)) return false;
    }
  return true;
}

// As dot4_fp4_avx512: the group's T tokens over the chunk [c0, c1), the
// folded lanes added to sums[row * kMaxRegisterTokens + t]; x[t] are the
// tokens' pair words (cols / 2 per token).
template <int T>
DSV4_BF16 inline void fp4_pairs_group_chunk(const uint8_t* const* p, const uint8_t* const* s, int64_t c0, int64_t c1,
                                            const uint32_t* const* x, bool prefetch, double* sums) {
  const E2m1PairTables& tables = e2m1_pair_tables();
  __m512 a[4][T];
  for (auto& r : a)
    for (auto& t : r) t = _mm512_setzero_ps();
  const uint8_t* bytes[4];
  const uint8_t* scales[4];
  for (int r = 0; r < 4; ++r) {
    bytes[r] = p[r] + c0 / 2;
    scales[r] = s[r] + c0 / 32;
  }
  for (int64_t b = c0; b < c1; b += 32) {
    if (prefetch && b % 128 == 0)  // one cache line per row, as the fp32 kernel
      for (int r = 0; r < 4; ++r) _mm_prefetch((const char*)bytes[r] + kPrefetchBytesAhead, _MM_HINT_T0);
    __m512bh xv[T];
    for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x[t] + b / 2);
    for (int r = 0; r < 4; ++r) {
      const __m512bh w = e2m1_block_pairs(bytes[r], _mm512_load_si512(tables.words[*scales[r]]));
      bytes[r] += 16;
      ++scales[r];
      for (int t = 0; t < T; ++t) a[r][t] = _mm512_dpbf16_ps(a[r][t], w, xv[t]);
    }
  }
  add_folds_avx512<4, T>(a, sums, kMaxRegisterTokens);
}

}  // namespace

DSV4_BF16 bool dot4_fp4_pairs(const Linear& w, RowGroup g, const uint32_t* pairs, int64_t n, double* out,
                              int64_t out_stride) {
  const int64_t cols = w.cols, row_bytes = cols / 2;
  const uint8_t* p[4];
  const uint8_t* s[4];
  for (int r = 0; r < 4; ++r) {
    p[r] = w.data + g.row(r) * row_bytes;
    s[r] = w.scale + g.row(r) * w.scale_cols;
  }
  if (!scales_qualify(s, w.scale_cols)) return false;
  double sums[4][kMaxRegisterTokens] = {};
  const int64_t groups = (n + 3) / 4;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t t = group * 4;
      const uint32_t* x[4];
      for (int u = 0; u < 4; ++u) x[u] = pairs + std::min(t + u, n - 1) * (cols / 2);
      const bool prefetch = g.has_next && group == 0;
      double* sum = &sums[0][t];
      switch (std::min<int64_t>(4, n - t)) {
        case 4: fp4_pairs_group_chunk<4>(p, s, c0, c1, x, prefetch, sum); break;
        case 3: fp4_pairs_group_chunk<3>(p, s, c0, c1, x, prefetch, sum); break;
        case 2: fp4_pairs_group_chunk<2>(p, s, c0, c1, x, prefetch, sum); break;
        default: fp4_pairs_group_chunk<1>(p, s, c0, c1, x, prefetch, sum); break;
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int64_t t = 0; t < n; ++t) out[t * out_stride + r] = sums[r][t];
  return true;
}

}  // namespace dsv4::linear_detail
