// The eight-row kernels in fp32: eight rows against the tokens in pairs or
// triples, so that an input vector feeds eight accumulators
// (docs/kernels.md, "Eight rows"). BF16 rows as they are stored (a decode
// batch's LM head), and FP8 rows against 9-16 tokens whose inputs are not
// for VDPBF16PS (V4's wo_a at batch 16, verify steps; every FP8 product of
// that size where VDPBF16PS is off), decoded once per chunk into bf16 in an
// L1 buffer and then run by the BF16 kernel's step loop. Same bits as the
// scalar path (kernels/linear.h): each (row, token) sees the sequence
// dot_avx512 gives it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/numeric.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/fp8_byte_tables.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_AVX512 DSV4_TARGET_AVX512

namespace dsv4::linear_detail {

namespace {

// BF16 rows with many tokens (a decode batch's LM head): eight rows against
// the tokens in pairs, each pair widening the rows' bf16 itself. In the
// four-row kernel every group of four tokens loads its inputs from L2 (16
// tokens of a chunk are 64 KB), one input load per four FMAs, and the first
// group also stores the widened rows for the others; here an input load
// feeds eight FMAs, the raw rows of a chunk (16 KB) stay in L1 for the later
// pairs, and nothing is stored (docs/kernels.md, "Eight rows"). From
// kEightRowTriplesMinTokens tokens most groups take three tokens: 24
// accumulators, each row widened as it is used (one register for it), so a
// widening feeds three FMAs instead of two (docs/kernels.md, "Token
// triples"). Each (row, token) still sees the sequence dot_avx512 gives it:
// same bits.
//
// p[r][0] holds column p_first of row r: 0 for the matrix's rows, the
// chunk's first column for a buffer (dot8_fp8_as_bf16_avx512). ahead[r]
// (null: none) is where row r's next bytes start (its next chunk, or the
// thread's next rows), kAheadBytes bytes per column: the rows' own bf16,
// or the FP8 bytes the buffered rows came from.
template <int T, int kAheadBytes = 2>
DSV4_AVX512 inline void dot8_bf16_group_chunk(const uint16_t* const* p, int64_t p_first, const uint8_t* const* ahead,
                                              int64_t c0, int64_t c1, const float* const* x, int group, int groups,
                                              double (*sums)[kEightRows]) {
  const __m512i widen = bf16_widen_index();
  // The rows' next bytes, one cache line per row every 64 / kAheadBytes
  // columns, shared out among the groups: group g takes rows g, g + groups,
  // and so on. With four groups or more (ten tokens or more) that is one
  // or two rows, and one prefetch per 16-column step, the two rows' in turn
  // (the second a copy of the first where the group has one), costs fewer
  // instructions than a loop over the group's rows every other step with
  // its null tests: the 16-token LM head 1-5% faster (docs/kernels.md,
  // "Eight-row prefetching").
  const bool alternate = groups >= 4 && ahead[0];
  const uint8_t* const ahead_even = ahead[group];
  const uint8_t* const ahead_odd = group + groups < kEightRows ? ahead[group + groups] : ahead_even;
  __m512 lanes[kEightRows][T];  // the segments' sums
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
    __m512 a[kEightRows][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    for (int64_t i = s0; i < std::min(c1, s0 + kSegment); i += 16) {
      if (alternate)
        _mm_prefetch((const char*)(((i - c0) & 16 ? ahead_odd : ahead_even) + (i - c0) * kAheadBytes), _MM_HINT_T0);
      else if ((i - c0) % (64 / kAheadBytes) == 0)
        for (int r = group; r < kEightRows; r += groups)
          if (ahead[r]) _mm_prefetch((const char*)(ahead[r] + (i - c0) * kAheadBytes), _MM_HINT_T0);
      if constexpr (T == 3) {
        __m512 xv[T];
        for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x[t] + i);
        for (int r = 0; r < kEightRows; ++r) {
          const __m512 v = bf16x16_to_ps_avx512(p[r] + (i - p_first), widen);
          for (int t = 0; t < T; ++t) a[r][t] = _mm512_fmadd_ps(v, xv[t], a[r][t]);
        }
      } else {
        __m512 v[kEightRows];
        for (int r = 0; r < kEightRows; ++r) v[r] = bf16x16_to_ps_avx512(p[r] + (i - p_first), widen);
        for (int t = 0; t < T; ++t) {
          const __m512 xv = _mm512_loadu_ps(x[t] + i);
          for (int r = 0; r < kEightRows; ++r) a[r][t] = _mm512_fmadd_ps(v[r], xv, a[r][t]);
        }
      }
    }
    for (int r = 0; r < kEightRows; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
    // The lanes live in memory (the empty asm says it changed them there):
    // beside 8 x T accumulators and the eight widened rows they do not fit
    // the registers, and left to itself the compiler spilled accumulators
    // inside the step loop instead (the 16-token head 11% slower than
    // before the segments, 6% with this; docs/kernels.md).
    if constexpr (T >= 2) asm volatile("" : "+m"(lanes));
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < kEightRows; r += 4)
      _mm256_storeu_pd(&sums[t][r],
                       _mm256_add_pd(_mm256_loadu_pd(&sums[t][r]),
                                     fold16x4_avx512(lanes[r][t], lanes[r + 1][t], lanes[r + 2][t], lanes[r + 3][t])));
}

// One chunk [c0, c1) of the rows p[r] (bf16 from column p_first) against
// every token group in turn.
template <int kAheadBytes>
DSV4_AVX512 inline void eight_row_chunk(const uint16_t* const* p, int64_t p_first, const uint8_t* const* ahead,
                                        int64_t c0, int64_t c1, const float* xs, int64_t n, int64_t cols,
                                        const int64_t* first, const int64_t* size, int groups,
                                        double (*sums)[kEightRows]) {
  for (int g = 0; g < groups; ++g) {
    const int64_t t = first[g];
    const float* x[3];
    for (int u = 0; u < 3; ++u) x[u] = xs + std::min(t + u, n - 1) * cols;
    switch (size[g]) {
      case 3: dot8_bf16_group_chunk<3, kAheadBytes>(p, p_first, ahead, c0, c1, x, g, groups, sums + t); break;
      case 2: dot8_bf16_group_chunk<2, kAheadBytes>(p, p_first, ahead, c0, c1, x, g, groups, sums + t); break;
      default: dot8_bf16_group_chunk<1, kAheadBytes>(p, p_first, ahead, c0, c1, x, g, groups, sums + t); break;
    }
  }
}

// The eight rows' FP8 chunk [c0, c1) as bf16 in column order, by the byte
// tables where the CPU has AVX512-VBMI.
DSV4_TARGET_AVX512_VBMI void eight_rows_to_bf16_vbmi(const uint8_t* const* p, const uint8_t* scales, int64_t c0,
                                                     int64_t c1, uint16_t (*decoded)[kChunk]) {
  uint8_t* dst[kEightRows];
  for (int r = 0; r < kEightRows; ++r) dst[r] = reinterpret_cast<uint8_t*>(decoded[r]);
  eight_rows_by_byte_tables(E4m3ByteDecoder::columns(), p, scales, c0, c1, dst, [&](int r, int64_t i, int64_t end) {
    fp8_words_by_fp16(p[r], scales, i, end, e4m3_byte_tables().column_words, dst[r] + 2 * (i - c0));
  });
}

}  // namespace

DSV4_AVX512 void dot8_bf16_avx512(const Linear& w, const int64_t* rows, int64_t next_rows, const float* xs, int64_t n,
                                  double* out) {
  const int64_t cols = w.cols;
  const uint16_t* p[kEightRows];
  for (int r = 0; r < kEightRows; ++r) p[r] = reinterpret_cast<const uint16_t*>(w.data) + rows[r] * cols;
  double sums[kMaxRegisterTokens][kEightRows] = {};
  int64_t first[kMaxRegisterTokens], size[kMaxRegisterTokens];
  const int groups = eight_row_token_groups(n, first, size);
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    const uint8_t* ahead[kEightRows];
    for (int r = 0; r < kEightRows; ++r)
      ahead[r] = reinterpret_cast<const uint8_t*>(c1 < cols   ? p[r] + c1
                                                  : next_rows ? p[r] + next_rows * cols
                                                              : nullptr);
    eight_row_chunk<2>(p, 0, ahead, c0, c1, xs, n, cols, first, size, groups, sums);
  }
  for (int64_t t = 0; t < n; ++t)
    for (int r = 0; r < kEightRows; ++r) out[t * kEightRows + r] = sums[t][r];
}

