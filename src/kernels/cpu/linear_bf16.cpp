// The packed GEMM with AVX512-BF16's VDPBF16PS, in the dot and the outer
// form of gemm_driver.h. It gives the canonical bits of kernels/linear.h
// for the products where every operand is exact in bf16 and every product
// exact in fp32: FP8-rounded inputs (an e4m3 value times a power of two)
// against FP8 or FP4 weights (the same, with the block scale).
//
// Why it gives the same bits: VDPBF16PS adds to each fp32 lane two
// products, the odd bf16 element's first, each with one rounding (checked
// on Sapphire Rapids and on AMD Zen 5: bitwise equal to that emulation on
// 32 M random lanes). A product of two bf16 values whose significands have
// at most 8 bits is exact in fp32, so each addition rounds exactly as the
// canonical fused multiply-add does. A lane's chain over the steps k, k+1 of
// a chunk becomes one instruction whose odd element holds step k and whose
// even element holds step k+1. The instruction treats subnormal inputs and
// results as zero: where no nonzero input or weight lies below 2^-50, every
// value is a multiple of 2^-114 (2^-57 per operand), so no sum can be
// subnormal (bf16_dot_*_qualify check this per product; the rare product
// that fails takes the fp32 kernels, same bits).
//
// Panels and packed inputs hold pairs of steps as 32-bit words (step k in
// the high half), a chunk with an odd step count padded with a zero step
// (adding a zero product changes no sum); they use the fp32 layouts'
// places, each pair in the place of its first step.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/gemm_driver.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_BF16 DSV4_TARGET_AVX512_BF16

namespace dsv4::linear_detail {

namespace {

// Smallest biased fp32 exponent a nonzero operand may have: 2^-50.
constexpr uint32_t kMinExponent = 127 - 50;

// The word of a step pair: the high half is the first step's bf16 (exact:
// the float's low 16 bits are zero), the low half the second's.
inline uint32_t pair_word(float first, float second) {
  uint32_t a, b;
  std::memcpy(&a, &first, 4);
  std::memcpy(&b, &second, 4);
  return (a & 0xffff0000u) | (b >> 16);
}

DSV4_BF16 inline __m512i pair_words(__m512 first, __m512 second) {
  return _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(first), _mm512_set1_epi32(int(0xffff0000u))),
                         _mm512_srli_epi32(_mm512_castps_si512(second), 16));
}

// ---------------------------------------------------------------- dot form

// A row's storage positions [c0, c1) into its place in a dot-form group
// panel: for each pair of 16-position steps, rows_in_group rows of 16
// words, this row's at row_in_group * 16.
DSV4_BF16 void decode_row_dot_bf16(const Linear& w, int64_t row, int64_t c0, int64_t c1, float* group_panel,
                                   int row_in_group, int rows_in_group, float* tmp) {
  const int64_t steps = (c1 - c0) / 16;
  decode_chunk_avx512(w, row, c0, c1, tmp, 16);
  uint32_t* dst = reinterpret_cast<uint32_t*>(group_panel) + row_in_group * 16;
  for (int64_t k = 0; k < steps; k += 2, dst += rows_in_group * 16) {
    const __m512 second = k + 1 < steps ? _mm512_loadu_ps(tmp + (k + 1) * 16) : _mm512_setzero_ps();
    _mm512_storeu_si512(dst, pair_words(_mm512_loadu_ps(tmp + k * 16), second));
  }
}

