// FP8 rows with AVX512-BF16's VDPBF16PS, where the CPU runs that
// instruction at least as fast as the fp32 FMAs (bf16_dot_enabled). Two
// kernels:
//
// - dot8_fp8_pairs, FP8 rows against 5-16 tokens (a decode batch's
//   attention and shared-expert products, a verify step's): eight rows of
//   one 128-row block against the tokens in triples and pairs, in the shape
//   of the BF16 eight-row kernel (dot8_bf16_avx512), but each chunk of the
//   rows is decoded once into step-pair words in an L1 buffer, and one VDPBF16PS
//   per row, token and 32 columns replaces the fp32 four-row kernel's two
//   FMAs (FP8 rows without these pairs stay on that kernel).
// - dot4_fp8_pairs, FP8 rows against 1-4 tokens (decoding), where the CPU
//   also has AVX512-VBMI: four rows of four long streams (rows of any
//   blocks), each 64 weights decoded by two byte-table lookups (vpermi2b)
//   straight into bf16 step-pair words, the row's block scale applied by
//   one saturating subtraction per 32 words. Ten vector uops and two
//   VDPBF16PS per 64 weights and token, where the fp32 kernel spends about
//   20 decoding uops and four FMAs: on two cores of AMD Zen 5 the fp32
//   kernel decodes FP8 more slowly than the memory delivers it
//   (docs/kernels.md, "FP8 four rows with byte tables").
//
// Why they give the canonical bits: see linear_bf16.cpp. The weights of a
// block with a scale of at least kBf16DotMinFp8Scale and the FP8-rounded
// inputs that bf16_dot_inputs_qualify are exact in bf16, their products
// exact in fp32, and the instruction adds a lane's two steps in order,
// rounding after each addition, as the fused multiply-adds do.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/fp8_byte_tables.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_BF16 DSV4_TARGET_AVX512_BF16
#define DSV4_BF16_VBMI DSV4_TARGET_AVX512_BF16_VBMI

