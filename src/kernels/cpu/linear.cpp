#include "kernels/cpu/linear.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/numeric.h"
#include "core/scratch.h"
#include "core/threads.h"

namespace dsv4 {

namespace {

// ---------------------------------------------------------------- scalar ---

// Decodes weights [i0, i0+16) of a row into floats with the scale applied.
inline void decode16(const Linear& w, int64_t row, int64_t i0, float* out) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32:
      std::memcpy(out, reinterpret_cast<const float*>(w.data) + row * n + i0, 64);
      return;
    case WeightFormat::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + row * n + i0;
      for (int l = 0; l < 16; ++l) out[l] = bf16_to_float(p[l]);
      return;
    }
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* p = w.data + row * n + i0;
      float s = e8m0_to_float(w.scale[(row / 128) * w.scale_cols + i0 / 128]);
      for (int l = 0; l < 16; ++l) out[l] = e4m3_to_float(p[l]) * s;
      return;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* p = w.data + row * (n / 2) + i0 / 2;
      float s = e8m0_to_float(w.scale[row * w.scale_cols + i0 / 32]);
      for (int l = 0; l < 8; ++l) {
        out[2 * l] = e2m1_to_float(p[l] & 15) * s;
        out[2 * l + 1] = e2m1_to_float(p[l] >> 4) * s;
      }
      return;
    }
  }
}

// Storage positions [i0, i0+16) of a row (see linear.h: FP4 blocks of 32
// columns are stored even elements first), decoded with the scale applied.
inline void decode16_storage(const Linear& w, int64_t row, int64_t i0, float* out) {
  if (w.format != WeightFormat::FP4_BLOCK32) return decode16(w, row, i0, out);
  const uint8_t* p = w.data + row * (w.cols / 2) + i0 / 32 * 16;
  const float s = e8m0_to_float(w.scale[row * w.scale_cols + i0 / 32]);
  const bool odd = i0 % 32 != 0;
  for (int l = 0; l < 16; ++l) out[l] = e2m1_to_float(odd ? p[l] >> 4 : p[l] & 15) * s;
}

// The input in the weight's storage order.
void to_storage_order(const Linear& w, const float* x, float* out) {
  if (w.format != WeightFormat::FP4_BLOCK32) {
    std::copy_n(x, w.cols, out);
    return;
  }
  for (int64_t b = 0; b < w.cols; b += 32)
    for (int k = 0; k < 16; ++k) {
      out[b + k] = x[b + 2 * k];
      out[b + 16 + k] = x[b + 2 * k + 1];
    }
}

// The canonical order (see linear.h): within each chunk of kChunk columns,
// element i goes to fp32 lane i mod 16 with one fused multiply-add, in
// increasing i; the 16 lanes are folded in double in a fixed tree; the chunk
// sums are added in double in increasing chunk order.
constexpr int64_t kChunk = 1024;

inline double fold16(const float* lanes) {
  double s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = double(lanes[l]) + double(lanes[l + 8]);
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

double dot_scalar(const Linear& w, int64_t row, const float* x) {
  double sum = 0.0;
  float wv[16];
  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunk) {
    const int64_t c1 = std::min(w.cols, c0 + kChunk);
    float acc[16] = {};
    for (int64_t i = c0; i < c1; i += 16) {
      decode16_storage(w, row, i, wv);
      for (int l = 0; l < 16; ++l) acc[l] = std::fma(wv[l], x[i + l], acc[l]);
    }
    sum += fold16(acc);
  }
  return sum;
}

// The 16 e2m1 values times 2^(s - 127) for every ue8m0 byte s, computed as
// the scalar decoder computes them (code value * scale in float): loading a
// block's table is cheaper than scaling one per block and row.
struct E2m1Tables {
  alignas(64) float values[256][16];
  E2m1Tables() {
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 16; ++c) values[s][c] = e2m1_to_float(uint8_t(c)) * e8m0_to_float(uint8_t(s));
  }
};
const E2m1Tables& e2m1_tables() {
  static const E2m1Tables tables;
  return tables;
}

// ------------------------------------------------------------------ AVX2 ---

// Every CPU with AVX2 and FMA also has F16C (fp16 conversions).
#define DSV4_AVX2 DSV4_TARGET_AVX2

// Largest ue8m0 byte for which scale * 256 is still a finite float: the
// fp16 decoders of e4m3 below take the scale times 256.
constexpr uint8_t kMaxHalfPathScale = 127 + 119;

// e4m3 read as the top bits of an fp16 (see e4m3_to_ps_via_half, its AVX-512
// twin): 16 codes, as two vectors of 8 floats times scale256. About 6 uops
// per 8 values where e4m3_to_ps_avx2 takes 14.
DSV4_AVX2 inline void e4m3x16_to_ps_via_half_avx2(const uint8_t* bytes16, __m256 scale256, __m256& lo, __m256& hi) {
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)bytes16)), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0xBFFF)));
  lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale256);
  hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale256);
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
// nibble's top bit picks the vector. 5 uops per 8 values where scaling them
// took 9; the scalar decoder's floats, NaN scale included.
DSV4_AVX2 inline __m256 e2m1x8_avx2(__m256i bytes, bool high, __m256 positive, __m256 negative) {
  const __m256i index = high ? _mm256_srli_epi32(bytes, 4) : bytes;
  const __m256i top_bit = high ? _mm256_slli_epi32(bytes, 24) : _mm256_slli_epi32(bytes, 28);
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(positive, index), _mm256_permutevar8x32_ps(negative, index),
                          _mm256_castsi256_ps(top_bit));
}

// Weights [i, i+16) of a row as two vectors of 8 floats, scale applied.
DSV4_AVX2 inline void decode16_avx2(const Linear& w, int64_t row, int64_t i,
                                                              __m256& lo, __m256& hi) {
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
}


// The few-token AVX2 kernels. BF16 and F32 rows ask for their bytes 1 KB
// ahead, one cache line at a time (past a row's end: the next row of the
// stream, which the same thread takes next); FP8 and FP4 rows, bound by
// their decoding, gained nothing from it.
constexpr int64_t kAvx2PrefetchBytes = 1024;
DSV4_AVX2 inline void prefetch_ahead_avx2(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kAvx2PrefetchBytes, _MM_HINT_T0);
}

// R rows (first + r * stride) against T tokens (xs: [T][cols], storage
// order): sums[r][t] in the canonical order (linear.h). Each 16 weights are
// decoded once for all T tokens, and the FP8 and FP4 loops fetch a scale
// once per scale block, where decode16_avx2 does it for every 16 weights. R * T <= 4: the 2 * R * T
// accumulators leave registers for the decoding.
template <int R, int T>
DSV4_AVX2 void dot_rows_tokens_avx2(const Linear& w, int64_t first, int64_t stride, const float* xs,
                                    double (&sums)[R][T]) {
  const int64_t cols = w.cols;
  for (auto& r : sums)
    for (auto& t : r) t = 0.0;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    __m256 a[R][T][2];
    for (auto& r : a)
      for (auto& t : r) t[0] = t[1] = _mm256_setzero_ps();
    auto add16 = [&](int r, int64_t i, __m256 lo, __m256 hi) DSV4_AVX2 {
      for (int t = 0; t < T; ++t) {
        a[r][t][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xs + t * cols + i), a[r][t][0]);
        a[r][t][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xs + t * cols + i + 8), a[r][t][1]);
      }
    };
    if (w.format == WeightFormat::FP8_BLOCK128) {
      const uint8_t* p[R];
      for (int r = 0; r < R; ++r) p[r] = w.data + (first + r * stride) * cols;
      for (int64_t b = c0; b < c1; b += 128) {
        const int64_t end = std::min(c1, b + 128);
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
          const uint8_t* p = w.data + row * (cols / 2) + b / 2;
          const float* table = tables.values[w.scale[row * w.scale_cols + b / 32]];
          const __m256 positive = _mm256_load_ps(table), negative = _mm256_load_ps(table + 8);
          const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
          const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
          add16(r, b, e2m1x8_avx2(b0, false, positive, negative), e2m1x8_avx2(b1, false, positive, negative));
          add16(r, b + 16, e2m1x8_avx2(b0, true, positive, negative), e2m1x8_avx2(b1, true, positive, negative));
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
      for (int t = 0; t < T; ++t) {
        float lanes[16];
        _mm256_storeu_ps(lanes, a[r][t][0]);
        _mm256_storeu_ps(lanes + 8, a[r][t][1]);
        sums[r][t] += fold16(lanes);
      }
  }
}

DSV4_AVX2 double dot_avx2(const Linear& w, int64_t row, const float* x) {
  double sums[1][1];
  dot_rows_tokens_avx2<1, 1>(w, row, 1, x, sums);
  return sums[0][0];
}

