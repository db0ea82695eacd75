// The AVX2 (+FMA, F16C) weight-product kernels: one row against up to four
// tokens in registers, four rows against one token as four streams, and the
// packed GEMM's outer form (gemm_driver.h) for prefill on CPUs without
// AVX-512. Same bits as the scalar path (kernels/linear.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/scratch.h"
#include "kernels/cpu/gemm_driver.h"
#include "kernels/cpu/linear_internal.h"

// Every CPU with AVX2 and FMA also has F16C (fp16 conversions).
#define DSV4_AVX2 DSV4_TARGET_AVX2

namespace dsv4::linear_detail {

namespace {

// e4m3 read as the top bits of an fp16 (see e4m3_to_ps_via_half, its AVX-512
// twin): 16 codes as two vectors of 8 floats, each the code's value times
// 2^-8, for inputs that carry the block scale (times 256) instead (see
// rows_one_token_avx2). Less than half the uops of e4m3_to_ps_avx2
// (docs/kernels.md).
DSV4_AVX2 inline void e4m3x16_to_ps_unscaled_avx2(const uint8_t* bytes16, __m256& lo, __m256& hi) {
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)bytes16)), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0xBFFF)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// The same times scale256 (the block scale times 256): the weights' values.
DSV4_AVX2 inline void e4m3x16_to_ps_via_half_avx2(const uint8_t* bytes16, __m256 scale256, __m256& lo, __m256& hi) {
  e4m3x16_to_ps_unscaled_avx2(bytes16, lo, hi);
  lo = _mm256_mul_ps(lo, scale256);
  hi = _mm256_mul_ps(hi, scale256);
}

DSV4_AVX2 inline __m256 e4m3_to_ps_avx2(__m128i bytes8, __m256 scale) {
  // Normal codes: the e4m3 exponent and mantissa land in a float whose
  // exponent field is rebiased by +120. Subnormal codes (exponent 0) are built
  // as 1.m * 2^-6 minus 2^-6. No float subnormals are ever touched (they
  // would cost microcode assists).
  __m256i b = _mm256_cvtepu8_epi32(bytes8);
  __m256i em = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  __m256i is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(em, _mm256_set1_epi32(0x78)), _mm256_setzero_si256());
  __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23));
  bits = _mm256_add_epi32(bits, _mm256_and_si256(is_sub, _mm256_set1_epi32(1 << 23)));
  __m256 v = _mm256_castsi256_ps(bits);
  v = _mm256_sub_ps(v, _mm256_and_ps(_mm256_castsi256_ps(is_sub), _mm256_set1_ps(0x1p-6f)));
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
  return _mm256_mul_ps(v, scale);
}

// 8 e2m1 codes, the low nibbles of 8 widened bytes or, when `high`, their
// high ones, from a block's scaled table (E2m1Tables) held as codes 0-7 and
// 8-15 in a vector each: vpermps reads only the low 3 bits of an index, the
// nibble's top bit picks the vector: fewer uops than scaling each value
// (docs/kernels.md), and the scalar decoder's floats, NaN scale included.
DSV4_AVX2 inline __m256 e2m1x8_avx2(__m256i bytes, bool high, __m256 positive, __m256 negative) {
  const __m256i index = high ? _mm256_srli_epi32(bytes, 4) : bytes;
  const __m256i top_bit = high ? _mm256_slli_epi32(bytes, 24) : _mm256_slli_epi32(bytes, 28);
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(positive, index), _mm256_permutevar8x32_ps(negative, index),
                          _mm256_castsi256_ps(top_bit));
}

