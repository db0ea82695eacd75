// The AVX-512 weight-product kernels: one row against one token, the
// decoders of whole chunks, and the packed GEMM in its dot and outer forms
// (gemm_driver.h). The register path is in linear_avx512_rows.cpp. Same
// bits as the scalar path (kernels/linear.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/gemm_driver.h"
#include "kernels/cpu/linear_avx512_decode.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_AVX512 DSV4_TARGET_AVX512

namespace dsv4::linear_detail {

DSV4_AVX512 void decode_row_avx512(const Linear& w, int64_t row, float* out) {
  for (int64_t i = 0; i < w.cols; i += 16) _mm512_storeu_ps(out + i, decode16_avx512(w, row, i));
}

DSV4_AVX512 double dot_avx512(const Linear& w, int64_t row, const float* x) {
  double sum = 0.0;
  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunk) {
    const int64_t c1 = std::min(w.cols, c0 + kChunk);
    __m512 a = _mm512_setzero_ps();
    for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
      __m512 segment = _mm512_setzero_ps();
      for (int64_t i = s0; i < std::min(c1, s0 + kSegment); i += 16)
        segment = _mm512_fmadd_ps(decode16_avx512(w, row, i), _mm512_loadu_ps(x + i), segment);
      a = _mm512_add_ps(a, segment);
    }
    sum += fold16_avx512(a);
  }
  return sum;
}

// Storage positions [c0, c1) of one row, decoded with the fast decoders into
// dst, dst + step, dst + 2 * step, ... (16 floats each).
DSV4_AVX512 void decode_chunk_avx512(const Linear& w, int64_t row, int64_t c0, int64_t c1, float* dst, int64_t step) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16:
      for (int64_t i = c0; i < c1; i += 16, dst += step) _mm512_storeu_ps(dst, decode16_avx512(w, row, i));
      return;
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* p = w.data + row * n;
      for (int64_t b = c0; b < c1; b += 128) {
        const uint8_t s = w.scale[(row / 128) * w.scale_cols + b / 128];
        const int64_t end = std::min(c1, b + 128);
        if (s <= kMaxHalfPathScale) {
          const __m512 sc = _mm512_set1_ps(e8m0_to_float(s) * 256.0f);
          for (int64_t i = b; i < end; i += 16, dst += step)
            _mm512_storeu_ps(dst, e4m3_to_ps_via_half(_mm_loadu_si128((const __m128i*)(p + i)), sc));
        } else {
          const __m512 sc = _mm512_set1_ps(e8m0_to_float(s));
          for (int64_t i = b; i < end; i += 16, dst += step)
            _mm512_storeu_ps(dst, e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p + i)), sc));
        }
      }
      return;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* p = w.data + row * (n / 2);
      const E2m1Tables& tables = e2m1_tables();
      for (int64_t b = c0; b < c1; b += 32, dst += 2 * step) {
        __m512 even, odd;
        e2m1_block_avx512(p + b / 2, e2m1_table_avx512(tables, w.scale[row * w.scale_cols + b / 32]), even, odd);
        _mm512_storeu_ps(dst, even);
        _mm512_storeu_ps(dst + step, odd);
      }
      return;
    }
  }
}

DSV4_AVX512 void decode_16_rows_avx512(const Linear& w, int64_t row, int count, int64_t c0, int64_t steps,
                                       float* rows_tmp) {
  for (int r = 0; r < 16; ++r) {
    float* dst = rows_tmp + r * steps * 16;
    if (r < count)
      decode_chunk_avx512(w, row + r, c0, c0 + steps * 16, dst, 16);
    else
      std::fill_n(dst, steps * 16, 0.0f);
  }
}

namespace {

// Rows [row, row + count) (count <= 16; the rest of the 16 are zeros),
// storage positions [c0, c0 + 16 * steps), into a panel row group: for lane
// l and step k, the 16 rows land at panel[(l * steps + k) * kPanelRows].
DSV4_AVX512 void decode_rows_to_panel(const Linear& w, int64_t row, int count, int64_t c0, int64_t steps,
                                      float* rows_tmp, float* panel) {
  decode_16_rows_avx512(w, row, count, c0, steps, rows_tmp);
  for (int64_t k = 0; k < steps; ++k) {
    __m512 v[16];
    for (int r = 0; r < 16; ++r) v[r] = _mm512_loadu_ps(rows_tmp + r * steps * 16 + k * 16);
    transpose16x16(v);
    for (int l = 0; l < 16; ++l) _mm512_storeu_ps(panel + (l * steps + k) * kPanelRows, v[l]);
  }
}

// One lane's FMA chains over `steps` steps for 32 rows (w: 32 floats per
// step) and T tokens (x: T floats per step); the chains' fp32 results go to
// out[t * 32 + row].
template <int T>
DSV4_AVX512 void outer_lane_kernel(const float* w, const float* x, int64_t steps, float* out) {
  // The lane's segment sums go into out, which starts at zero.
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(out + t * kPanelRows, _mm512_setzero_ps());
    _mm512_storeu_ps(out + t * kPanelRows + 16, _mm512_setzero_ps());
  }
  for (int64_t k0 = 0; k0 < steps; k0 += kSegmentSteps) {
    __m512 a[T][2];
    for (auto& t : a) t[0] = t[1] = _mm512_setzero_ps();
    for (int64_t k = k0; k < std::min(steps, k0 + kSegmentSteps); ++k, w += kPanelRows, x += T) {
      const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
      for (int t = 0; t < T; ++t) {
        const __m512 xb = _mm512_set1_ps(x[t]);
        a[t][0] = _mm512_fmadd_ps(w0, xb, a[t][0]);
        a[t][1] = _mm512_fmadd_ps(w1, xb, a[t][1]);
      }
    }
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h) {
        float* o = out + t * kPanelRows + 16 * h;
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), a[t][h]));
      }
  }
}

}  // namespace