// Row `row` against n tokens (xs: [n][cols], storage order), y[t * y_stride]
// receiving token t, up to four tokens at a time.
template <int T>
DSV4_AVX2 void dot_token_group_avx2(const Linear& w, int64_t row, const float* xs, float* y, int64_t y_stride) {
  double sums[1][T];
  dot_rows_tokens_avx2<1, T>(w, row, 1, xs, sums);
  for (int t = 0; t < T; ++t) y[t * y_stride] = float(sums[0][t]);
}

// Rows [lo, hi) against one token as four streams (see RowGroup): memory-
// bound BF16 rows read from four places at once, like the AVX-512 kernels.
DSV4_AVX2 void rows_one_token_avx2(const Linear& w, int64_t row_begin, int64_t lo, int64_t hi, const float* xs,
                                   float* y) {
  const int64_t quarter = (hi - lo) / 4;
  for (int64_t j = 0; j < quarter; ++j) {
    double sums[4][1];
    dot_rows_tokens_avx2<4, 1>(w, row_begin + lo + j, quarter, xs, sums);
    for (int q = 0; q < 4; ++q) y[lo + j + q * quarter] = float(sums[q][0]);
  }
  for (int64_t o = lo + 4 * quarter; o < hi; ++o) dot_token_group_avx2<1>(w, row_begin + o, xs, y + o, 1);
}

DSV4_AVX2 void dot_tokens_avx2(const Linear& w, int64_t row, const float* xs, int64_t n, float* y, int64_t y_stride) {
  for (int64_t t = 0; t < n; t += 4) {
    const float* x = xs + t * w.cols;
    float* out = y + t * y_stride;
    switch (std::min<int64_t>(4, n - t)) {
      case 4: dot_token_group_avx2<4>(w, row, x, out, y_stride); break;
      case 3: dot_token_group_avx2<3>(w, row, x, out, y_stride); break;
      case 2: dot_token_group_avx2<2>(w, row, x, out, y_stride); break;
      default: dot_token_group_avx2<1>(w, row, x, out, y_stride); break;
    }
  }
}

// --------------------------------------------------------------- AVX-512 ---

#define DSV4_AVX512 DSV4_TARGET_AVX512

// fold16 of the 16 lanes of a register, in registers (the same additions).
DSV4_AVX512 inline double fold16_avx512(__m512 lanes) {
  const __m512d s8 = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(lanes)),
                                   _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1))));
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

// See e4m3_to_ps_avx2: rebiased exponent, subnormal codes as 1.m*2^-6 - 2^-6.
DSV4_AVX512 inline __m512 e4m3_to_ps_avx512(__m128i bytes16, __m512 scale) {
  __m512i b = _mm512_cvtepu8_epi32(bytes16);
  __m512i em = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
  __mmask16 sub = _mm512_testn_epi32_mask(em, _mm512_set1_epi32(0x78));
  __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
  bits = _mm512_mask_add_epi32(bits, sub, bits, _mm512_set1_epi32(1 << 23));
  __m512 v = _mm512_castsi512_ps(bits);
  v = _mm512_mask_sub_ps(v, sub, v, _mm512_set1_ps(0x1p-6f));
  v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v),
                                          _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24)));
  return _mm512_mul_ps(v, scale);
}
// e4m3 read as the top bits of an fp16: sign-extending the byte to 16 bits
// and shifting it left by 7 puts the exponent and mantissa where fp16 keeps
// them (bit 14, a copy of the sign, is cleared). The fp16 then holds the
// e4m3 value times 2^-8, subnormals included, so `scale256` is the block
// scale times 256. Cheaper than e4m3_to_ps_avx512 for the same floats.
DSV4_AVX512 inline __m512 e4m3_to_ps_times_2m8(__m128i bytes16) {
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes16), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0xBFFF)));
  return _mm512_cvtph_ps(h);
}
DSV4_AVX512 inline __m512 e4m3_to_ps_via_half(__m128i bytes16, __m512 scale256) {
  return _mm512_mul_ps(e4m3_to_ps_times_2m8(bytes16), scale256);
}
// The same for 32 bytes: one widening, shift and mask for both halves
// (12 uops per 32 values instead of 14 on the ports that also run the FMAs;
// 10 where the scale is in the inputs instead).
DSV4_AVX512 inline void e4m3x32_to_ps_times_2m8(const uint8_t* bytes32, __m512& lo, __m512& hi) {
  __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)bytes32)), 7);
  h = _mm512_and_si512(h, _mm512_set1_epi16(int16_t(0xBFFF)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
// The SIMD e4m3 decoders read the two NaN codes (0x7F, 0xFF) as +-480 where
// the scalar table says NaN: checkpoints never hold them (a NaN weight), so
// the bit-identity of the paths is only claimed for real e4m3 values.


// FP4 in storage order (see linear.h): the 16 bytes of a 32-column block
// give its even elements (low nibbles) and then its odd ones (high nibbles).
// `table` holds the 16 e2m1 codes' values times the block scale. vpermps
// reads only the low 4 bits of each index, so the bytes need no masking.
DSV4_AVX512 inline void e2m1_block_avx512(const uint8_t* bytes16, __m512 table, __m512& even, __m512& odd) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)bytes16));
  even = _mm512_permutexvar_ps(b, table);
  odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
}


DSV4_AVX512 inline __m512 e2m1_table_avx512(const E2m1Tables& tables, uint8_t scale) {
  return _mm512_load_ps(tables.values[scale]);
}

// Storage positions [i, i+16) of a row, scale applied (plain decoders; the
// row-group kernels below have faster ones).
DSV4_AVX512 inline __m512 decode16_avx512(const Linear& w, int64_t row, int64_t i) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: return _mm512_loadu_ps(reinterpret_cast<const float*>(w.data) + row * n + i);
    case WeightFormat::BF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(reinterpret_cast<const uint16_t*>(w.data) + row * n + i))),
          16));
    case WeightFormat::FP8_BLOCK128:
      return e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(w.data + row * n + i)),
                               _mm512_set1_ps(e8m0_to_float(w.scale[(row / 128) * w.scale_cols + i / 128])));
    case WeightFormat::FP4_BLOCK32: {
      __m512 even, odd;
      e2m1_block_avx512(w.data + row * (n / 2) + i / 32 * 16, e2m1_table_avx512(e2m1_tables(), w.scale[row * w.scale_cols + i / 32]),
                        even, odd);
      return i % 32 ? odd : even;
    }
  }
  return _mm512_setzero_ps();
}

DSV4_AVX512 double dot_avx512(const Linear& w, int64_t row, const float* x) {
  double sum = 0.0;
  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunk) {
    const int64_t c1 = std::min(w.cols, c0 + kChunk);
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = c0; i < c1; i += 16) a = _mm512_fmadd_ps(decode16_avx512(w, row, i), _mm512_loadu_ps(x + i), a);
    sum += fold16_avx512(a);
  }
  return sum;
}

// A register group with one token group (batch 1) asks for each stream's
// bytes kPrefetchBytesAhead ahead as it goes (past a row's end: the next row
// of the stream, which the same thread takes next). The hardware prefetchers
// alone kept too few lines in flight: batch-1 products over DRAM-resident
// weights on 2 threads went from 23 to 27-28 GB/s (BF16), 19 to 21 (FP8),
// 19-20 to 20-21 (FP4); 1-2 KB ahead did equally well, 4 KB worse.
constexpr int64_t kPrefetchBytesAhead = 1024;

// Few tokens (decode and small batches), in registers: four consecutive rows
// against the tokens in groups of up to four, the weights decoded in
// registers for each group (one pass over the weights from memory: a group
// after the first finds the rows' chunk in L1). Four rows x four tokens keep
// 16 FMA chains in flight. Each (row, token) sees exactly the sequence
// dot_avx512 gives it: same bits.
//
// The loop nest is chunk-major: for each 1024-column chunk, every token group
// in turn. When each group walked whole rows instead, the first group
// stalled on DRAM while the others ran from cache, with no overlap between
// the two (the head of a 16-sequence decode step, BF16 from DRAM: 55-65
// GMAC/s); now the groups ask for the rows' next chunk while they compute
// this one.
//
// Each format gives one generic lambda, add_chunk(c0, c1, x, a, group,
// groups), that adds the products of columns [c0, c1) of the four rows with
// the group's T tokens x[0..T) to a[row][t]. It is inlined into this small
// loop nest, so that the compiler keeps the accumulators in registers (one
// function with a switch over formats spilled them at every scale block).
constexpr int kSmallTokenGroup = 4;
// Below this many tokens, weights are decoded in registers (above) instead of
// into packed panels. With several token groups the first decodes each
// chunk's rows into an L1 buffer that the others read (BF16, FP8), so a
// second decoding costs nothing: 16 BF16 tokens from DRAM (the head of a
// 16-sequence decode step) ran at 92-95 GMAC/s against 37-53 packed, FP8
// from DRAM at 10 tokens 78 against 59, at 16 tokens 87 against 77. FP4
// rows (no buffer) are packed from 8 tokens (16 in cache: 72-76 against
// 50-69 in registers).
constexpr int64_t kPackedMinTokensFp4 = 8, kPackedMinTokensBuffered = 17;
constexpr int64_t kMaxRegisterTokens = std::max(kPackedMinTokensFp4, kPackedMinTokensBuffered) - 1;