namespace dsv4::linear_detail {

namespace {

// Columns [c0, c1) of an FP8 row as step-pair words at dst (word b / 2 + j
// of each 32-column block b holds column b + j in its high half, column b
// + 16 + j in its low half, as pair_token_steps lays out the inputs), by
// the fp16 decoding.
DSV4_BF16 inline void fp8_chunk_to_pairs(const uint8_t* row, const uint8_t* scales, int64_t c0, int64_t c1,
                                         uint32_t* dst) {
  fp8_words_by_fp16(row, scales, c0, c1, e4m3_byte_tables().pair_words, reinterpret_cast<uint8_t*>(dst));
}

// T tokens (pair words x[t]) over the chunk [c0, c1) of the eight rows
// (rows[r][k / 2]: the pair word of row r's columns c0 + k, c0 + k + 16);
// ahead[r]: row r's bytes to prefetch meanwhile (null: none), one cache line
// per 64 columns, shared out among the groups.
template <int T>
DSV4_BF16 inline void group_chunk(const uint32_t* const* rows, const char* const* ahead, int64_t c0, int64_t c1,
                                  const uint32_t* const* x, int group, int groups, double (*sums)[kEightRows]) {
  __m512 lanes[kEightRows][T];  // the segments' sums
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < c1 - c0; k0 += kSegment) {
    __m512 a[kEightRows][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    for (int64_t k = k0; k < std::min(c1 - c0, k0 + kSegment); k += 32) {
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
    for (int r = 0; r < kEightRows; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < kEightRows; r += 4)
      _mm256_storeu_pd(&sums[t][r],
                       _mm256_add_pd(_mm256_loadu_pd(&sums[t][r]),
                                     fold16x4_avx512(lanes[r][t], lanes[r + 1][t], lanes[r + 2][t], lanes[r + 3][t])));
}

// How far ahead in each stream the four-row kernel asks for its rows: 2 KB,
// more than the other register kernels (kPrefetchBytesAhead). It takes its
// bytes faster than they do, and on AMD Zen 5 one layer's FP8 products ran
// 4% faster with 2 KB than with 1 KB, the same with 3 KB and slower with
// 4 KB (docs/kernels.md, "FP8 four rows with byte tables").
constexpr int64_t kFourRowPrefetchBytesAhead = 2048;

// As dot4_fp8_avx512 with one token group: R rows (codes p[r], block
// scales s[r]) against T tokens (pair words x[t]) over the chunk [c0, c1)
// (a multiple of 64 columns), the folded lanes added to
// sums[r * kMaxRegisterTokens + t].
template <int R, int T>
DSV4_BF16_VBMI inline void fp8_pairs_chunk(const E4m3ByteDecoder& decoder, const uint8_t* const* p,
                                           const uint8_t* const* s, int64_t c0, int64_t c1, const uint32_t* const* x,
                                           bool prefetch, double* sums) {
  __m512 lanes[R][T];  // the segments' sums
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  __m512i scale[R];
  for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
    __m512 a[R][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    for (int64_t i = s0; i < std::min(c1, s0 + kSegment); i += 64) {
      if (i % 128 == 0 || i == c0)
        for (int r = 0; r < R; ++r) scale[r] = scale_subtrahend(s[r][i / 128]);
      if (prefetch)  // one cache line per row
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(p[r] + i) + kFourRowPrefetchBytesAhead, _MM_HINT_T0);
      __m512bh x01[T], x23[T];
      for (int t = 0; t < T; ++t) {
        x01[t] = (__m512bh)_mm512_loadu_si512(x[t] + i / 2);
        x23[t] = (__m512bh)_mm512_loadu_si512(x[t] + i / 2 + 16);
      }
      for (int r = 0; r < R; ++r) {
        __m512bh steps01, steps23;
        decoder.decode(p[r] + i, scale[r], steps01, steps23);
        for (int t = 0; t < T; ++t) {
          a[r][t] = _mm512_dpbf16_ps(a[r][t], steps01, x01[t]);
          a[r][t] = _mm512_dpbf16_ps(a[r][t], steps23, x23[t]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
  }
  add_folds_avx512<R, T>(lanes, sums, kMaxRegisterTokens);
}

// One token (decoding's attention and shared-expert products): the group's
// whole rows in one call, the four sums and scales in registers. The same
// chunks, steps and folds as fp8_pairs_rows<1> (the same bits), without
// its per-chunk pointer arrays and sums in memory; 8-17% faster on AMD Zen
// 5, in cache and from DRAM (docs/kernels.md, "FP8 and FP4 one token").
//
// kWholeSegments: cols is a multiple of kSegment (every V4 matrix), so each
// segment is exactly four steps, unrolled straight with the scale loads at
// fixed places instead of a loop that tests for them at every step: 3-4%
// faster from DRAM, 7% in L2 (docs/kernels.md, "FP4 and FP8 segments of a
// fixed length").
template <bool kWholeSegments>
DSV4_BF16_VBMI void fp8_pairs_one_token(const Linear& w, const RowGroup& g, const uint32_t* x, double* out) {
  const int64_t cols = w.cols;
  const uint8_t* p0 = w.data + g.row(0) * cols;
  const uint8_t* p1 = w.data + g.row(1) * cols;
  const uint8_t* p2 = w.data + g.row(2) * cols;
  const uint8_t* p3 = w.data + g.row(3) * cols;
  const uint8_t* s0 = w.scale + g.row(0) / 128 * w.scale_cols;
  const uint8_t* s1 = w.scale + g.row(1) / 128 * w.scale_cols;
  const uint8_t* s2 = w.scale + g.row(2) / 128 * w.scale_cols;
  const uint8_t* s3 = w.scale + g.row(3) / 128 * w.scale_cols;
  const E4m3ByteDecoder decoder = E4m3ByteDecoder::pairs();
  const bool prefetch = g.has_next;
  double sum0 = 0, sum1 = 0, sum2 = 0, sum3 = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    __m512 l0 = _mm512_setzero_ps(), l1 = l0, l2 = l0, l3 = l0;  // the lanes: the segments' sums
    // Set at the chunk's first step: c0 is a multiple of kChunk, so of 128.
    __m512i scale0 = _mm512_setzero_si512(), scale1 = scale0, scale2 = scale0, scale3 = scale0;
    for (int64_t segment = c0; segment < c1; segment += kSegment) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      const int64_t steps = kWholeSegments ? kSegment / 64 : (std::min(c1, segment + kSegment) - segment + 63) / 64;
#pragma GCC unroll 4
      for (int64_t step = 0; step < steps; ++step) {
        const int64_t i = segment + 64 * step;  // segment is a multiple of 256
        if (step % 2 == 0) {                    // i % 128 == 0
          scale0 = scale_subtrahend(s0[i / 128]);
          scale1 = scale_subtrahend(s1[i / 128]);
          scale2 = scale_subtrahend(s2[i / 128]);
          scale3 = scale_subtrahend(s3[i / 128]);
        }
        if (prefetch) {
          _mm_prefetch((const char*)(p0 + i) + kFourRowPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)(p1 + i) + kFourRowPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)(p2 + i) + kFourRowPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)(p3 + i) + kFourRowPrefetchBytesAhead, _MM_HINT_T0);
        }
        const __m512bh x01 = (__m512bh)_mm512_loadu_si512(x + i / 2);
        const __m512bh x23 = (__m512bh)_mm512_loadu_si512(x + i / 2 + 16);
        __m512bh steps01, steps23;
        decoder.decode(p0 + i, scale0, steps01, steps23);
        a0 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(a0, steps01, x01), steps23, x23);
        decoder.decode(p1 + i, scale1, steps01, steps23);
        a1 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(a1, steps01, x01), steps23, x23);
        decoder.decode(p2 + i, scale2, steps01, steps23);
        a2 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(a2, steps01, x01), steps23, x23);
        decoder.decode(p3 + i, scale3, steps01, steps23);
        a3 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(a3, steps01, x01), steps23, x23);
      }
      l0 = _mm512_add_ps(l0, a0);
      l1 = _mm512_add_ps(l1, a1);
      l2 = _mm512_add_ps(l2, a2);
      l3 = _mm512_add_ps(l3, a3);
    }
    sum0 += fold16_avx512(l0);
    sum1 += fold16_avx512(l1);
    sum2 += fold16_avx512(l2);
    sum3 += fold16_avx512(l3);
  }
  out[0] = sum0;
  out[1] = sum1;
  out[2] = sum2;
  out[3] = sum3;
}