// The 32 weights of an FP4 block (16 bytes: storage positions 0-15 in the
// low nibbles, 16-31 in the high ones) from the block's top-half bytes
// (E2m1Tables::top_half_bytes, where top_halves_exact): positions 0-7, 8-15
// into low[0], low[1] and 16-23, 24-31 into high[0], high[1]. Two byte
// lookups give each value's top 16 bits, an interleave with zeros the float:
// no float permutes, which some AVX2 CPUs (AMD Zen 1) run at a quarter of
// the rate (docs/kernels.md). The same floats as e2m1x8_avx2.
DSV4_AVX2 inline void e2m1x32_top_halves_avx2(const uint8_t* p, const uint8_t* table, __m256 (&low)[2],
                                              __m256 (&high)[2]) {
  const __m128i bytes = _mm_loadu_si128((const __m128i*)p), nibble = _mm_set1_epi8(0x0F);
  const __m128i low_bytes = _mm_load_si128((const __m128i*)table);
  const __m128i high_bytes = _mm_load_si128((const __m128i*)(table + 16));
  const __m128i zero = _mm_setzero_si128();
  auto widen = [&](__m128i codes, __m256 (&out)[2]) DSV4_AVX2 {
    const __m128i l = _mm_shuffle_epi8(low_bytes, codes), h = _mm_shuffle_epi8(high_bytes, codes);
    const __m128i words[2] = {_mm_unpacklo_epi8(l, h), _mm_unpackhi_epi8(l, h)};
    for (int k = 0; k < 2; ++k)
      out[k] = _mm256_castsi256_ps(
          _mm256_set_m128i(_mm_unpackhi_epi16(zero, words[k]), _mm_unpacklo_epi16(zero, words[k])));
  };
  widen(_mm_and_si128(bytes, nibble), low);
  widen(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), high);
}

// The 32 weights of the FP4 block at p with ue8m0 scale `scale`, as
// e2m1x32_top_halves_avx2 lays them out: by byte lookups where they give
// the exact floats, by the float table (e2m1x8_avx2) otherwise.
DSV4_AVX2 inline void e2m1x32_avx2(const E2m1Tables& tables, const uint8_t* p, uint8_t scale, __m256 (&low)[2],
                                   __m256 (&high)[2]) {
  if (tables.top_halves_exact[scale]) {
    e2m1x32_top_halves_avx2(p, tables.top_half_bytes[scale], low, high);
    return;
  }
  const float* table = tables.values[scale];
  const __m256 positive = _mm256_load_ps(table), negative = _mm256_load_ps(table + 8);
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
  low[0] = e2m1x8_avx2(b0, false, positive, negative);
  low[1] = e2m1x8_avx2(b1, false, positive, negative);
  high[0] = e2m1x8_avx2(b0, true, positive, negative);
  high[1] = e2m1x8_avx2(b1, true, positive, negative);
}

// Weights [i, i+16) of a row as two vectors of 8 floats, scale applied.
DSV4_AVX2 inline void decode16_avx2(const Linear& w, int64_t row, int64_t i, __m256& lo, __m256& hi) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: {
      const float* p = reinterpret_cast<const float*>(w.data) + row * n + i;
      lo = _mm256_loadu_ps(p);
      hi = _mm256_loadu_ps(p + 8);
      return;
    }
    case WeightFormat::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + row * n + i;
      lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
      hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 8))), 16));
      return;
    }
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t s = w.scale[(row / 128) * w.scale_cols + i / 128];
      if (s <= kMaxHalfPathScale)
        return e4m3x16_to_ps_via_half_avx2(w.data + row * n + i, _mm256_set1_ps(e8m0_to_float(s) * 256.0f), lo, hi);
      const __m256 sc = _mm256_set1_ps(e8m0_to_float(s));
      const __m128i b = _mm_loadu_si128((const __m128i*)(w.data + row * n + i));
      lo = e4m3_to_ps_avx2(b, sc);
      hi = e4m3_to_ps_avx2(_mm_srli_si128(b, 8), sc);
      return;
    }
    case WeightFormat::FP4_BLOCK32: {
      // Storage order: the block's 16 low nibbles, then its 16 high ones.
      const float* table = e2m1_tables().values[w.scale[row * w.scale_cols + i / 32]];
      const __m256 positive = _mm256_load_ps(table), negative = _mm256_load_ps(table + 8);
      const uint8_t* p = w.data + row * (n / 2) + i / 32 * 16;
      const bool high = i % 32 != 0;
      lo = e2m1x8_avx2(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)), high, positive, negative);
      hi = e2m1x8_avx2(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))), high, positive, negative);
      return;
    }
  }
  lo = hi = _mm256_setzero_ps();  // not a format: unreachable
}

}  // namespace