// Matrices of fewer rows (the hyper-connection mixes: 24 x 16384 fp32)
// stay on the register path at any token count, kMaxRegisterTokens tokens
// at a time with the weights in L2: packing every token's input costs
// more than such a product.
constexpr int64_t kPackedMinRows = 64;

int64_t packed_min_tokens(const Linear& w) {
  return w.format == WeightFormat::FP4_BLOCK32 ? kPackedMinTokensFp4 : kPackedMinTokensBuffered;  // BF16, F32 and FP8
}

// 16 bf16 values as floats: one word permutation (vpermw, zero-masked) puts
// value j in the high half of lane j, where a float keeps the bf16 bits;
// one p5 uop where widening and shifting take a p5 and a p0 uop.
DSV4_AVX512 inline __m512i bf16_widen_index() {
  alignas(64) static const uint16_t index[32] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7,
                                                0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
  return _mm512_load_si512(index);
}
DSV4_AVX512 inline __m512 bf16x16_to_ps_avx512(const uint16_t* p, __m512i widen) {
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
      __mmask32(0xAAAAAAAAu), widen, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)p))));
}

template <int T>
DSV4_AVX512 inline void fma16_tokens(__m512 v, const float* const* x, int64_t i, __m512* a) {
  for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x[t] + i), a[t]);
}

// One group of T tokens over one chunk; its folded lanes are added to
// sums[row * kMaxRegisterTokens + t].
template <int T, class AddChunk>
DSV4_AVX512 inline void dot4_group_chunk(const AddChunk& add_chunk, int64_t c0, int64_t c1, const float* const* x,
                                         int group, int groups, double* sums) {
  __m512 a[4][T];
  for (auto& r : a)
    for (auto& t : r) t = _mm512_setzero_ps();
  add_chunk(c0, c1, x, a, group, groups);
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < T; ++t) sums[r * kMaxRegisterTokens + t] += fold16_avx512(a[r][t]);
}

// n <= kMaxRegisterTokens tokens (xs: [n][cols], storage order); out[t *
// out_stride + r] receives (row r, token t).
template <class AddChunk>
DSV4_AVX512 inline void dot4_token_groups(int64_t cols, const float* xs, int64_t n, double* out, int64_t out_stride,
                                          const AddChunk& add_chunk) {
  double sums[4][kMaxRegisterTokens] = {};
  const int groups = int((n + kSmallTokenGroup - 1) / kSmallTokenGroup);
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    for (int g = 0; g < groups; ++g) {
      const int64_t t = int64_t(g) * kSmallTokenGroup;
      const float* x[kSmallTokenGroup];
      for (int u = 0; u < kSmallTokenGroup; ++u) x[u] = xs + std::min(t + u, n - 1) * cols;
      double* s = &sums[0][t];
      switch (std::min<int64_t>(kSmallTokenGroup, n - t)) {
        case 4: dot4_group_chunk<4>(add_chunk, c0, c1, x, g, groups, s); break;
        case 3: dot4_group_chunk<3>(add_chunk, c0, c1, x, g, groups, s); break;
        case 2: dot4_group_chunk<2>(add_chunk, c0, c1, x, g, groups, s); break;
        default: dot4_group_chunk<1>(add_chunk, c0, c1, x, g, groups, s); break;
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int64_t t = 0; t < n; ++t) out[t * out_stride + r] = sums[r][t];
}

// The four rows of a register group: row(r) = first + r * stride. A thread
// walks the rows of a piece as four streams (stride = a quarter of the
// piece; the group after this one holds the next row of each stream), the
// access pattern of the four-stream bandwidth measure: each stream runs on
// through row after row, where consecutive groups of four rows restarted
// four short streams every few KB.
struct RowGroup {
  int64_t first = 0, stride = 1;
  bool has_next = false;  // the same thread takes rows row(r) + 1 next
  // FP8, one token group: the four rows lie in one 128-row block, so they
  // share each 128 columns' scale, and scaled_inputs ([token][column]) holds
  // the inputs times 256 times that scale for the spans k with
  // scaled_spans[k] (see prescalable_scales).
  const float* scaled_inputs = nullptr;
  const uint8_t* scaled_spans = nullptr;
  int64_t row(int r) const { return first + r * stride; }
};

DSV4_AVX512 void dot4_float_avx512(const Linear& w, RowGroup g, const float* xs, int64_t n, double* out,
                                   int64_t out_stride) {
  const int64_t cols = w.cols;
  // With several token groups, the first decodes each chunk's BF16 rows
  // into this L1 buffer and the others load floats from it.
  alignas(64) float decoded[4 * kChunk];
  dot4_token_groups(cols, xs, n, out, out_stride,
                    [&]<int T>(int64_t c0, int64_t c1, const float* const* x, __m512 (*a)[T], int group,
                               int groups) DSV4_AVX512 {
    if (w.format == WeightFormat::F32) {
      const float* p[4];
      for (int r = 0; r < 4; ++r) p[r] = reinterpret_cast<const float*>(w.data) + g.row(r) * cols;
      for (int64_t i = c0; i < c1; i += 16)
        for (int r = 0; r < 4; ++r) fma16_tokens<T>(_mm512_loadu_ps(p[r] + i), x, i, a[r]);
      return;
    }
    const uint16_t* p[4];
    for (int r = 0; r < 4; ++r) p[r] = reinterpret_cast<const uint16_t*>(w.data) + g.row(r) * cols;
    const __m512i widen = bf16_widen_index();
    // One group (batch 1) asks for each stream's bytes kPrefetchBytesAhead
    // ahead. Several groups share the prefetches of the rows' next chunk
    // (after the last chunk, the first chunk of the rows this thread takes
    // next), each group its rows, one cache line per two steps.
    const bool next_chunk = c1 < cols;
    const bool stream_ahead = groups == 1 && g.has_next;
    const bool chunk_ahead = groups > 1 && (next_chunk || g.has_next);
    if (group > 0) {
      for (int64_t i = c0; i < c1; i += 16) {
        if ((i - c0) % 32 == 0 && chunk_ahead)
          for (int r = group; r < 4; r += groups)
            _mm_prefetch((const char*)(p[r] + (next_chunk ? c1 : cols) + (i - c0)), _MM_HINT_T0);
        for (int r = 0; r < 4; ++r) fma16_tokens<T>(_mm512_load_ps(decoded + r * kChunk + (i - c0)), x, i, a[r]);
      }
      return;
    }
    for (int64_t i = c0; i < c1; i += 16) {
      if ((i - c0) % 32 == 0) {
        if (stream_ahead)
          for (int r = 0; r < 4; ++r) _mm_prefetch((const char*)(p[r] + i) + kPrefetchBytesAhead, _MM_HINT_T0);
        else if (chunk_ahead)
          for (int r = group; r < 4; r += groups)
            _mm_prefetch((const char*)(p[r] + (next_chunk ? c1 : cols) + (i - c0)), _MM_HINT_T0);
      }
      for (int r = 0; r < 4; ++r) {
        const __m512 v = bf16x16_to_ps_avx512(p[r] + i, widen);
        if (groups > 1) _mm512_store_ps(decoded + r * kChunk + (i - c0), v);
        fma16_tokens<T>(v, x, i, a[r]);
      }
    }
  });
}

DSV4_AVX512 void dot4_fp8_avx512(const Linear& w, RowGroup g, const float* xs, int64_t n, double* out,
                                 int64_t out_stride) {
  const int64_t cols = w.cols;
  const uint8_t* p[4];
  for (int r = 0; r < 4; ++r) p[r] = w.data + g.row(r) * cols;
  // As for BF16: with several token groups the first one decodes each
  // chunk's rows into this L1 buffer, the others load floats from it.
  alignas(64) float decoded[4 * kChunk];
  dot4_token_groups(cols, xs, n, out, out_stride,
                    [&]<int T>(int64_t c0, int64_t c1, const float* const* x, __m512 (*a)[T], int group,
                               int groups) DSV4_AVX512 {
    if (group > 0) {
      for (int64_t i = c0; i < c1; i += 16)
        for (int r = 0; r < 4; ++r) fma16_tokens<T>(_mm512_load_ps(decoded + r * kChunk + (i - c0)), x, i, a[r]);
      return;
    }
    const bool keep = groups > 1;
    auto use = [&](int r, int64_t i, __m512 v) DSV4_AVX512 {
      if (keep) _mm512_store_ps(decoded + r * kChunk + (i - c0), v);
      fma16_tokens<T>(v, x, i, a[r]);
    };
    const bool prefetch = g.has_next;
    for (int64_t b = c0; b < c1; b += 128) {
      const int64_t end = std::min(c1, b + 128);
      uint8_t sb[4];
      bool half_ok = true;
      for (int r = 0; r < 4; ++r) {
        sb[r] = w.scale[(g.row(r) / 128) * w.scale_cols + b / 128];
        half_ok = half_ok && sb[r] <= kMaxHalfPathScale;
      }
      // The fp16 decoding, 32 weights a step. With one token group whose
      // four rows share the block's scale, that scale is already in the
      // inputs: each FMA gets the exact product (e4m3 * 2^-8) * (x * 2^(s -
      // 119)) = (e4m3 * 2^(s - 127)) * x that the other paths give it, same
      // bits, without the two scale multiplies per 32 weights.
      auto half_path = [&]<bool kPrescaled>() DSV4_AVX512 {
        const float* prescaled[T];
        __m512 sc[4];
        if constexpr (kPrescaled)
          for (int t = 0; t < T; ++t) prescaled[t] = g.scaled_inputs + t * cols;
        else
          for (int r = 0; r < 4; ++r) sc[r] = _mm512_set1_ps(e8m0_to_float(sb[r]) * 256.0f);
        auto put = [&](int r, int64_t i, __m512 v) DSV4_AVX512 {
          if constexpr (kPrescaled) {
            fma16_tokens<T>(v, prescaled, i, a[r]);  // groups == 1: nothing to keep
          } else {
            use(r, i, _mm512_mul_ps(v, sc[r]));
          }
        };
        int64_t i = b;
        for (; i + 32 <= end; i += 32) {
          if (prefetch && i % 64 == 0)  // one cache line per row
            for (int r = 0; r < 4; ++r) _mm_prefetch((const char*)(p[r] + i) + kPrefetchBytesAhead, _MM_HINT_T0);
          for (int r = 0; r < 4; ++r) {
            __m512 lo, hi;
            e4m3x32_to_ps_times_2m8(p[r] + i, lo, hi);
            put(r, i, lo);
            put(r, i + 16, hi);
          }
        }
        for (; i < end; i += 16)
          for (int r = 0; r < 4; ++r) put(r, i, e4m3_to_ps_times_2m8(_mm_loadu_si128((const __m128i*)(p[r] + i))));
      };
      if (g.scaled_inputs && groups == 1 && g.scaled_spans[b / 128]) {
        half_path.template operator()<true>();
      } else if (half_ok) {
        half_path.template operator()<false>();
      } else {
        for (int64_t i = b; i < end; i += 16)
          for (int r = 0; r < 4; ++r)
            use(r, i,
                e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p[r] + i)), _mm512_set1_ps(e8m0_to_float(sb[r]))));
      }
    }
  });
}