// R rows x T tokens over `pairs` step pairs; adds each folded chunk to
// sum[r * sum_stride + t].
template <int R, int T>
DSV4_BF16 void micro_kernel_bf16(const uint32_t* w, const uint32_t* x, int64_t pairs, double* sum,
                                 int64_t sum_stride) {
  __m512 lanes[R][T];  // the segments' sums
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t p0 = 0; p0 < pairs; p0 += kSegmentPairs) {
    __m512 a[R][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    for (int64_t p = p0; p < std::min(pairs, p0 + kSegmentPairs); ++p, w += R * 16, x += T * 16) {
      __m512bh xv[T];
      for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x + t * 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + r * 16);
        for (int t = 0; t < T; ++t) a[r][t] = _mm512_dpbf16_ps(a[r][t], wv, xv[t]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
  }
  add_folds_avx512<R, T>(lanes, sum, sum_stride);
}

DSV4_BF16 void micro_kernel_any_bf16(int rows, int tokens, const float* w, const float* x, int64_t steps, double* sum,
                                     int64_t sum_stride) {
  const auto* wp = reinterpret_cast<const uint32_t*>(w);
  const auto* xp = reinterpret_cast<const uint32_t*>(x);
  const int64_t pairs = (steps + 1) / 2;
  with_block_size<kDotRows>(rows, [&](auto r) {
    with_block_size<kDotTokens>(tokens,
                                [&](auto t) { micro_kernel_bf16<r.value, t.value>(wp, xp, pairs, sum, sum_stride); });
  });
}

// -------------------------------------------------------------- outer form

// 16 rows (count real, the rest zeros) of positions [c0, c0 + 16 * steps)
// into an outer-form panel row group: lane l, pair p at
// panel[(l * pairs + p) * kPanelRows] (32 rows of words, these 16 rows at
// the offset the driver gave).
DSV4_BF16 void decode_rows_outer_bf16(const Linear& w, int64_t row, int count, int64_t c0, int64_t steps,
                                      float* rows_tmp, float* panel) {
  decode_16_rows_avx512(w, row, count, c0, steps, rows_tmp);
  const int64_t pairs = (steps + 1) / 2;
  uint32_t* out = reinterpret_cast<uint32_t*>(panel);
  for (int64_t p = 0; p < pairs; ++p) {
    __m512 first[16], second[16];
    for (int r = 0; r < 16; ++r) {
      first[r] = _mm512_loadu_ps(rows_tmp + r * steps * 16 + 2 * p * 16);
      second[r] = 2 * p + 1 < steps ? _mm512_loadu_ps(rows_tmp + r * steps * 16 + (2 * p + 1) * 16)
                                    : _mm512_setzero_ps();
    }
    transpose16x16(first);
    transpose16x16(second);
    for (int l = 0; l < 16; ++l)
      _mm512_storeu_si512(out + (l * pairs + p) * kPanelRows, pair_words(first[l], second[l]));
  }
}

// One lane's chains over `pairs` step pairs for 32 rows and T tokens; the
// fp32 results go to out[t * 32 + row] (as outer_lane_kernel).
template <int T>
DSV4_BF16 void outer_lane_kernel_bf16(const uint32_t* w, const uint32_t* x, int64_t pairs, float* out) {
  // The lane's segment sums go into out, which starts at zero.
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(out + t * kPanelRows, _mm512_setzero_ps());
    _mm512_storeu_ps(out + t * kPanelRows + 16, _mm512_setzero_ps());
  }
  for (int64_t p0 = 0; p0 < pairs; p0 += kSegmentPairs) {
    __m512 a[T][2];
    for (auto& t : a) t[0] = t[1] = _mm512_setzero_ps();
    for (int64_t p = p0; p < std::min(pairs, p0 + kSegmentPairs); ++p, w += kPanelRows, x += T) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + 16);
      for (int t = 0; t < T; ++t) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(x[t]));
        a[t][0] = _mm512_dpbf16_ps(a[t][0], w0, xb);
        a[t][1] = _mm512_dpbf16_ps(a[t][1], w1, xb);
      }
    }
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h) {
        float* o = out + t * kPanelRows + 16 * h;
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), a[t][h]));
      }
  }
}

DSV4_BF16 void outer_lane_kernel_any_bf16(int tokens, const uint32_t* w, const uint32_t* x, int64_t pairs, float* out) {
  with_block_size<kOuterTokens>(tokens, [&](auto t) { outer_lane_kernel_bf16<t.value>(w, x, pairs, out); });
}

}  // namespace

bool bf16_dot_weights_qualify(const Linear& w, int64_t row_begin, int64_t row_end) {
  if (!w.quantize_input) return false;
  const uint8_t* first;
  int64_t count;
  int min_scale;
  if (w.format == WeightFormat::FP8_BLOCK128) {
    first = w.scale + row_begin / 128 * w.scale_cols;
    count = ((row_end + 127) / 128 - row_begin / 128) * w.scale_cols;
    min_scale = kBf16DotMinFp8Scale;
  } else if (w.format == WeightFormat::FP4_BLOCK32) {
    first = w.scale + row_begin * w.scale_cols;
    count = (row_end - row_begin) * w.scale_cols;
    min_scale = kBf16DotMinFp4Scale;
  } else {
    return false;  // BF16 weights would need a scan of every value; F32 is not exact in bf16
  }
  return std::all_of(first, first + count, [&](uint8_t s) { return s >= min_scale; });
}