// FP8 and FP4 rows fetch each scale once per scale block, where
// decode16_avx2 fetches it for every 16 weights (the few-token kernels
// decode whole rows with it, docs/kernels.md).
DSV4_AVX2 void decode_row_avx2(const Linear& w, int64_t row, float* out) {
  const int64_t cols = w.cols;
  if (w.format == WeightFormat::FP8_BLOCK128) {
    const uint8_t* p = w.data + row * cols;
    for (int64_t b = 0; b < cols; b += 128) {
      const uint8_t scale = w.scale[(row / 128) * w.scale_cols + b / 128];
      const __m256 scale256 = _mm256_set1_ps(e8m0_to_float(scale) * 256.0f);
      for (int64_t i = b; i < std::min(cols, b + 128); i += 16) {
        __m256 lo, hi;
        if (scale <= kMaxHalfPathScale)
          e4m3x16_to_ps_via_half_avx2(p + i, scale256, lo, hi);
        else
          decode16_avx2(w, row, i, lo, hi);
        _mm256_storeu_ps(out + i, lo);
        _mm256_storeu_ps(out + i + 8, hi);
      }
    }
    return;
  }
  if (w.format == WeightFormat::FP4_BLOCK32) {
    const E2m1Tables& tables = e2m1_tables();
    for (int64_t b = 0; b < cols; b += 32) {
      __m256 low[2], high[2];
      e2m1x32_avx2(tables, w.data + row * (cols / 2) + b / 2, w.scale[row * w.scale_cols + b / 32], low, high);
      _mm256_storeu_ps(out + b, low[0]);
      _mm256_storeu_ps(out + b + 8, low[1]);
      _mm256_storeu_ps(out + b + 16, high[0]);
      _mm256_storeu_ps(out + b + 24, high[1]);
    }
    return;
  }
  for (int64_t i = 0; i < cols; i += 16) {
    __m256 lo, hi;
    decode16_avx2(w, row, i, lo, hi);
    _mm256_storeu_ps(out + i, lo);
    _mm256_storeu_ps(out + i + 8, hi);
  }
}

namespace {

// The few-token AVX2 kernels. BF16 and F32 rows ask for their bytes 1 KB
// ahead, one cache line at a time (past a row's end: the next row of the
// stream, which the same thread takes next); FP8 and FP4 rows, bound by
// their decoding, gained nothing from it.
constexpr int64_t kAvx2PrefetchBytes = 1024;
DSV4_AVX2 inline void prefetch_ahead_avx2(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kAvx2PrefetchBytes, _MM_HINT_T0);
}

// fold16 of lanes 0-7 (lo) and 8-15 (hi) in registers: the same additions
// in double, without a store and sixteen scalar conversions per chunk.
DSV4_AVX2 inline double fold16_avx2(__m256 lo, __m256 hi) {
  const __m256d s8_low = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo)),
                                       _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
  const __m256d s8_high = _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)),
                                        _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
  const __m256d s4 = _mm256_add_pd(s8_low, s8_high);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