DSV4_AVX512 void dot4_fp4_avx512(const Linear& w, RowGroup g, const float* xs, int64_t n, double* out,
                                 int64_t out_stride) {
  const int64_t cols = w.cols, row_bytes = cols / 2;
  const uint8_t* p[4];
  const uint8_t* s[4];
  for (int r = 0; r < 4; ++r) {
    p[r] = w.data + g.row(r) * row_bytes;
    s[r] = w.scale + g.row(r) * w.scale_cols;
  }
  const E2m1Tables& tables = e2m1_tables();
  dot4_token_groups(cols, xs, n, out, out_stride,
                    [&]<int T>(int64_t c0, int64_t c1, const float* const* x, __m512 (*a)[T], int group,
                               int) DSV4_AVX512 {
    const bool prefetch = g.has_next && group == 0;
    for (int64_t b = c0; b < c1; b += 32) {
      if (prefetch && b % 128 == 0)  // one cache line per row
        for (int r = 0; r < 4; ++r) _mm_prefetch((const char*)(p[r] + b / 2) + kPrefetchBytesAhead, _MM_HINT_T0);
      for (int r = 0; r < 4; ++r) {
        __m512 even, odd;
        e2m1_block_avx512(p[r] + b / 2, e2m1_table_avx512(tables, s[r][b / 32]), even, odd);
        fma16_tokens<T>(even, x, b, a[r]);
        fma16_tokens<T>(odd, x, b + 16, a[r]);
      }
    }
  });
}

// The four rows of `g` against n < packed_min_tokens(w) tokens.
DSV4_AVX512 void dot4_all_tokens_avx512(const Linear& w, RowGroup g, const float* xs, int64_t n, double* out,
                                        int64_t out_stride) {
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16: dot4_float_avx512(w, g, xs, n, out, out_stride); break;
    case WeightFormat::FP8_BLOCK128: dot4_fp8_avx512(w, g, xs, n, out, out_stride); break;
    case WeightFormat::FP4_BLOCK32: dot4_fp4_avx512(w, g, xs, n, out, out_stride); break;
  }
}

// Batches, GEMM-style (n >= packed_min_tokens(w)), as outer products: a vector
// holds 16 rows, not 16 columns. The canonical order is kept lane by lane:
// lane l of (row, token) is the fp32 FMA chain over the columns c0 + 16k + l
// of a chunk, k = 0, 1, ...; the kernel runs that chain for 32 rows x 12
// tokens at once (24 accumulators, two weight vectors and one broadcast
// input per step), one lane after the other, and the 16 lanes' results are
// then folded in double with vertical adds that make the same tree as
// fold16_avx512. Same bits as dot_avx512, with half the L2 traffic of the
// dot-product form (4 rows x 6 tokens: four 64-byte weight loads per 24
// FMAs) and a third of its fold work: one core went from ~120 to ~170
// GFLOP/s (its fp32 FMA peak) over a 256 KB panel in L2.
//
// A task takes kRowBlock rows x all tokens (up to kMaxTokenBlock). For each
// chunk it decodes its rows once into a panel laid out [row group of 32]
// [lane][step][32 rows] (256 KB, in L2); each token group's inputs for the
// chunk, laid out [lane][step][token], are 48 KB and stay close in cache.
constexpr int kPanelRows = 32, kOuterTokens = 12;
// From this many tokens on, the outer form (below, the dot form). Its panel
// transpose and input packing pay off only over many tokens: with FP4
// weights from DRAM the dot form was as fast or faster up to 96 tokens
// (24: 92 vs 63 GMAC/s, 48: 98 vs 93, 96: 117 vs 114), the outer form
// faster at 128 (111 vs 95) and 1024 (115-122 vs 99-103).
constexpr int64_t kOuterMinTokens = 128;
constexpr int64_t kRowBlock = 64, kMaxTokenBlock = 4096 - 4096 % kOuterTokens;
static_assert(kMaxTokenBlock % kOuterTokens == 0 && kRowBlock % kPanelRows == 0, "blocks hold whole groups");

// Tokens per task: all of them, or for more than kMaxTokenBlock equal
// blocks (4096 tokens: two of 2052 and 2044, not 4092 and a 4-token block
// that decodes every panel again for almost no work), whole groups each.
inline int64_t balanced_token_block(int64_t n, int group) {
  const int64_t blocks = (n + kMaxTokenBlock - 1) / kMaxTokenBlock;
  const int64_t per_block = (n + blocks - 1) / blocks;
  return (per_block + group - 1) / group * group;
}

// Where column i of token `first + t` goes, in the group of `group` tokens
// that starts at `first`: chunk by chunk, lane by lane, step by step.
inline int64_t outer_packed_index(int64_t cols, int64_t first, int group, int64_t t, int64_t i) {
  const int64_t c0 = i / kChunk * kChunk, steps = (std::min(cols, c0 + kChunk) - c0) / 16;
  return first * cols + group * c0 + (i % 16) * steps * group + (i - c0) / 16 * group + t;
}