template <int T>
DSV4_BF16_VBMI void fp8_pairs_rows(const Linear& w, const RowGroup& g, const uint32_t* pairs, double* sums) {
  const int64_t cols = w.cols;
  const uint8_t* p[4];
  const uint8_t* s[4];
  for (int r = 0; r < 4; ++r) {
    p[r] = w.data + g.row(r) * cols;
    s[r] = w.scale + g.row(r) / 128 * w.scale_cols;
  }
  const uint32_t* x[T];
  for (int t = 0; t < T; ++t) x[t] = pairs + t * (cols / 2);
  const E4m3ByteDecoder decoder = E4m3ByteDecoder::pairs();
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    if constexpr (T == 4) {
      // Sixteen accumulators, the eight token words and the decoder's
      // tables do not fit the 32 registers: the compiler kept two
      // accumulators on the stack, a store and a load in each one's chain
      // of multiply-adds every 64 columns. Two rows at a time over the
      // chunk (its tokens' words stay in L1) keep them all in registers;
      // each row and token gets the same steps in the same order. 2-6%
      // faster in cache on AMD Zen 5; three tokens fit and stay four rows
      // (split, 4-12% slower). docs/kernels.md, "FP8 four tokens, two rows
      // at a time".
      fp8_pairs_chunk<2, T>(decoder, p, s, c0, c1, x, g.has_next, sums);
      fp8_pairs_chunk<2, T>(decoder, p + 2, s + 2, c0, c1, x, g.has_next, sums + 2 * kMaxRegisterTokens);
    } else {
      fp8_pairs_chunk<4, T>(decoder, p, s, c0, c1, x, g.has_next, sums);
    }
  }
}