// R rows (first + r * stride) against T tokens (xs: [T][cols], storage
// order): sums[r][t] in the canonical order (linear.h). Each 16 weights are
// decoded once for all T tokens, and the FP8 and FP4 loops fetch a scale
// once per scale block, where decode16_avx2 does it for every 16 weights.
// R * T <= 4: the 2 * R * T accumulators leave registers for the decoding.
// FP8 rows of one 128-row block may pass `scaled` ([T][cols]: the inputs
// times 256 times the block's scale, for the 128-column spans k with
// scaled_spans[k]): those spans then multiply the unscaled codes by it, the
// same exact products without a multiply per weight.
template <int R, int T>
DSV4_AVX2 void dot_rows_tokens_avx2(const Linear& w, int64_t first, int64_t stride, const float* xs,
                                    double (&sums)[R][T], const float* scaled = nullptr,
                                    const uint8_t* scaled_spans = nullptr) {
  const int64_t cols = w.cols;
  for (auto& r : sums)
    for (auto& t : r) t = 0.0;
  for (int64_t chunk = 0; chunk < cols; chunk += kChunk) {
    __m256 lanes[R][T][2];  // the segments' sums
    for (auto& r : lanes)
      for (auto& t : r) t[0] = t[1] = _mm256_setzero_ps();
    for (int64_t c0 = chunk; c0 < std::min(cols, chunk + kChunk); c0 += kSegment) {
      const int64_t c1 = std::min(cols, c0 + kSegment);
      __m256 a[R][T][2];
      for (auto& r : a)
        for (auto& t : r) t[0] = t[1] = _mm256_setzero_ps();
      // Weights [i, i+16) of row r times the inputs `in` ([T][cols]).
      auto fma16 = [&](int r, const float* in, int64_t i, __m256 lo, __m256 hi) DSV4_AVX2 {
        for (int t = 0; t < T; ++t) {
          a[r][t][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(in + t * cols + i), a[r][t][0]);
          a[r][t][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(in + t * cols + i + 8), a[r][t][1]);
        }
      };
      auto add16 = [&](int r, int64_t i, __m256 lo, __m256 hi) DSV4_AVX2 { fma16(r, xs, i, lo, hi); };
      if (w.format == WeightFormat::FP8_BLOCK128) {
        const uint8_t* p[R];
        for (int r = 0; r < R; ++r) p[r] = w.data + (first + r * stride) * cols;
        for (int64_t b = c0; b < c1; b += 128) {
          const int64_t end = std::min(c1, b + 128);
          if (scaled != nullptr && scaled_spans[b / 128]) {
            for (int64_t i = b; i < end; i += 16)
              for (int r = 0; r < R; ++r) {
                __m256 lo, hi;
                e4m3x16_to_ps_unscaled_avx2(p[r] + i, lo, hi);
                fma16(r, scaled, i, lo, hi);
              }
            continue;
          }
          uint8_t sb[R];
          bool half_ok = true;
          for (int r = 0; r < R; ++r) {
            sb[r] = w.scale[((first + r * stride) / 128) * w.scale_cols + b / 128];
            half_ok = half_ok && sb[r] <= kMaxHalfPathScale;
          }
          if (half_ok) {
            __m256 scale256[R];
            for (int r = 0; r < R; ++r) scale256[r] = _mm256_set1_ps(e8m0_to_float(sb[r]) * 256.0f);
            for (int64_t i = b; i < end; i += 16)
              for (int r = 0; r < R; ++r) {
                __m256 lo, hi;
                e4m3x16_to_ps_via_half_avx2(p[r] + i, scale256[r], lo, hi);
                add16(r, i, lo, hi);
              }
          } else {
            for (int64_t i = b; i < end; i += 16)
              for (int r = 0; r < R; ++r) {
                __m256 lo, hi;
                decode16_avx2(w, first + r * stride, i, lo, hi);
                add16(r, i, lo, hi);
              }
          }
        }
      } else if (w.format == WeightFormat::FP4_BLOCK32) {
        const E2m1Tables& tables = e2m1_tables();
        for (int64_t b = c0; b < c1; b += 32)
          for (int r = 0; r < R; ++r) {
            const int64_t row = first + r * stride;
            __m256 low[2], high[2];
            e2m1x32_avx2(tables, w.data + row * (cols / 2) + b / 2, w.scale[row * w.scale_cols + b / 32], low, high);
            add16(r, b, low[0], low[1]);
            add16(r, b + 16, high[0], high[1]);
          }
      } else if (w.format == WeightFormat::BF16) {
        const uint16_t* p[R];
        for (int r = 0; r < R; ++r) p[r] = reinterpret_cast<const uint16_t*>(w.data) + (first + r * stride) * cols;
        for (int64_t i = c0; i < c1; i += 16)
          for (int r = 0; r < R; ++r) {
            if (i % 32 == 0) prefetch_ahead_avx2(p[r] + i);
            const __m256i h = _mm256_loadu_si256((const __m256i*)(p[r] + i));
            add16(r, i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16)),
                  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16)));
          }
      } else {
        const float* p[R];
        for (int r = 0; r < R; ++r) p[r] = reinterpret_cast<const float*>(w.data) + (first + r * stride) * cols;
        for (int64_t i = c0; i < c1; i += 16)
          for (int r = 0; r < R; ++r) {
            prefetch_ahead_avx2(p[r] + i);
            add16(r, i, _mm256_loadu_ps(p[r] + i), _mm256_loadu_ps(p[r] + i + 8));
          }
      }
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < 2; ++h) lanes[r][t][h] = _mm256_add_ps(lanes[r][t][h], a[r][t][h]);
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) sums[r][t] += fold16_avx2(lanes[r][t][0], lanes[r][t][1]);
  }
}