// Why the buffer holds bf16: an e4m3 weight has at most four significant
// bits, so the decoded weight (e4m3 times the block's power-of-two scale) is
// exact in bf16 wherever it is a normal fp32 value, and widening it back
// gives the float the other paths multiply. The FP8 four-row kernel
// decodes each chunk into an fp32 buffer for its groups of four tokens and
// runs at about half the FMA peak with 16 tokens; the BF16 eight-row step
// loop, which widens its rows from L1 as it uses them, runs faster, and a
// chunk's eight rows take 16 KB of L1 as bf16 against 32 KB as floats
// (docs/kernels.md, "FP8 with 9-16 tokens through bf16").
DSV4_AVX512 void dot8_fp8_as_bf16_avx512(const Linear& w, const int64_t* rows, int64_t next_rows, const float* xs,
                                         int64_t n, double* out) {
  const int64_t cols = w.cols;
  const uint8_t* p[kEightRows];
  for (int r = 0; r < kEightRows; ++r) p[r] = w.data + rows[r] * cols;
  const uint8_t* scales = w.scale + rows[0] / 128 * w.scale_cols;
  alignas(64) uint16_t decoded[kEightRows][kChunk];
  double sums[kMaxRegisterTokens][kEightRows] = {};
  int64_t first[kMaxRegisterTokens], size[kMaxRegisterTokens];
  const int groups = eight_row_token_groups(n, first, size);
  const bool vbmi = avx512_vbmi_enabled();
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    if (vbmi) {
      eight_rows_to_bf16_vbmi(p, scales, c0, c1, decoded);
    } else {
      for (int r = 0; r < kEightRows; ++r)
        fp8_words_by_fp16(p[r], scales, c0, c1, e4m3_byte_tables().column_words,
                          reinterpret_cast<uint8_t*>(decoded[r]));
    }
    const uint16_t* q[kEightRows];
    const uint8_t* ahead[kEightRows];
    for (int r = 0; r < kEightRows; ++r) {
      q[r] = decoded[r];
      ahead[r] = c1 < cols ? p[r] + c1 : next_rows ? p[r] + next_rows * cols : nullptr;
    }
    eight_row_chunk<1>(q, c0, ahead, c0, c1, xs, n, cols, first, size, groups, sums);
  }
  for (int64_t t = 0; t < n; ++t)
    for (int r = 0; r < kEightRows; ++r) out[t * kEightRows + r] = sums[t][r];
}

}  // namespace dsv4::linear_detail