// Storage positions [c0, c1) of one row, decoded with the fast decoders into
// dst, dst + step, dst + 2 * step, ... (16 floats each).
DSV4_AVX512 void decode_chunk_avx512(const Linear& w, int64_t row, int64_t c0, int64_t c1, float* dst,
                                     int64_t step) {
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

// r[i][j] -> r[j][i] for a 16 x 16 block of floats.
DSV4_AVX512 inline void transpose16x16(__m512 r[16]) {
  __m512 a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a0 = _mm512_castps_pd(a[4 * i]), a1 = _mm512_castps_pd(a[4 * i + 1]);
    const __m512d a2 = _mm512_castps_pd(a[4 * i + 2]), a3 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // b[4i + m], 128-bit lane L, holds rows 4i..4i+3 of column 4L + m.
  for (int m = 0; m < 4; ++m) {
    const __m512 e0 = _mm512_shuffle_f32x4(b[m], b[4 + m], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 e1 = _mm512_shuffle_f32x4(b[m], b[4 + m], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 e2 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 e3 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(3, 2, 3, 2));
    r[m] = _mm512_shuffle_f32x4(e0, e2, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + m] = _mm512_shuffle_f32x4(e0, e2, _MM_SHUFFLE(3, 1, 3, 1));
    r[8 + m] = _mm512_shuffle_f32x4(e1, e3, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + m] = _mm512_shuffle_f32x4(e1, e3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Rows [row, row + count) (count <= 16; the rest of the 16 are zeros),
// storage positions [c0, c0 + 16 * steps), into a panel row group: for lane
// l and step k, the 16 rows land at panel[(l * steps + k) * kPanelRows].
DSV4_AVX512 void decode_rows_to_panel(const Linear& w, int64_t row, int count, int64_t c0, int64_t steps,
                                      float* rows_tmp, float* panel) {
  for (int r = 0; r < 16; ++r) {
    float* dst = rows_tmp + r * steps * 16;
    if (r < count) decode_chunk_avx512(w, row + r, c0, c0 + steps * 16, dst, 16);
    else std::fill_n(dst, steps * 16, 0.0f);
  }
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
  __m512 a[T][2];
  for (auto& t : a) t[0] = t[1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < steps; ++k, w += kPanelRows, x += T) {
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[t]);
      a[t][0] = _mm512_fmadd_ps(w0, xb, a[t][0]);
      a[t][1] = _mm512_fmadd_ps(w1, xb, a[t][1]);
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(out + t * kPanelRows, a[t][0]);
    _mm512_storeu_ps(out + t * kPanelRows + 16, a[t][1]);
  }
}

// The 16 lanes of a row group x T tokens (lane l's results at
// lanes[(l * T + t) * 32 + row]), folded with fold16_avx512's tree, eight
// rows at a time, and added to sums[t * sums_stride + row].
DSV4_AVX512 void fold_lanes(const float* lanes, int tokens, double* sums, int64_t sums_stride) {
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < kPanelRows; h += 8) {
      __m512d l[16];
      for (int q = 0; q < 16; ++q) l[q] = _mm512_cvtps_pd(_mm256_loadu_ps(lanes + (q * tokens + t) * kPanelRows + h));
      for (int q = 0; q < 8; ++q) l[q] = _mm512_add_pd(l[q], l[q + 8]);
      for (int q = 0; q < 4; ++q) l[q] = _mm512_add_pd(l[q], l[q + 4]);
      for (int q = 0; q < 2; ++q) l[q] = _mm512_add_pd(l[q], l[q + 2]);
      double* s = sums + t * sums_stride + h;
      _mm512_storeu_pd(s, _mm512_add_pd(_mm512_loadu_pd(s), _mm512_add_pd(l[0], l[1])));
    }
}

DSV4_AVX512 void outer_lane_kernel_any(int tokens, const float* w, const float* x, int64_t steps, float* out) {
  switch (tokens) {
    case 12: outer_lane_kernel<12>(w, x, steps, out); break;
    case 11: outer_lane_kernel<11>(w, x, steps, out); break;
    case 10: outer_lane_kernel<10>(w, x, steps, out); break;
    case 9: outer_lane_kernel<9>(w, x, steps, out); break;
    case 8: outer_lane_kernel<8>(w, x, steps, out); break;
    case 7: outer_lane_kernel<7>(w, x, steps, out); break;
    case 6: outer_lane_kernel<6>(w, x, steps, out); break;
    case 5: outer_lane_kernel<5>(w, x, steps, out); break;
    case 4: outer_lane_kernel<4>(w, x, steps, out); break;
    case 3: outer_lane_kernel<3>(w, x, steps, out); break;
    case 2: outer_lane_kernel<2>(w, x, steps, out); break;
    default: outer_lane_kernel<1>(w, x, steps, out); break;
  }
}

// Copies token t of n (cols floats in storage order) to its packed place.
void pack_token_outer(const float* src, int64_t cols, int64_t n, int64_t t, float* xp) {
  const int64_t first = t / kOuterTokens * kOuterTokens;
  const int group = int(std::min<int64_t>(kOuterTokens, n - first));
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t steps = (std::min(cols, c0 + kChunk) - c0) / 16;
    float* dst = xp + outer_packed_index(cols, first, group, t - first, c0);
    for (int l = 0; l < 16; ++l)
      for (int64_t k = 0; k < steps; ++k) dst[(l * steps + k) * group] = src[c0 + k * 16 + l];
  }
}

// Asks L2 for the weight bytes of storage positions [c0, c1) of rows
// [row0, row1), so that reading the next panel overlaps the FMAs of this one.
void prefetch_weights(const Linear& w, int64_t row0, int64_t row1, int64_t c0, int64_t c1) {
  const int64_t bits = w.format == WeightFormat::F32 ? 32 : w.format == WeightFormat::BF16 ? 16
                       : w.format == WeightFormat::FP8_BLOCK128 ? 8 : 4;
  for (int64_t r = row0; r < row1; ++r) {
    const uint8_t* p = w.data + r * w.cols * bits / 8;
    for (int64_t b = c0 * bits / 8; b < c1 * bits / 8; b += 64) _mm_prefetch((const char*)(p + b), _MM_HINT_T1);
  }
}

// How a packed product splits into tasks of row_block rows x token_block
// tokens (token blocks major, so that consecutive tasks share their tokens).
// Threads claim tasks one at a time (schedule(dynamic)): on a shared
// machine a thread that loses its core for a while no longer holds the
// other at the end of every product. With a static split, the FP8 and FP4
// products of 128-1024 tokens on this 2-vCPU VM ran 80-105 GMAC/s in its
// noisy phases against 105-120 with claiming, at the same best. Fewer
// tasks than threads (a small matrix, few tokens): smaller row blocks, whole
// multiples of `row_unit`, so that every thread gets rows. The blocking
// never changes bits.
struct PackedTasks {
  int64_t token_block, token_blocks, row_block, row_blocks;
  int64_t count() const { return row_blocks * token_blocks; }
  int64_t first_token(int64_t task) const { return task / row_blocks * token_block; }
  int64_t first_row(int64_t task) const { return task % row_blocks * row_block; }
};

PackedTasks packed_tasks(int64_t out, int64_t n, int threads, int token_group, int64_t row_unit) {
  PackedTasks p;
  p.token_block = balanced_token_block(n, token_group);
  p.token_blocks = (n + p.token_block - 1) / p.token_block;
  p.row_block = kRowBlock;
  if (((out + kRowBlock - 1) / kRowBlock) * p.token_blocks < threads)
    p.row_block = std::clamp<int64_t>((out + threads - 1) / threads, row_unit, kRowBlock) / row_unit * row_unit;
  p.row_blocks = (out + p.row_block - 1) / p.row_block;
  return p;
}

// The panel after the one of (task, chunk [.., c1)): this task's next chunk,
// or the first chunk of the next task (which the next thread to finish
// claims; from another core's L2 it is still closer than DRAM). Its rows
// are asked for in `token_groups` parts, one before each token group of the
// current panel, so that reading it overlaps the FMAs.
struct NextPanel {
  int64_t row0, rows, c0, c1, rows_per_part;
};

NextPanel next_panel(const PackedTasks& tasks, int64_t out, int64_t cols, int64_t task, int64_t c1,
                     int64_t token_groups) {
  NextPanel next{tasks.first_row(task), 0, c1, 0, 0};
  if (c1 == cols) {
    next.row0 = tasks.first_row(task + 1);
    next.c0 = 0;
  }
  next.rows = std::min(tasks.row_block, out - next.row0);
  next.c1 = std::min(cols, next.c0 + kChunk);
  next.rows_per_part = (next.rows + token_groups - 1) / token_groups;
  return next;
}

void prefetch_next_panel_part(const Linear& w, int64_t row_begin, const NextPanel& next, int64_t part) {
  const int64_t first = part * next.rows_per_part;
  prefetch_weights(w, row_begin + next.row0 + std::min(first, next.rows),
                   row_begin + next.row0 + std::min(first + next.rows_per_part, next.rows), next.c0, next.c1);
}

// Y[t][o] for the task's rows and tokens, from its double sums.
void store_task_sums(const double* sums, int64_t row_stride, int64_t token_stride, int64_t nt, int64_t nr,
                     float* y, int64_t y_stride) {
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t r = 0; r < nr; ++r) y[t * y_stride + r] = float(sums[r * row_stride + t * token_stride]);
}

// The dot-product form, from packed_min_tokens(w) to kOuterMinTokens - 1
// tokens: a vector holds 16 columns of one (row, token) pair, the canonical
// lanes themselves. Tokens are packed in groups of kDotTokens: for every 16
// storage positions, the group's tokens' 16 floats back to back. For each
// chunk a task decodes its rows into a panel (for every 16 positions, four
// rows' 16 floats back to back) and sweeps register blocks of 4 rows x 6
// tokens over it; each chunk's lanes are folded with fold16_avx512. Its
// panel needs no transpose, which is what a batch of 16 decoding sequences
// or a prefill's routed experts (~100 tokens each) want.
constexpr int kDotRows = 4, kDotTokens = 6;
static_assert(kMaxTokenBlock % kDotTokens == 0 && kRowBlock % kDotRows == 0, "blocks hold whole groups");

// Element (t, i) of the token group of `group` tokens that starts at `first`.
inline int64_t dot_packed_index(int64_t cols, int64_t first, int group, int64_t t, int64_t i) {
  return first * cols + (i / 16) * (group * 16) + t * 16 + (i % 16);
}
// R rows of a panel against T tokens of a packed group, `steps` x 16
// positions; the folded chunk is added to sum[r * sum_stride + t].
template <int R, int T>
DSV4_AVX512 void micro_kernel_avx512(const float* w, const float* x, int64_t steps, double* sum,
                                     int64_t sum_stride) {
  __m512 a[R][T];
  for (auto& r : a)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s, w += R * 16, x += T * 16) {
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = _mm512_loadu_ps(w + r * 16);
      for (int t = 0; t < T; ++t) a[r][t] = _mm512_fmadd_ps(wv, xv[t], a[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) sum[r * sum_stride + t] += fold16_avx512(a[r][t]);
}

template <int R>
DSV4_AVX512 void micro_kernel_rows_avx512(int tokens, const float* w, const float* x, int64_t steps, double* sum,
                                          int64_t sum_stride) {
  switch (tokens) {
    case 6: micro_kernel_avx512<R, 6>(w, x, steps, sum, sum_stride); break;
    case 5: micro_kernel_avx512<R, 5>(w, x, steps, sum, sum_stride); break;
    case 4: micro_kernel_avx512<R, 4>(w, x, steps, sum, sum_stride); break;
    case 3: micro_kernel_avx512<R, 3>(w, x, steps, sum, sum_stride); break;
    case 2: micro_kernel_avx512<R, 2>(w, x, steps, sum, sum_stride); break;
    default: micro_kernel_avx512<R, 1>(w, x, steps, sum, sum_stride); break;
  }
}

DSV4_AVX512 void micro_kernel_any_avx512(int rows, int tokens, const float* w, const float* x, int64_t steps,
                                         double* sum, int64_t sum_stride) {
  switch (rows) {
    case 4: micro_kernel_rows_avx512<4>(tokens, w, x, steps, sum, sum_stride); break;
    case 3: micro_kernel_rows_avx512<3>(tokens, w, x, steps, sum, sum_stride); break;
    case 2: micro_kernel_rows_avx512<2>(tokens, w, x, steps, sum, sum_stride); break;
    default: micro_kernel_rows_avx512<1>(tokens, w, x, steps, sum, sum_stride); break;
  }
}

// Copies token t of n (cols floats in storage order) to its packed place.
void pack_token_dot(const float* src, int64_t cols, int64_t n, int64_t t, float* xp) {
  const int64_t first = t / kDotTokens * kDotTokens;
  const int group = int(std::min<int64_t>(kDotTokens, n - first));
  float* dst = xp + dot_packed_index(cols, first, group, t - first, 0);
  for (int64_t i = 0; i < cols; i += 16, dst += group * 16) std::copy_n(src + i, 16, dst);
}

// Y[t][o] for rows [row_begin, row_begin + out) and n packed tokens (xp),
// on `threads` threads.
DSV4_AVX512 void packed_gemm_dot_avx512(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n,
                                    float* y, int64_t y_stride, int threads) {
  const int64_t cols = w.cols;
  const PackedTasks tasks = packed_tasks(out, n, threads, kDotTokens, kDotRows);
  const int64_t token_block = tasks.token_block;
#pragma omp parallel num_threads(threads)
  {
    float* panel = thread_scratch_array<float>(ScratchSlot::GemmPanel, kRowBlock * kChunk);
    double* sums = thread_scratch_array<double>(ScratchSlot::GemmSums, kRowBlock * token_block);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks.count(); ++task) {
      const int64_t t0 = tasks.first_token(task), r0 = tasks.first_row(task);
      const int64_t nt = std::min(token_block, n - t0), nr = std::min(tasks.row_block, out - r0);
      std::fill_n(sums, kRowBlock * token_block, 0.0);
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t c1 = std::min(cols, c0 + kChunk), steps = (c1 - c0) / 16;
        const NextPanel next = next_panel(tasks, out, cols, task, c1, (nt + kDotTokens - 1) / kDotTokens);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t g = r / kDotRows * kDotRows;
          const int64_t rows_in_group = std::min<int64_t>(kDotRows, nr - g);
          decode_chunk_avx512(w, row_begin + r0 + r, c0, c1, panel + g * kChunk + (r - g) * 16,
                              rows_in_group * 16);
        }
        for (int64_t tg = t0; tg < t0 + nt; tg += kDotTokens) {
          prefetch_next_panel_part(w, row_begin, next, (tg - t0) / kDotTokens);
          const int group = int(std::min<int64_t>(kDotTokens, n - tg));
          const float* xg = xp + tg * cols + (c0 / 16) * (group * 16);
          for (int64_t g = 0; g < nr; g += kDotRows)
            micro_kernel_any_avx512(int(std::min<int64_t>(kDotRows, nr - g)), group, panel + g * kChunk, xg,
                                    steps, sums + g * token_block + (tg - t0), token_block);
        }
      }
      store_task_sums(sums, token_block, 1, nt, nr, y + t0 * y_stride + r0, y_stride);
    }
  }
}