// Row `row` against n tokens (xs: [n][cols], storage order), y[t * y_stride]
// receiving token t, up to four tokens at a time.
template <int T>
DSV4_AVX2 void dot_token_group_avx2(const Linear& w, int64_t row, const float* xs, float* y, int64_t y_stride) {
  double sums[1][T];
  dot_rows_tokens_avx2<1, T>(w, row, 1, xs, sums);
  for (int t = 0; t < T; ++t) y[t * y_stride] = float(sums[0][t]);
}

}  // namespace

DSV4_AVX2 double dot_avx2(const Linear& w, int64_t row, const float* x) {
  double sums[1][1];
  dot_rows_tokens_avx2<1, 1>(w, row, 1, x, sums);
  return sums[0][0];
}

// Rows [lo, hi) against one token as four streams (see RowGroup): memory-
// bound BF16 rows read from four places at once, like the AVX-512 kernels.
namespace {

DSV4_AVX2 void rows_as_four_streams_avx2(const Linear& w, int64_t row_begin, int64_t lo, int64_t hi, const float* xs,
                                         float* y) {
  const int64_t quarter = (hi - lo) / 4;
  for (int64_t j = 0; j < quarter; ++j) {
    double sums[4][1];
    dot_rows_tokens_avx2<4, 1>(w, row_begin + lo + j, quarter, xs, sums);
    for (int q = 0; q < 4; ++q) y[lo + j + q * quarter] = float(sums[q][0]);
  }
  for (int64_t o = lo + 4 * quarter; o < hi; ++o) dot_token_group_avx2<1>(w, row_begin + o, xs, y + o, 1);
}

}  // namespace

// FP8 rows that fill whole 128-row blocks go as four streams 32 rows apart
// inside each block, as on AVX-512 (register_rows_avx512): the four rows
// share each span's scale, which goes into a copy of the input once per
// block instead of into every decoded weight (two multiplies per 16
// weights, on CPUs where decoding FP8 bounds a one-token product; numbers
// in docs/kernels.md). The other rows, and every other format, go as four
// streams over the range.
DSV4_AVX2 void rows_one_token_avx2(const Linear& w, int64_t row_begin, int64_t lo, int64_t hi, const float* xs,
                                   float* y) {
  const int64_t blocks_begin = (row_begin + lo + 127) / 128 * 128 - row_begin;
  const int64_t blocks_end = (row_begin + hi) / 128 * 128 - row_begin;
  if (w.format != WeightFormat::FP8_BLOCK128 || blocks_begin >= blocks_end) {
    rows_as_four_streams_avx2(w, row_begin, lo, hi, xs, y);
    return;
  }
  rows_as_four_streams_avx2(w, row_begin, lo, blocks_begin, xs, y);
  const int64_t cols = w.cols, spans = w.scale_cols;
  const auto [prescale_min, prescale_max] = prescalable_scales(xs, cols);
  float* scaled = static_cast<float*>(thread_scratch(ScratchSlot::ScaledInput, size_t(cols) * 4 + size_t(spans)));
  uint8_t* scaled_spans = reinterpret_cast<uint8_t*>(scaled + cols);
  for (int64_t block = blocks_begin; block < blocks_end; block += 128) {
    const uint8_t* scale_row = w.scale + (row_begin + block) / 128 * spans;
    for (int64_t k = 0; k < spans; ++k) {
      const int s = scale_row[k];
      scaled_spans[k] = s >= prescale_min && s <= prescale_max;
      if (!scaled_spans[k]) continue;
      const __m256 f = _mm256_set1_ps(e8m0_to_float(uint8_t(s)) * 256.0f);
      for (int64_t c = k * 128; c < std::min(cols, k * 128 + 128); c += 8)
        _mm256_storeu_ps(scaled + c, _mm256_mul_ps(_mm256_loadu_ps(xs + c), f));
    }
    for (int64_t j = 0; j < 32; ++j) {
      double sums[4][1];
      dot_rows_tokens_avx2<4, 1>(w, row_begin + block + j, 32, xs, sums, scaled, scaled_spans);
      for (int q = 0; q < 4; ++q) y[block + j + 32 * q] = float(sums[q][0]);
    }
  }
  rows_as_four_streams_avx2(w, row_begin, blocks_end, hi, xs, y);
}