// The eight rows' chunk [c0, c1) as fp8_chunk_to_pairs lays it out, 64
// columns at a time by the byte tables (a 32-column tail by the fp16
// decoding): about nine vector uops per 64 weights where the fp16 decoding,
// its two scale multiplies and the packing take about twenty. With five to
// eight tokens that decoding was most of dot8_fp8_pairs' work: five tokens
// ran half again as long as four (docs/kernels.md, "FP8 eight rows with byte
// tables").
DSV4_BF16_VBMI void eight_rows_to_pairs_vbmi(const uint8_t* const* p, const uint8_t* scales, int64_t c0, int64_t c1,
                                             uint32_t (*decoded)[kChunk / 2]) {
  uint8_t* dst[kEightRows];
  for (int r = 0; r < kEightRows; ++r) dst[r] = reinterpret_cast<uint8_t*>(decoded[r]);
  eight_rows_by_byte_tables(E4m3ByteDecoder::pairs(), p, scales, c0, c1, dst, [&](int r, int64_t i, int64_t end) {
    fp8_chunk_to_pairs(p[r], scales, i, end, decoded[r] + (i - c0) / 2);
  });
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
  int64_t first[kMaxRegisterTokens], size[kMaxRegisterTokens];
  const int groups = eight_row_token_groups(n, first, size);
  const bool vbmi = avx512_vbmi_enabled();
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    const uint32_t* chunk[kEightRows];
    const char* ahead[kEightRows];
    if (vbmi) eight_rows_to_pairs_vbmi(p, scales, c0, c1, decoded);
    for (int r = 0; r < kEightRows; ++r) {
      if (!vbmi) fp8_chunk_to_pairs(p[r], scales, c0, c1, decoded[r]);
      chunk[r] = decoded[r];
      ahead[r] = reinterpret_cast<const char*>(c1 < cols ? p[r] + c1 : next_rows ? p[r] + next_rows * cols : nullptr);
    }
    for (int g = 0; g < groups; ++g) {
      const int64_t t = first[g];
      const uint32_t* x[3];
      for (int u = 0; u < 3; ++u) x[u] = pairs + std::min(t + u, n - 1) * (cols / 2);
      switch (size[g]) {
        case 3: group_chunk<3>(chunk, ahead, c0, c1, x, g, groups, sums + t); break;
        case 2: group_chunk<2>(chunk, ahead, c0, c1, x, g, groups, sums + t); break;
        default: group_chunk<1>(chunk, ahead, c0, c1, x, g, groups, sums + t); break;
      }
    }
  }
  for (int64_t t = 0; t < n; ++t)
    for (int r = 0; r < kEightRows; ++r) out[t * kEightRows + r] = sums[t][r];
}

DSV4_BF16_VBMI void dot4_fp8_pairs(const Linear& w, const RowGroup& g, const uint32_t* pairs, int64_t n, double* out,
                                   int64_t out_stride) {
  if (n == 1) {
    if (w.cols % kSegment == 0)
      fp8_pairs_one_token<true>(w, g, pairs, out);
    else
      fp8_pairs_one_token<false>(w, g, pairs, out);
    return;
  }
  double sums[4][kMaxRegisterTokens] = {};
  switch (n) {
    case 4: fp8_pairs_rows<4>(w, g, pairs, &sums[0][0]); break;
    case 3: fp8_pairs_rows<3>(w, g, pairs, &sums[0][0]); break;
    default: fp8_pairs_rows<2>(w, g, pairs, &sums[0][0]); break;
  }
  for (int r = 0; r < 4; ++r)
    for (int64_t t = 0; t < n; ++t) out[t * out_stride + r] = sums[r][t];
}

}  // namespace dsv4::linear_detail