// Y[t][o] for rows [row_begin, row_begin + out) and n packed tokens (xp),
// on `threads` threads.
// The outer form's driver, shared by the AVX-512 and AVX2 kernels: tasks of
// rows x tokens, each chunk's rows decoded once into a panel
// (decode_rows(row, count, c0, steps, rows_tmp, panel) for 16 rows), then
// for each token group and panel row group the 16 lanes' FMA chains
// (lane_chains(group, panel_group, inputs, steps, lanes)) and their fold
// (fold(lanes, group, sums, stride)).
template <class DecodeRows, class LaneChains, class Fold>
void packed_gemm_outer(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                       int64_t y_stride, int threads, const DecodeRows& decode_rows, const LaneChains& lane_chains,
                       const Fold& fold) {
  const int64_t cols = w.cols;
  const PackedTasks tasks = packed_tasks(out, n, threads, kOuterTokens, kPanelRows);
  const int64_t token_block = tasks.token_block;
#pragma omp parallel num_threads(threads)
  {
    float* panel = thread_scratch_array<float>(ScratchSlot::GemmPanel, kRowBlock * kChunk);
    float* rows_tmp = thread_scratch_array<float>(ScratchSlot::GemmRows, 16 * kChunk);
    float* lanes = thread_scratch_array<float>(ScratchSlot::GemmLanes, 16 * kOuterTokens * kPanelRows);
    double* sums = thread_scratch_array<double>(ScratchSlot::GemmSums, token_block * kRowBlock);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks.count(); ++task) {
      const int64_t t0 = tasks.first_token(task), r0 = tasks.first_row(task);
      const int64_t nt = std::min(token_block, n - t0), nr = std::min(tasks.row_block, out - r0);
      const int64_t row_groups = (nr + kPanelRows - 1) / kPanelRows;
      std::fill_n(sums, nt * kRowBlock, 0.0);
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t c1 = std::min(cols, c0 + kChunk), steps = (c1 - c0) / 16;
        const NextPanel next = next_panel(tasks, out, cols, task, c1, (nt + kOuterTokens - 1) / kOuterTokens);
        for (int64_t r = 0; r < row_groups * kPanelRows; r += 16)
          decode_rows(row_begin + r0 + r, int(std::clamp<int64_t>(nr - r, 0, 16)), c0, steps, rows_tmp,
                      panel + (r / kPanelRows) * 16 * steps * kPanelRows + r % kPanelRows);
        for (int64_t tg = t0; tg < t0 + nt; tg += kOuterTokens) {
          prefetch_next_panel_part(w, row_begin, next, (tg - t0) / kOuterTokens);
          const int group = int(std::min<int64_t>(kOuterTokens, n - tg));
          const float* xg = xp + tg * cols + group * c0;
          for (int64_t g = 0; g < row_groups; ++g) {
            lane_chains(group, panel + g * 16 * steps * kPanelRows, xg, steps, lanes);
            fold(lanes, group, sums + (tg - t0) * kRowBlock + g * kPanelRows, kRowBlock);
          }
        }
      }
      store_task_sums(sums, 1, kRowBlock, nt, nr, y + t0 * y_stride + r0, y_stride);
    }
  }
}