namespace {

// Two rows against groups of up to four tokens, with the canonical order's
// lanes 0-7 and 8-15 of each chunk as two passes over it: 2 * T
// accumulators instead of 4 * T stay in registers, so each weight vector
// feeds T FMAs and each input vector two, where the one-row kernel loads an
// input vector for every FMA. load8(r, i): row r's weights [i, i + 8) as
// floats. Each lane still takes its columns in increasing order, and the
// lanes fold as fold16 does: the canonical bits.
template <int T, class Weights>
DSV4_AVX2 void row_pair_token_group_avx2(Weights load8, int64_t cols, const float* xs, float* y, int64_t y_stride) {
  double sums[2][T] = {};
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    __m256 lanes[2][2][T];
    for (int half = 0; half < 2; ++half) {
      for (int r = 0; r < 2; ++r)
        for (int t = 0; t < T; ++t) lanes[half][r][t] = _mm256_setzero_ps();
      for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
        __m256 a[2][T];
        for (auto& r : a)
          for (auto& t : r) t = _mm256_setzero_ps();
        for (int64_t i = s0 + 8 * half; i < std::min(c1, s0 + kSegment); i += 16) {
          const __m256 w0 = load8(0, i), w1 = load8(1, i);
          for (int t = 0; t < T; ++t) {
            const __m256 x = _mm256_loadu_ps(xs + t * cols + i);
            a[0][t] = _mm256_fmadd_ps(w0, x, a[0][t]);
            a[1][t] = _mm256_fmadd_ps(w1, x, a[1][t]);
          }
        }
        for (int r = 0; r < 2; ++r)
          for (int t = 0; t < T; ++t) lanes[half][r][t] = _mm256_add_ps(lanes[half][r][t], a[r][t]);
      }
    }
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < T; ++t) sums[r][t] += fold16_avx2(lanes[0][r][t], lanes[1][r][t]);
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < 2; ++r) y[t * y_stride + r] = float(sums[r][t]);
}

// Tokens [0, n) in groups of up to four: group.operator()<T>(t) for the
// group of T tokens from token t.
template <class Group>
DSV4_AVX2 inline void token_groups_avx2(int64_t n, const Group& group) {
  for (int64_t t = 0; t < n; t += 4) {
    switch (std::min<int64_t>(4, n - t)) {
      case 4: group.template operator()<4>(t); break;
      case 3: group.template operator()<3>(t); break;
      case 2: group.template operator()<2>(t); break;
      default: group.template operator()<1>(t); break;
    }
  }
}

template <class Weights>
DSV4_AVX2 void row_pair_tokens_avx2(Weights load8, int64_t cols, const float* xs, int64_t n, float* y,
                                    int64_t y_stride) {
  token_groups_avx2(n, [&]<int T>(int64_t t) DSV4_AVX2 {
    row_pair_token_group_avx2<T>(load8, cols, xs + t * cols, y + t * y_stride, y_stride);
  });
}