bool bf16_dot_inputs_qualify(const float* xs, int64_t count) {
  uint32_t tiny = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, xs + i, 4);
    const uint32_t magnitude = bits & 0x7fffffffu;
    tiny |= uint32_t(magnitude != 0 && (magnitude >> 23) < kMinExponent);
  }
  return tiny == 0;
}

DSV4_BF16 void pair_token_steps(const float* src, int64_t cols, uint32_t* dst, const uint32_t* lane_order) {
  const __m512i order = lane_order ? _mm512_loadu_si512(lane_order) : _mm512_setzero_si512();
  for (int64_t b = 0; b < cols; b += 32) {
    __m512i words = pair_words(_mm512_loadu_ps(src + b), _mm512_loadu_ps(src + b + 16));
    if (lane_order) words = _mm512_permutexvar_epi32(order, words);
    _mm512_storeu_si512(dst + b / 2, words);
  }
}

void pack_token_dot_bf16(const float* src, int64_t cols, int64_t n, int64_t t, float* xp) {
  const int64_t first = t / kDotTokens * kDotTokens;
  const int group = int(std::min<int64_t>(kDotTokens, n - first));
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t steps = (std::min(cols, c0 + kChunk) - c0) / 16;
    uint32_t* dst = reinterpret_cast<uint32_t*>(xp + dot_packed_index(cols, first, group, 0, c0)) + (t - first) * 16;
    for (int64_t k = 0; k < steps; k += 2, dst += group * 16)
      for (int l = 0; l < 16; ++l)
        dst[l] = pair_word(src[c0 + k * 16 + l], k + 1 < steps ? src[c0 + (k + 1) * 16 + l] : 0.0f);
  }
}

void pack_token_outer_bf16(const float* src, int64_t cols, int64_t n, int64_t t, float* xp) {
  const int64_t first = t / kOuterTokens * kOuterTokens;
  const int group = int(std::min<int64_t>(kOuterTokens, n - first));
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t steps = (std::min(cols, c0 + kChunk) - c0) / 16, pairs = (steps + 1) / 2;
    uint32_t* dst = reinterpret_cast<uint32_t*>(xp + outer_packed_index(cols, first, group, 0, c0)) + (t - first);
    for (int l = 0; l < 16; ++l)
      for (int64_t p = 0; p < pairs; ++p)
        dst[(l * pairs + p) * group] =
            pair_word(src[c0 + 2 * p * 16 + l], 2 * p + 1 < steps ? src[c0 + (2 * p + 1) * 16 + l] : 0.0f);
  }
}

void packed_gemm_dot_bf16(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                          int64_t y_stride, int threads) {
  packed_gemm_dot(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int64_t c0, int64_t c1, float* group_panel, int row_in_group, int rows_in_group) DSV4_BF16 {
        float* tmp = thread_scratch_array<float>(ScratchSlot::GemmRows, kChunk);
        decode_row_dot_bf16(w, row, c0, c1, group_panel, row_in_group, rows_in_group, tmp);
      },
      micro_kernel_any_bf16);
}

void packed_gemm_outer_bf16(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                            int64_t y_stride, int threads) {
  packed_gemm_outer(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int count, int64_t c0, int64_t steps, float* rows_tmp, float* panel)
          DSV4_BF16 { decode_rows_outer_bf16(w, row, count, c0, steps, rows_tmp, panel); },
      [](int group, const float* pg, const float* xg, int64_t steps, float* lanes) DSV4_BF16 {
        const int64_t pairs = (steps + 1) / 2;
        const auto* wp = reinterpret_cast<const uint32_t*>(pg);
        const auto* xp32 = reinterpret_cast<const uint32_t*>(xg);
        for (int l = 0; l < 16; ++l)
          outer_lane_kernel_any_bf16(group, wp + l * pairs * kPanelRows, xp32 + l * pairs * group, pairs,
                                     lanes + l * group * kPanelRows);
      },
      fold_panel_lanes_avx512);
}

}  // namespace dsv4::linear_detail