void packed_gemm_outer_avx512(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                              int64_t y_stride, int threads) {
  packed_gemm_outer(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int count, int64_t c0, int64_t steps, float* rows_tmp, float* panel) DSV4_AVX512 {
        decode_rows_to_panel(w, row, count, c0, steps, rows_tmp, panel);
      },
      [](int group, const float* pg, const float* xg, int64_t steps, float* lanes) DSV4_AVX512 {
        for (int l = 0; l < 16; ++l)
          outer_lane_kernel_any(group, pg + l * steps * kPanelRows, xg + l * steps * group, steps,
                                lanes + l * group * kPanelRows);
      },
      fold_lanes);
}

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
  __m256 a[T][2];
  for (auto& t : a) t[0] = t[1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < steps; ++k, w += kPanelRows, x += group) {
    const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
    for (int t = 0; t < T; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + t);
      a[t][0] = _mm256_fmadd_ps(w0, xb, a[t][0]);
      a[t][1] = _mm256_fmadd_ps(w1, xb, a[t][1]);
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(out + t * kPanelRows, a[t][0]);
    _mm256_storeu_ps(out + t * kPanelRows + 8, a[t][1]);
  }
}

DSV4_AVX2 void outer_lane_kernel_any_avx2(int tokens, const float* w, const float* x, int group, int64_t steps,
                                          float* out) {
  switch (tokens) {
    case 6: outer_lane_kernel_avx2<6>(w, x, group, steps, out); break;
    case 5: outer_lane_kernel_avx2<5>(w, x, group, steps, out); break;
    case 4: outer_lane_kernel_avx2<4>(w, x, group, steps, out); break;
    case 3: outer_lane_kernel_avx2<3>(w, x, group, steps, out); break;
    case 2: outer_lane_kernel_avx2<2>(w, x, group, steps, out); break;
    default: outer_lane_kernel_avx2<1>(w, x, group, steps, out); break;
  }
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

void packed_gemm_outer_avx2(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                            int64_t y_stride, int threads) {
  packed_gemm_outer(
      w, row_begin, out, xp, n, y, y_stride, threads,
      [&](int64_t row, int count, int64_t c0, int64_t steps, float* rows_tmp, float* panel) DSV4_AVX2 {
        decode_rows_to_panel_avx2(w, row, count, c0, steps, rows_tmp, panel);
      },
      [](int group, const float* pg, const float* xg, int64_t steps, float* lanes) DSV4_AVX2 {
        for (int l = 0; l < 16; ++l)
          for (int half = 0; half < 2; ++half)
            for (int u = 0; u < group; u += kOuterTokensAvx2)
              outer_lane_kernel_any_avx2(std::min(kOuterTokensAvx2, group - u),
                                         pg + l * steps * kPanelRows + 16 * half, xg + l * steps * group + u, group,
                                         steps, lanes + (l * group + u) * kPanelRows + 16 * half);
      },
      fold_lanes_avx2);
}

// ------------------------------------------------------------- dispatch ---

using DotFn = double (*)(const Linear&, int64_t, const float*);

DotFn dot_for(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return dot_avx512;
    case KernelIsa::Avx2: return dot_avx2;
    default: return dot_scalar;
  }
}

void check_width(const Linear& w) {
  if (w.cols % 16) throw Error("linear input width " + std::to_string(w.cols) + " is not a multiple of 16");
  if (w.format == WeightFormat::FP4_BLOCK32 && w.cols % 32)
    throw Error("FP4 weight width " + std::to_string(w.cols) + " is not a multiple of its 32-column scale blocks");
}

}  // namespace

double linear_dot(const Linear& w, int64_t row, const float* x, KernelIsa isa) {
  check_width(w);
  AlignedVector<float> xs(static_cast<size_t>(w.cols));
  to_storage_order(w, x, xs.data());
  return dot_for(isa)(w, row, xs.data());
}

void linear_decode_row(const Linear& w, int64_t row, float* out) {
  float tmp[16];
  for (int64_t i = 0; i < w.cols; i += 16) {
    decode16(w, row, i, tmp);
    std::copy_n(tmp, std::min<int64_t>(16, w.cols - i), out + i);
  }
}

double linear_dot_reference(const Linear& w, int64_t row, const float* x) {
  std::vector<float> wr(static_cast<size_t>(w.cols));
  linear_decode_row(w, row, wr.data());
  long double sum = 0.0L;
  for (int64_t i = 0; i < w.cols; ++i) sum += (long double)wr[size_t(i)] * (long double)x[i];
  return double(sum);
}

namespace {

// Inputs in storage order (rounded through FP8 if asked: the round trip
// works on 128-column blocks, which the FP4 storage order only permutes
// within), packed for the GEMM when `packed`. `row` is the thread's scratch row.
void prepare_token(const Linear& w, const float* x, int64_t n, int64_t t, bool packed, bool outer, float* row,
                   float* xs) {
  const int64_t cols = w.cols;
  float* dst = packed ? row : xs + t * cols;
  to_storage_order(w, x + t * cols, dst);
  if (w.quantize_input) fp8_round_trip(dst, cols, 128);
  if (packed && outer) pack_token_outer(dst, cols, n, t, xs);
  else if (packed) pack_token_dot(dst, cols, n, t, xs);
}

// Rows [lo, hi) of rows [row_begin, row_begin + out) against n register-path
// tokens, as four streams (see RowGroup); the last rows of a range that
// does not split in four go one by one.
void rows_as_four_streams(const Linear& w, int64_t row_begin, int64_t lo, int64_t hi, const float* xs, int64_t n,
                          float* y, int64_t y_stride) {
  const int64_t quarter = (hi - lo) / 4;
  for (int64_t j = 0; j < quarter; ++j) {
    const RowGroup g{row_begin + lo + j, quarter, j + 1 < quarter};
    double r[4 * kMaxRegisterTokens];
    dot4_all_tokens_avx512(w, g, xs, n, r, 4);
    for (int64_t t = 0; t < n; ++t)
      for (int q = 0; q < 4; ++q) y[t * y_stride + lo + j + q * quarter] = float(r[t * 4 + q]);
  }
  for (int64_t o = lo + 4 * quarter; o < hi; ++o)
    for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = float(dot_avx512(w, row_begin + o, xs + t * w.cols));
}

// The FP8 scale bytes s for which the inputs xs[0 .. count) times
// 2^(s - 119) (the block scale times the 256 of the fp16 decoding) are all
// exact: scaling up is exact until a value overflows, scaling down until a
// nonzero one leaves the normal floats. None ([1, 0]) when an input is not
// finite. Inputs rounded through FP8 span a few dozen binades, so every
// realistic scale qualifies.
std::pair<int, int> prescalable_scales(const float* xs, int64_t count) {
  int min_field = 255, max_field = 0;  // exponent fields of the nonzero |x|
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, xs + i, 4);
    const int field = int(bits >> 23 & 0xff);
    if (field == 255) return {1, 0};
    if ((bits & 0x7fffffffu) == 0) continue;
    min_field = std::min(min_field, field);
    max_field = std::max(max_field, field);
  }
  // Down: the smallest value, 2^(min_field - 127) or less for a subnormal,
  // needs min_field - 127 + s - 119 >= -126. Up: the largest, below
  // 2^(max_field - 126), needs max_field - 127 + s - 119 <= 127.
  return {std::max(0, 120 - min_field), std::min<int>(kMaxHalfPathScale, 373 - max_field)};
}