// Rows row and row + 1 against n tokens, y[t * y_stride + r] receiving row
// row + r. F32 rows are read as they are, BF16 rows widen in registers as
// the one-row kernel does. FP8 and FP4 rows are first decoded into fp32
// (decode_row_avx2: the values every path's decoder gives), so that a
// 16-token product decodes each weight once instead of four times; the
// groups then load those floats (numbers in docs/kernels.md).
DSV4_AVX2 void dot_row_pair_tokens_avx2(const Linear& w, int64_t row, const float* xs, int64_t n, float* y,
                                        int64_t y_stride) {
  const int64_t cols = w.cols;
  if (w.format == WeightFormat::BF16) {
    const uint16_t* rows = reinterpret_cast<const uint16_t*>(w.data) + row * cols;
    row_pair_tokens_avx2(
        [&](int r, int64_t i) DSV4_AVX2 {
          return _mm256_castsi256_ps(
              _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(rows + r * cols + i))), 16));
        },
        cols, xs, n, y, y_stride);
    return;
  }
  if (w.format == WeightFormat::F32) {
    const float* rows = reinterpret_cast<const float*>(w.data) + row * cols;
    row_pair_tokens_avx2([&](int r, int64_t i) DSV4_AVX2 { return _mm256_loadu_ps(rows + r * cols + i); }, cols, xs,
                         n, y, y_stride);
    return;
  }
  float* rows = thread_scratch_array<float>(ScratchSlot::DecodedRows, 2 * cols);
  decode_row_avx2(w, row, rows);
  decode_row_avx2(w, row + 1, rows + cols);
  row_pair_tokens_avx2([&](int r, int64_t i) DSV4_AVX2 { return _mm256_loadu_ps(rows + r * cols + i); }, cols, xs,
                       n, y, y_stride);
}

// Row `row` against n tokens, y[t * y_stride] receiving token t, up to
// four tokens at a time.
DSV4_AVX2 void dot_tokens_avx2(const Linear& w, int64_t row, const float* xs, int64_t n, float* y, int64_t y_stride) {
  token_groups_avx2(n, [&]<int T>(int64_t t) DSV4_AVX2 {
    dot_token_group_avx2<T>(w, row, xs + t * w.cols, y + t * y_stride, y_stride);
  });
}

}  // namespace

// Below kRowPairTokens tokens one row's decoded weights feed all its
// groups from registers; from there rows go in pairs (dot_row_pair_tokens_avx2).
DSV4_AVX2 void rows_tokens_avx2(const Linear& w, int64_t lo, int64_t hi, const float* xs, int64_t n, float* y,
                                int64_t y_stride) {
  int64_t o = lo;
  if (n >= kRowPairTokens)
    for (; o + 2 <= hi; o += 2) dot_row_pair_tokens_avx2(w, o, xs, n, y + (o - lo), y_stride);
  for (; o < hi; ++o) dot_tokens_avx2(w, o, xs, n, y + (o - lo), y_stride);
}

