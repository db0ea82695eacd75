// FP8 rows against 5-16 tokens (a decode batch's attention and shared-expert
// products, a verify step's) with AVX512-BF16's VDPBF16PS, where the CPU
// runs that instruction at least as fast as the fp32 FMAs
// (bf16_dot_enabled): eight rows of one 128-row block against the tokens in
// pairs, in the shape of the BF16 eight-row kernel (dot8_bf16_avx512), but
// each chunk of the rows is decoded once into step-pair words in an L1
// buffer, and one VDPBF16PS per row, token and 32 columns replaces the
// fp32 four-row kernel's two FMAs (FP8 rows without these pairs stay on
// that kernel).
//
// Why it gives the canonical bits: see linear_bf16.cpp. The weights of a
// block with a scale of at least kBf16DotMinFp8Scale and the FP8-rounded
// inputs that bf16_dot_inputs_qualify are exact in bf16, their products
// exact in fp32, and the instruction adds a lane's two steps in order,
// rounding after each addition, as the fused multiply-adds do.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_BF16 DSV4_TARGET_AVX512_BF16

namespace dsv4::linear_detail {

namespace {

// Columns [c0, c1) of an FP8 row (c1 - c0 a multiple of 32; `scales`: its
// block's scale bytes, within [kBf16DotMinFp8Scale, kMaxHalfPathScale]) as
// step-pair words at dst: word b / 2 + j of each 32-column block b holds
// column b + j in its high half (the step VDPBF16PS adds first) and column
// b + 16 + j in its low half, as pair_token_steps lays out the inputs.
DSV4_BF16 inline void fp8_chunk_to_pairs(const uint8_t* row, const uint8_t* scales, int64_t c0, int64_t c1,
                                         uint32_t* dst) {
  // Word 2j + 1 <- the top half of lane j of the first 16 columns, word 2j
  // <- the top half of lane j of the second 16 (index 32 + : the second
  // source).
  alignas(64) static const uint16_t pair_index[32] = {33, 1,  35, 3,  37, 5,  39, 7,  41, 9,  43, 11, 45, 13, 47, 15,
                                                      49, 17, 51, 19, 53, 21, 55, 23, 57, 25, 59, 27, 61, 29, 63, 31};
  const __m512i index = _mm512_load_si512(pair_index);
  for (int64_t b = c0; b < c1; b += 128) {
    const __m512 scale256 = _mm512_set1_ps(e8m0_to_float(scales[b / 128]) * 256.0f);
    const int64_t end = std::min(c1, b + 128);
    for (int64_t i = b; i < end; i += 32) {
      __m512 first, second;
      e4m3x32_to_ps_times_2m8(row + i, first, second);
      _mm512_storeu_si512(dst + (i - c0) / 2,
                          _mm512_permutex2var_epi16(_mm512_castps_si512(_mm512_mul_ps(first, scale256)), index,
                                                    _mm512_castps_si512(_mm512_mul_ps(second, scale256))));
    }
  }
}

// T tokens (pair words x[t]) over the chunk [c0, c1) of the eight rows
// (rows[r][k / 2]: the pair word of row r's columns c0 + k, c0 + k + 16);
// ahead[r]: row r's bytes to prefetch meanwhile (null: none), one cache line
// per 64 columns, shared out among the groups.
template <int T>
DSV4_BF16 inline void group_chunk(const uint32_t* const* rows, const char* const* ahead, int64_t c0, int64_t c1,
                                  const uint32_t* const* x, int group, int groups, double (*sums)[kEightRows]) {
  __m512 a[kEightRows][T];
  for (auto& r : a)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t k = 0; k < c1 - c0; k += 32) {
    if (k % 64 == 0)
      for (int r = group; r < kEightRows; r += groups)
        if (ahead[r]) _mm_prefetch(ahead[r] + k, _MM_HINT_T0);
    __m512bh xv[T];
    for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x[t] + (c0 + k) / 2);
    for (int r = 0; r < kEightRows; ++r) {
      const __m512bh wv = (__m512bh)_mm512_load_si512(rows[r] + k / 2);
      for (int t = 0; t < T; ++t) a[r][t] = _mm512_dpbf16_ps(a[r][t], wv, xv[t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < kEightRows; r += 4)
      _mm256_storeu_pd(&sums[t][r], _mm256_add_pd(_mm256_loadu_pd(&sums[t][r]),
                                                  fold16x4_avx512(a[r][t], a[r + 1][t], a[r + 2][t], a[r + 3][t])));
}

}  // namespace

DSV4_BF16 void dot8_fp8_pairs(const Linear& w, const int64_t* rows, int64_t next_rows, const uint32_t* pairs, int64_t n,
                              double* out) {
  const int64_t cols = w.cols;
  const uint8_t* scales = w.scale + rows[0] / 128 * w.scale_cols;
  const uint8_t* p[kEightRows];
  for (int r = 0; r < kEightRows; ++r) p[r] = w.data + rows[r] * cols;
  alignas(64) uint32_t decoded[kEightRows][kChunk / 2];
  double sums[kMaxRegisterTokens][kEightRows] = {};
  const int groups = int((n + kEightRowTokenGroup - 1) / kEightRowTokenGroup);
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    const uint32_t* chunk[kEightRows];
    const char* ahead[kEightRows];
    for (int r = 0; r < kEightRows; ++r) {
      fp8_chunk_to_pairs(p[r], scales, c0, c1, decoded[r]);
      chunk[r] = decoded[r];
      ahead[r] = reinterpret_cast<const char*>(c1 < cols ? p[r] + c1 : next_rows ? p[r] + next_rows * cols : nullptr);
    }
    for (int g = 0; g < groups; ++g) {
      const int64_t t = int64_t(g) * kEightRowTokenGroup;
      const uint32_t* x[kEightRowTokenGroup];
      for (int u = 0; u < kEightRowTokenGroup; ++u) x[u] = pairs + std::min(t + u, n - 1) * (cols / 2);
      if (n - t >= 2)
        group_chunk<2>(chunk, ahead, c0, c1, x, g, groups, sums + t);
      else
        group_chunk<1>(chunk, ahead, c0, c1, x, g, groups, sums + t);
    }
  }
  for (int64_t t = 0; t < n; ++t)
    for (int r = 0; r < kEightRows; ++r) out[t * kEightRows + r] = sums[t][r];
}

}  // namespace dsv4::linear_detail