// Rows [o0, o1) against n register-path tokens. FP8 rows that fill whole
// 128-row blocks go as four streams 32 rows apart inside each block: the
// four rows of a group then share their scales, and for one token each
// block's scales go into a copy of the input once, for its 32 groups,
// instead of into every decoded weight (1 MB in L2, 1 thread: 10.5-11.1 ->
// 11.7-12.3 GMAC/s). With 2-4 tokens that path was slower (4 tokens: 26.5
// -> 23.5), the grouping alone as fast. The other rows go as four streams
// over the range.
DSV4_AVX512 void register_rows(const Linear& w, int64_t row_begin, int64_t o0, int64_t o1, const float* xs, int64_t n,
                               float* y, int64_t y_stride) {
  const int64_t blocks_begin = (row_begin + o0 + 127) / 128 * 128 - row_begin;
  const int64_t blocks_end = (row_begin + o1) / 128 * 128 - row_begin;
  if (w.format != WeightFormat::FP8_BLOCK128 || blocks_begin >= blocks_end) {
    rows_as_four_streams(w, row_begin, o0, o1, xs, n, y, y_stride);
    return;
  }
  rows_as_four_streams(w, row_begin, o0, blocks_begin, xs, n, y, y_stride);
  const int64_t cols = w.cols, spans = w.scale_cols;
  const bool prescale = n == 1;
  const auto [prescale_min, prescale_max] = prescale ? prescalable_scales(xs, n * cols) : std::pair<int, int>{1, 0};
  float* scaled = nullptr;  // the scaled inputs, then a flag per span, in one scratch block
  uint8_t* scaled_spans = nullptr;
  if (prescale) {
    scaled = static_cast<float*>(thread_scratch(ScratchSlot::ScaledInput, size_t(n * cols) * 4 + size_t(spans)));
    scaled_spans = reinterpret_cast<uint8_t*>(scaled + n * cols);
  }
  for (int64_t block = blocks_begin; block < blocks_end; block += 128) {
    if (prescale) {
      const uint8_t* scale_row = w.scale + (row_begin + block) / 128 * spans;
      for (int64_t k = 0; k < spans; ++k) {
        const int s = scale_row[k];
        scaled_spans[k] = s >= prescale_min && s <= prescale_max;
        if (!scaled_spans[k]) continue;
        const __m512 f = _mm512_set1_ps(e8m0_to_float(uint8_t(s)) * 256.0f);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = k * 128; c < std::min(cols, k * 128 + 128); c += 16)
            _mm512_storeu_ps(scaled + t * cols + c, _mm512_mul_ps(_mm512_loadu_ps(xs + t * cols + c), f));
      }
    }
    for (int64_t j = 0; j < 32; ++j) {
      const RowGroup g{row_begin + block + j, 32, j + 1 < 32, scaled, scaled_spans};
      double r[4 * kMaxRegisterTokens];
      dot4_all_tokens_avx512(w, g, xs, n, r, 4);
      for (int64_t t = 0; t < n; ++t)
        for (int q = 0; q < 4; ++q) y[t * y_stride + block + j + 32 * q] = float(r[t * 4 + q]);
    }
  }
  rows_as_four_streams(w, row_begin, blocks_end, o1, xs, n, y, y_stride);
}

// Piece `id` of `pieces` of rows [row_begin, row_begin + out): an equal
// share of the rows, for FP8 with its ends moved to the nearest 128-row
// block boundary (see register_rows).
void register_rows_piece(const Linear& w, int64_t row_begin, int64_t out, const float* xs, int64_t n, float* y,
                         int64_t y_stride, int64_t id, int64_t pieces) {
  auto bound = [&](int64_t k) {
    const int64_t b = out * k / pieces;
    if (w.format != WeightFormat::FP8_BLOCK128 || k == 0 || k == pieces) return b;
    return std::clamp<int64_t>((row_begin + b + 64) / 128 * 128 - row_begin, 0, out);
  };
  register_rows(w, row_begin, bound(id), bound(id + 1), xs, n, y, y_stride);
}

// How many pieces the register path cuts a matrix of `out` rows into for
// `threads` threads, which claim them one at a time: on a shared machine a
// thread that loses its core for a while leaves its later pieces to the
// other instead of holding it at the end of the product. Pieces keep at
// least 64 rows (four streams of 16) once there are more than threads.
constexpr int64_t kRegisterPiecesPerThread = 4;
int64_t register_pieces(int64_t out, int threads) {
  return std::max<int64_t>(threads, std::min<int64_t>(out / 64, threads * kRegisterPiecesPerThread));
}

}  // namespace

void linear_forward(KernelIsa isa, const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin,
                    int64_t row_end, int64_t y_stride) {
  if (row_end < 0) row_end = w.rows;
  const int64_t out = row_end - row_begin;
  if (y_stride < 0) y_stride = out;
  const int64_t cols = w.cols;
  check_width(w);
  const bool outer = n >= kOuterMinTokens;
  // AVX2 has the outer form only (its dot form is dot_tokens_avx2).
  const bool packed = n >= packed_min_tokens(w) && out >= kPackedMinRows &&
                      (isa == KernelIsa::Avx512 || (isa == KernelIsa::Avx2 && outer));
  float* xs = thread_scratch_array<float>(ScratchSlot::LinearInput, n * cols);
#pragma omp parallel num_threads(threads_for(n * cols * 16))
  {
    float* row = thread_scratch_array<float>(ScratchSlot::LinearRow, cols);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) prepare_token(w, x, n, t, packed, outer, row, xs);
  }
  const int threads = threads_for(out * cols * std::max<int64_t>(n, 1));
  if (packed) {
    if (isa == KernelIsa::Avx2) packed_gemm_outer_avx2(w, row_begin, out, xs, n, y, y_stride, threads);
    else if (outer) packed_gemm_outer_avx512(w, row_begin, out, xs, n, y, y_stride, threads);
    else packed_gemm_dot_avx512(w, row_begin, out, xs, n, y, y_stride, threads);
    return;
  }
  if (isa == KernelIsa::Avx512) {
    // Up to kMaxRegisterTokens tokens per item (more only for matrices of
    // few rows, see kPackedMinRows).
    const int64_t token_blocks = (n + kMaxRegisterTokens - 1) / kMaxRegisterTokens;
#pragma omp parallel num_threads(threads)
    {
      const int64_t pieces = register_pieces(out, omp_get_num_threads());
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < token_blocks * pieces; ++item) {
        const int64_t t0 = item / pieces * kMaxRegisterTokens, piece = item % pieces;
        register_rows_piece(w, row_begin, out, xs + t0 * cols, std::min(kMaxRegisterTokens, n - t0),
                            y + t0 * y_stride, y_stride, piece, pieces);
      }
    }
    return;
  }
  if (isa == KernelIsa::Avx2 && n == 1) {
    // One token: pieces of rows as four streams each (see RowGroup).
#pragma omp parallel num_threads(threads)
    {
      const int64_t pieces = register_pieces(out, omp_get_num_threads());
#pragma omp for schedule(dynamic, 1)
      for (int64_t piece = 0; piece < pieces; ++piece)
        rows_one_token_avx2(w, row_begin, out * piece / pieces, out * (piece + 1) / pieces, xs, y);
    }
    return;
  }
  const DotFn dot = dot_for(isa);
  const int64_t tile = 16;
  const int64_t n_tiles = (out + tile - 1) / tile;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t k = 0; k < n_tiles; ++k)
    for (int64_t o = k * tile; o < std::min(out, (k + 1) * tile); ++o) {
      if (isa == KernelIsa::Avx2) dot_tokens_avx2(w, row_begin + o, xs, n, y + o, y_stride);
      else
        for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = float(dot(w, row_begin + o, xs + t * cols));
    }
}

void linear_forward_many(KernelIsa isa, const LinearProduct* products, size_t count) {
  std::vector<size_t> fused;
  std::vector<int64_t> offset;
  int64_t floats = 0, work = 0;
  for (size_t i = 0; i < count; ++i) {
    const LinearProduct& p = products[i];
    check_width(*p.w);
    if (isa != KernelIsa::Avx512 || p.n < 1 || p.n >= packed_min_tokens(*p.w)) {
      linear_forward(isa, *p.w, p.x, p.n, p.y);
      continue;
    }
    fused.push_back(i);
    offset.push_back(floats);
    floats += p.n * p.w->cols;
    work += p.n * p.w->cols * p.w->rows;
  }
  if (fused.empty()) return;
  float* xs = thread_scratch_array<float>(ScratchSlot::LinearInput, floats);
  struct Piece {
    size_t product;  // index in fused
    int64_t piece, pieces;
  };
  std::vector<Piece> pieces;
#pragma omp parallel num_threads(threads_for(work))
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    for (size_t k = 0; k < fused.size(); ++k) {
      const LinearProduct& p = products[fused[k]];
      for (int64_t t = 0; t < p.n; ++t)
        if ((k + size_t(t)) % size_t(nt) == size_t(id))
          prepare_token(*p.w, p.x, p.n, t, false, false, nullptr, xs + offset[k]);
    }
#pragma omp single
    for (size_t k = 0; k < fused.size(); ++k) {
      const int64_t count = register_pieces(products[fused[k]].w->rows, nt);
      for (int64_t piece = 0; piece < count; ++piece) pieces.push_back({k, piece, count});
    }
    // (The single's barrier also waits for every token's prepared input.)
#pragma omp for schedule(dynamic, 1)
    for (size_t item = 0; item < pieces.size(); ++item) {
      const Piece& q = pieces[item];
      const LinearProduct& p = products[fused[q.product]];
      register_rows_piece(*p.w, 0, p.w->rows, xs + offset[q.product], p.n, p.y, p.w->rows, q.piece, q.pieces);
    }
  }
}

}  // namespace dsv4