namespace {

// The outer form on AVX2 (prefill on CPUs without AVX-512): the same
// panels, token packing, tasks and folding tree as packed_gemm_outer_avx512,
// so the same bits. With 16 vector registers the kernel runs half a panel
// row group (16 rows, two vectors) against half a token group (6 tokens):
// 12 accumulators, two weight loads and six broadcasts per step.
constexpr int kOuterTokensAvx2 = kOuterTokens / 2;

// Rows [row, row + count) (count <= 16; the rest are zeros), storage
// positions [c0, c0 + 16 * steps), into a panel row group as
// decode_rows_to_panel lays it out.
DSV4_AVX2 void decode_rows_to_panel_avx2(const Linear& w, int64_t row, int count, int64_t c0, int64_t steps,
                                         float* rows_tmp, float* panel) {
  for (int r = 0; r < 16; ++r) {
    float* dst = rows_tmp + r * steps * 16;
    if (r >= count) {
      std::fill_n(dst, steps * 16, 0.0f);
      continue;
    }
    for (int64_t k = 0; k < steps; ++k) {
      __m256 lo, hi;
      decode16_avx2(w, row + r, c0 + 16 * k, lo, hi);
      _mm256_storeu_ps(dst + 16 * k, lo);
      _mm256_storeu_ps(dst + 16 * k + 8, hi);
    }
  }
  for (int64_t k = 0; k < steps; ++k)
    for (int l = 0; l < 16; ++l) {
      float* out = panel + (l * steps + k) * kPanelRows;
      for (int r = 0; r < 16; ++r) out[r] = rows_tmp[r * steps * 16 + k * 16 + l];
    }
}

// outer_lane_kernel for 16 of the panel's 32 rows (w: 32 floats per step,
// this half's first) and T of a group's tokens (x: `group` floats per step,
// these T first); results to out[t * 32 + row].
template <int T>
DSV4_AVX2 void outer_lane_kernel_avx2(const float* w, const float* x, int group, int64_t steps, float* out) {
  // The lane's segment sums go into out, which starts at zero.
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(out + t * kPanelRows, _mm256_setzero_ps());
    _mm256_storeu_ps(out + t * kPanelRows + 8, _mm256_setzero_ps());
  }
  for (int64_t k0 = 0; k0 < steps; k0 += kSegmentSteps) {
    __m256 a[T][2];
    for (auto& t : a) t[0] = t[1] = _mm256_setzero_ps();
    for (int64_t k = k0; k < std::min(steps, k0 + kSegmentSteps); ++k, w += kPanelRows, x += group) {
      const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
      for (int t = 0; t < T; ++t) {
        const __m256 xb = _mm256_broadcast_ss(x + t);
        a[t][0] = _mm256_fmadd_ps(w0, xb, a[t][0]);
        a[t][1] = _mm256_fmadd_ps(w1, xb, a[t][1]);
      }
    }
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h) {
        float* o = out + t * kPanelRows + 8 * h;
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), a[t][h]));
      }
  }
}

DSV4_AVX2 void outer_lane_kernel_any_avx2(int tokens, const float* w, const float* x, int group, int64_t steps,
                                          float* out) {
  with_block_size<kOuterTokensAvx2>(tokens, [&](auto t) { outer_lane_kernel_avx2<t.value>(w, x, group, steps, out); });
}

// fold_lanes with four doubles per vector: the same additions.
DSV4_AVX2 void fold_lanes_avx2(const float* lanes, int tokens, double* sums, int64_t sums_stride) {
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < kPanelRows; h += 4) {
      __m256d l[16];
      for (int q = 0; q < 16; ++q) l[q] = _mm256_cvtps_pd(_mm_loadu_ps(lanes + (q * tokens + t) * kPanelRows + h));
      for (int q = 0; q < 8; ++q) l[q] = _mm256_add_pd(l[q], l[q + 8]);
      for (int q = 0; q < 4; ++q) l[q] = _mm256_add_pd(l[q], l[q + 4]);
      for (int q = 0; q < 2; ++q) l[q] = _mm256_add_pd(l[q], l[q + 2]);
      double* s = sums + t * sums_stride + h;
      _mm256_storeu_pd(s, _mm256_add_pd(_mm256_loadu_pd(s), _mm256_add_pd(l[0], l[1])));
    }
}

}  // namespace

void packed_gemm_outer_avx2(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                            int64_t y_stride, int threads) {
  packed_gemm_outer(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int count, int64_t c0, int64_t steps, float* rows_tmp, float* panel)
          DSV4_AVX2 { decode_rows_to_panel_avx2(w, row, count, c0, steps, rows_tmp, panel); },
      [](int group, const float* pg, const float* xg, int64_t steps, float* lanes) DSV4_AVX2 {
        for (int l = 0; l < 16; ++l)
          for (int half = 0; half < 2; ++half)
            for (int u = 0; u < group; u += kOuterTokensAvx2)
              outer_lane_kernel_any_avx2(std::min(kOuterTokensAvx2, group - u), pg + l * steps * kPanelRows + 16 * half,
                                         xg + l * steps * group + u, group, steps,
                                         lanes + (l * group + u) * kPanelRows + 16 * half);
      },
      fold_lanes_avx2);
}

}  // namespace dsv4::linear_detail