// The 16 lanes of a row group x T tokens (lane l's results at
// lanes[(l * T + t) * 32 + row]), folded with fold16_avx512's tree, eight
// rows at a time, and added to sums[t * sums_stride + row].
DSV4_AVX512 void fold_lanes_avx512(const float* lanes, int tokens, double* sums, int64_t sums_stride, int width) {
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < width; h += 8) {
      __m512d l[16];
      for (int q = 0; q < 16; ++q) l[q] = _mm512_cvtps_pd(_mm256_loadu_ps(lanes + (q * tokens + t) * kPanelRows + h));
      for (int q = 0; q < 8; ++q) l[q] = _mm512_add_pd(l[q], l[q + 8]);
      for (int q = 0; q < 4; ++q) l[q] = _mm512_add_pd(l[q], l[q + 4]);
      for (int q = 0; q < 2; ++q) l[q] = _mm512_add_pd(l[q], l[q + 2]);
      double* s = sums + t * sums_stride + h;
      _mm512_storeu_pd(s, _mm512_add_pd(_mm512_loadu_pd(s), _mm512_add_pd(l[0], l[1])));
    }
}

namespace {

DSV4_AVX512 void outer_lane_kernel_any(int tokens, const float* w, const float* x, int64_t steps, float* out) {
  with_block_size<kOuterTokens>(tokens, [&](auto t) { outer_lane_kernel<t.value>(w, x, steps, out); });
}

// R rows of a panel against T tokens of a packed group, `steps` x 16
// positions; the folded chunk is added to sum[r * sum_stride + t].
template <int R, int T>
DSV4_AVX512 void micro_kernel_avx512(const float* w, const float* x, int64_t steps, double* sum, int64_t sum_stride) {
  __m512 lanes[R][T];  // the segments' sums
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < steps; k0 += kSegmentSteps) {
    __m512 a[R][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    for (int64_t s = k0; s < std::min(steps, k0 + kSegmentSteps); ++s, w += R * 16, x += T * 16) {
      __m512 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * 16);
      for (int r = 0; r < R; ++r) {
        const __m512 wv = _mm512_loadu_ps(w + r * 16);
        for (int t = 0; t < T; ++t) a[r][t] = _mm512_fmadd_ps(wv, xv[t], a[r][t]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
  }
  add_folds_avx512<R, T>(lanes, sum, sum_stride);
}

DSV4_AVX512 void micro_kernel_any_avx512(int rows, int tokens, const float* w, const float* x, int64_t steps,
                                         double* sum, int64_t sum_stride) {
  with_block_size<kDotRows>(rows, [&](auto r) {
    with_block_size<kDotTokens>(tokens,
                                [&](auto t) { micro_kernel_avx512<r.value, t.value>(w, x, steps, sum, sum_stride); });
  });
}

}  // namespace

// Y[t][o] for rows [row_begin, row_begin + out) and n packed tokens (xp),
// on `threads` threads.
DSV4_AVX512 void packed_gemm_dot_avx512(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n,
                                        float* y, int64_t y_stride, int threads) {
  packed_gemm_dot(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int64_t c0, int64_t c1, float* group_panel, int row_in_group, int rows_in_group)
          DSV4_AVX512 { decode_chunk_avx512(w, row, c0, c1, group_panel + row_in_group * 16, rows_in_group * 16); },
      micro_kernel_any_avx512);
}

void packed_gemm_outer_avx512(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                              int64_t y_stride, int threads) {
  packed_gemm_outer(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int count, int64_t c0, int64_t steps, float* rows_tmp, float* panel)
          DSV4_AVX512 { decode_rows_to_panel(w, row, count, c0, steps, rows_tmp, panel); },
      [](int group, const float* pg, const float* xg, int64_t steps, float* lanes) DSV4_AVX512 {
        for (int l = 0; l < 16; ++l)
          outer_lane_kernel_any(group, pg + l * steps * kPanelRows, xg + l * steps * group, steps,
                                lanes + l * group * kPanelRows);
      },
      fold_panel_lanes_avx512);
}

}  // namespace dsv4::linear_detail
