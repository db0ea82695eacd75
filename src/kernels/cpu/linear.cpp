#include "kernels/cpu/linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"

namespace dsv4 {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::FP8_BLOCK128: return "FP8 (e4m3, 128x128 ue8m0 blocks)";
    case WeightFormat::FP4_BLOCK32: return "FP4 (e2m1, 1x32 ue8m0 blocks)";
  }
  return "?";
}

int64_t Linear::weight_bytes() const {
  switch (format) {
    case WeightFormat::F32: return rows * cols * 4;
    case WeightFormat::BF16: return rows * cols * 2;
    case WeightFormat::FP8_BLOCK128: return rows * cols + ((rows + 127) / 128) * scale_cols;
    case WeightFormat::FP4_BLOCK32: return rows * cols / 2 + rows * scale_cols;
  }
  return 0;
}

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

// The canonical fold of the 16 lanes.
inline double fold16(const double* acc) {
  double s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

double dot_scalar(const Linear& w, int64_t row, const double* x) {
  double acc[16] = {};
  float wv[16];
  for (int64_t i = 0; i < w.cols; i += 16) {
    decode16(w, row, i, wv);
    for (int l = 0; l < 16; ++l) acc[l] += double(wv[l]) * x[i + l];
  }
  return fold16(acc);
}

// ------------------------------------------------------------------ AVX2 ---

__attribute__((target("avx2,fma"))) inline __m256 e4m3_to_ps_avx2(__m128i bytes8, __m256 scale) {
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

__attribute__((target("avx2,fma"))) inline __m256 e2m1_to_ps_avx2(__m256i nibbles, __m256 scale) {
  const __m256 mags = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  __m256 v = _mm256_permutevar8x32_ps(mags, _mm256_and_si256(nibbles, _mm256_set1_epi32(7)));
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nibbles, _mm256_set1_epi32(8)), 28);
  v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
  return _mm256_mul_ps(v, scale);
}

// acc0..acc3 hold lanes 0-3, 4-7, 8-11, 12-15.
__attribute__((target("avx2,fma"))) inline void fma16_avx2(__m256 lo, __m256 hi, const double* x,
                                                           __m256d& a0, __m256d& a1, __m256d& a2,
                                                           __m256d& a3) {
  a0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo)), _mm256_loadu_pd(x), a0);
  a1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)), _mm256_loadu_pd(x + 4), a1);
  a2 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(hi)), _mm256_loadu_pd(x + 8), a2);
  a3 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)), _mm256_loadu_pd(x + 12), a3);
}

__attribute__((target("avx2,fma"))) double dot_avx2(const Linear& w, int64_t row, const double* x) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: {
      const float* p = reinterpret_cast<const float*>(w.data) + row * n;
      for (int64_t i = 0; i < n; i += 16)
        fma16_avx2(_mm256_loadu_ps(p + i), _mm256_loadu_ps(p + i + 8), x + i, a0, a1, a2, a3);
      break;
    }
    case WeightFormat::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + row * n;
      for (int64_t i = 0; i < n; i += 16) {
        __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + i))), 16);
        __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + i + 8))), 16);
        fma16_avx2(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), x + i, a0, a1, a2, a3);
      }
      break;
    }
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* p = w.data + row * n;
      const uint8_t* s = w.scale + (row / 128) * w.scale_cols;
      for (int64_t i = 0; i < n; i += 16) {
        __m256 sc = _mm256_set1_ps(e8m0_to_float(s[i / 128]));
        __m128i b = _mm_loadu_si128((const __m128i*)(p + i));
        fma16_avx2(e4m3_to_ps_avx2(b, sc), e4m3_to_ps_avx2(_mm_srli_si128(b, 8), sc), x + i, a0, a1, a2, a3);
      }
      break;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* p = w.data + row * (n / 2);
      const uint8_t* s = w.scale + row * w.scale_cols;
      for (int64_t i = 0; i < n; i += 16) {
        __m256 sc = _mm256_set1_ps(e8m0_to_float(s[i / 32]));
        // 8 bytes -> 16 nibbles in element order (low nibble first).
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + i / 2)));
        __m256i lo_n = _mm256_and_si256(b, _mm256_set1_epi32(15));
        __m256i hi_n = _mm256_srli_epi32(b, 4);
        // Interleave: elements 2k = lo_n[k], 2k+1 = hi_n[k].
        __m256i e0 = _mm256_unpacklo_epi32(lo_n, hi_n);  // k=0,1 | k=4,5
        __m256i e1 = _mm256_unpackhi_epi32(lo_n, hi_n);  // k=2,3 | k=6,7
        __m256i first = _mm256_permute2x128_si256(e0, e1, 0x20);   // elements 0..7
        __m256i second = _mm256_permute2x128_si256(e0, e1, 0x31);  // elements 8..15
        fma16_avx2(e2m1_to_ps_avx2(first, sc), e2m1_to_ps_avx2(second, sc), x + i, a0, a1, a2, a3);
      }
      break;
    }
  }
  double acc[16];
  _mm256_storeu_pd(acc, a0);
  _mm256_storeu_pd(acc + 4, a1);
  _mm256_storeu_pd(acc + 8, a2);
  _mm256_storeu_pd(acc + 12, a3);
  return fold16(acc);
}

// --------------------------------------------------------------- AVX-512 ---

#define DSV4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

DSV4_AVX512 inline void fma16_avx512(__m512 v, const double* x, __m512d& a0, __m512d& a1) {
  a0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), _mm512_loadu_pd(x), a0);
  a1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))),
                       _mm512_loadu_pd(x + 8), a1);
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

// The 8 e2m1 magnitudes (or their negatives) times a block scale, computed in
// float like every other decode path (so that a product past the float range
// is inf here too) and widened to doubles for a two-register permute.
DSV4_AVX512 inline __m512d e2m1_table_pd(bool negative, float scale) {
  const float m = negative ? -1.0f : 1.0f;
  const __m256 mags = _mm256_setr_ps(0.0f * m, 0.5f * m, 1.0f * m, 1.5f * m, 2.0f * m, 3.0f * m, 4.0f * m, 6.0f * m);
  return _mm512_cvtps_pd(_mm256_mul_ps(mags, _mm256_set1_ps(scale)));
}

// e4m3 read as the top bits of an fp16: sign-extending the byte to 16 bits
// and shifting it left by 7 puts the exponent and mantissa where fp16 keeps
// them (bit 14, a copy of the sign, is cleared). The fp16 then holds the
// e4m3 value times 2^-8, subnormals included, so `scale256` is the block
// scale times 256. Cheaper than e4m3_to_ps_avx512 for the same floats.
DSV4_AVX512 inline __m512 e4m3_to_ps_via_half(__m128i bytes16, __m512 scale256) {
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes16), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0xBFFF)));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), scale256);
}
// Largest ue8m0 byte for which scale * 256 is still a finite float.
constexpr uint8_t kMaxHalfPathScale = 127 + 119;

// 16 FP4 values (8 bytes, low nibble first) to floats with the scale applied.
DSV4_AVX512 inline __m512 e2m1_to_ps_avx512(const uint8_t* bytes8, __m512 scale) {
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m512i shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
  const __m512i pick = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512i b = _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)bytes8));
  __m512i dup = _mm512_permutexvar_epi32(pick, b);  // byte k at elements 2k, 2k+1
  __m512i nib = _mm512_and_si512(_mm512_srlv_epi32(dup, shifts), _mm512_set1_epi32(15));
  return _mm512_mul_ps(_mm512_permutexvar_ps(nib, table), scale);
}

DSV4_AVX512 double dot_avx512(const Linear& w, int64_t row, const double* x) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0;
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: {
      const float* p = reinterpret_cast<const float*>(w.data) + row * n;
      for (int64_t i = 0; i < n; i += 16) fma16_avx512(_mm512_loadu_ps(p + i), x + i, a0, a1);
      break;
    }
    case WeightFormat::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + row * n;
      for (int64_t i = 0; i < n; i += 16) {
        __m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p + i))), 16);
        fma16_avx512(_mm512_castsi512_ps(v), x + i, a0, a1);
      }
      break;
    }
    // Single rows only serve linear_dot and the rows left over after groups
    // of four; the fast decoders live in dot4_tokens_*.
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* p = w.data + row * n;
      const uint8_t* s = w.scale + (row / 128) * w.scale_cols;
      for (int64_t i = 0; i < n; i += 16)
        fma16_avx512(e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p + i)), _mm512_set1_ps(e8m0_to_float(s[i / 128]))),
                     x + i, a0, a1);
      break;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* p = w.data + row * (n / 2);
      const uint8_t* s = w.scale + row * w.scale_cols;
      for (int64_t i = 0; i < n; i += 16)
        fma16_avx512(e2m1_to_ps_avx512(p + i / 2, _mm512_set1_ps(e8m0_to_float(s[i / 32]))), x + i, a0, a1);
      break;
    }
  }
  // Lanes 0-7 in a0, 8-15 in a1: the first fold step is a0 + a1.
  double acc[16];
  _mm512_storeu_pd(acc, a0);
  _mm512_storeu_pd(acc + 8, a1);
  return fold16(acc);
}

// Four consecutive rows against T <= 3 tokens, the weights decoded in
// registers once for all T. One row alone is bound by the latency of its two
// accumulator chains (the canonical order allows no more per row); four rows
// keep at least eight FMA chains in flight. Each (row, token) sees exactly
// the sequence dot_avx512 gives it, so the bits are the same.
template <int T>
DSV4_AVX512 inline void fma16_tokens(__m512 v, const double* const* x, int64_t i, __m512d (*a)[2]) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  for (int t = 0; t < T; ++t) {
    a[t][0] = _mm512_fmadd_pd(lo, _mm512_load_pd(x[t] + i), a[t][0]);
    a[t][1] = _mm512_fmadd_pd(hi, _mm512_load_pd(x[t] + i + 8), a[t][1]);
  }
}

template <int T>
DSV4_AVX512 inline void fold_rows4(__m512d (*a)[T][2], double* out, int64_t out_stride) {
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < T; ++t) {
      double acc[16];
      _mm512_storeu_pd(acc, a[r][t][0]);
      _mm512_storeu_pd(acc + 8, a[r][t][1]);
      out[t * out_stride + r] = fold16(acc);
    }
}

// One function per format: with the accumulators local to a small loop nest
// the compiler keeps all of them in registers (in one function with a switch
// over formats it spilled them at every scale block).
template <int T>
DSV4_AVX512 void dot4_tokens_float_avx512(const Linear& w, int64_t row0, const double* const* x, double* out,
                                          int64_t out_stride) {
  __m512d a[4][T][2];
  for (auto& r : a)
    for (auto& t : r) t[0] = t[1] = _mm512_setzero_pd();
  const int64_t n = w.cols;
  if (w.format == WeightFormat::F32) {
    const float* p = reinterpret_cast<const float*>(w.data) + row0 * n;
    for (int64_t i = 0; i < n; i += 16)
      for (int r = 0; r < 4; ++r) fma16_tokens<T>(_mm512_loadu_ps(p + r * n + i), x, i, a[r]);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + row0 * n;
    for (int64_t i = 0; i < n; i += 16)
      for (int r = 0; r < 4; ++r)
        fma16_tokens<T>(_mm512_castsi512_ps(_mm512_slli_epi32(
                            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p + r * n + i))), 16)),
                        x, i, a[r]);
  }
  fold_rows4<T>(a, out, out_stride);
}

template <int T>
DSV4_AVX512 void dot4_tokens_fp8_avx512(const Linear& w, int64_t row0, const double* const* x, double* out,
                                        int64_t out_stride) {
  __m512d a[4][T][2];
  for (auto& r : a)
    for (auto& t : r) t[0] = t[1] = _mm512_setzero_pd();
  const int64_t n = w.cols;
  // The four rows share their scale row unless they straddle a 128-row
  // block (only when rows are not a multiple of 4 apart from 0).
  const uint8_t* p = w.data + row0 * n;
  for (int64_t b = 0; b < n; b += 128) {
    const int64_t end = std::min(n, b + 128);
    uint8_t sb[4];
    bool half_ok = true;
    for (int r = 0; r < 4; ++r) {
      sb[r] = w.scale[((row0 + r) / 128) * w.scale_cols + b / 128];
      half_ok = half_ok && sb[r] <= kMaxHalfPathScale;
    }
    if (half_ok) {
      __m512 sc[4];
      for (int r = 0; r < 4; ++r) sc[r] = _mm512_set1_ps(e8m0_to_float(sb[r]) * 256.0f);
      for (int64_t i = b; i < end; i += 16)
        for (int r = 0; r < 4; ++r)
          fma16_tokens<T>(e4m3_to_ps_via_half(_mm_loadu_si128((const __m128i*)(p + r * n + i)), sc[r]), x, i, a[r]);
    } else {
      for (int64_t i = b; i < end; i += 16)
        for (int r = 0; r < 4; ++r)
          fma16_tokens<T>(e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p + r * n + i)),
                                            _mm512_set1_ps(e8m0_to_float(sb[r]))),
                          x, i, a[r]);
    }
  }
  fold_rows4<T>(a, out, out_stride);
}

template <int T>
DSV4_AVX512 void dot4_tokens_fp4_avx512(const Linear& w, int64_t row0, const double* const* x, double* out,
                                        int64_t out_stride) {
  __m512d a[4][T][2];
  for (auto& r : a)
    for (auto& t : r) t[0] = t[1] = _mm512_setzero_pd();
  const int64_t n = w.cols;
  const uint8_t* p = w.data + row0 * (n / 2);
  const uint8_t* s = w.scale + row0 * w.scale_cols;
  const __m512i shift_lo = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
  const __m512i shift_hi = _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60);
  for (int64_t b = 0; b < n; b += 32) {
    // The 16 signed e2m1 values times each row's block scale, as doubles:
    // a two-register permute decodes 8 nibbles (index = low 4 bits).
    __m512d pos[4], neg[4];
    for (int r = 0; r < 4; ++r) {
      pos[r] = e2m1_table_pd(false, e8m0_to_float(s[r * w.scale_cols + b / 32]));
      neg[r] = e2m1_table_pd(true, e8m0_to_float(s[r * w.scale_cols + b / 32]));
    }
    for (int64_t i = b; i < b + 32; i += 16)
      for (int r = 0; r < 4; ++r) {
        uint64_t bytes;
        std::memcpy(&bytes, p + r * (n / 2) + i / 2, 8);
        const __m512i packed = _mm512_set1_epi64(int64_t(bytes));
        const __m512d w0 = _mm512_permutex2var_pd(pos[r], _mm512_srlv_epi64(packed, shift_lo), neg[r]);
        const __m512d w1 = _mm512_permutex2var_pd(pos[r], _mm512_srlv_epi64(packed, shift_hi), neg[r]);
        for (int t = 0; t < T; ++t) {
          a[r][t][0] = _mm512_fmadd_pd(w0, _mm512_load_pd(x[t] + i), a[r][t][0]);
          a[r][t][1] = _mm512_fmadd_pd(w1, _mm512_load_pd(x[t] + i + 8), a[r][t][1]);
        }
      }
  }
  fold_rows4<T>(a, out, out_stride);
}

template <int T>
DSV4_AVX512 void dot4_tokens_avx512(const Linear& w, int64_t row0, const double* const* x, double* out,
                                    int64_t out_stride) {
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16: dot4_tokens_float_avx512<T>(w, row0, x, out, out_stride); break;
    case WeightFormat::FP8_BLOCK128: dot4_tokens_fp8_avx512<T>(w, row0, x, out, out_stride); break;
    case WeightFormat::FP4_BLOCK32: dot4_tokens_fp4_avx512<T>(w, row0, x, out, out_stride); break;
  }
}

// Rows [row0, row0 + 4) against n tokens in groups of up to three; a group
// after the first finds the four rows in L1.
DSV4_AVX512 void dot4_all_tokens_avx512(const Linear& w, int64_t row0, const double* xd, int64_t n, double* out,
                                        int64_t out_stride) {
  const int64_t cols = w.cols;
  for (int64_t t = 0; t < n; t += 3) {
    const double* x[3] = {xd + t * cols, xd + std::min(t + 1, n - 1) * cols, xd + std::min(t + 2, n - 1) * cols};
    switch (std::min<int64_t>(3, n - t)) {
      case 3: dot4_tokens_avx512<3>(w, row0, x, out + t * out_stride, out_stride); break;
      case 2: dot4_tokens_avx512<2>(w, row0, x, out + t * out_stride, out_stride); break;
      default: dot4_tokens_avx512<1>(w, row0, x, out + t * out_stride, out_stride); break;
    }
  }
}

// Decodes a whole weight row to floats (scale applied), 16 at a time.
DSV4_AVX512 void decode_row_avx512(const Linear& w, int64_t row, float* out) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32:
      std::memcpy(out, reinterpret_cast<const float*>(w.data) + row * n, size_t(n) * 4);
      return;
    case WeightFormat::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + row * n;
      for (int64_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p + i))), 16)));
      return;
    }
    case WeightFormat::FP8_BLOCK128: {
      const uint8_t* p = w.data + row * n;
      const uint8_t* s = w.scale + (row / 128) * w.scale_cols;
      for (int64_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p + i)),
                                                    _mm512_set1_ps(e8m0_to_float(s[i / 128]))));
      return;
    }
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t* p = w.data + row * (n / 2);
      const uint8_t* s = w.scale + row * w.scale_cols;
      for (int64_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, e2m1_to_ps_avx512(p + i / 2, _mm512_set1_ps(e8m0_to_float(s[i / 32]))));
      return;
    }
  }
}

// Batches, GEMM-style. Inputs and weight tiles are packed so that a block of
// R rows x T tokens reads two sequential streams: for every 16 columns, the
// R rows' 16 doubles back to back, and the T tokens' 16 doubles back to back.
// Register blocks of 4 x 3 (24 accumulators) sweep column chunks of
// kBatchChunk; between chunks the accumulators rest in memory. Every
// (row, token) still updates its 16 lanes in increasing column order with
// the same FMAs, so the bits equal dot_avx512's.
constexpr int64_t kBatchChunk = 256;
constexpr int kRowBlock = 4, kTokenBlock = 3;
// Below this many tokens, weights are decoded in registers for each group of
// three tokens (dot4_all_tokens_avx512) instead of into a packed tile.
constexpr int64_t kPackedMinTokens = 8;

// Element (t, i) of a group of `group` tokens packed from `first`.
inline int64_t packed_index(int64_t cols, int64_t first, int group, int64_t t, int64_t i) {
  return first * cols + (i / 16) * (group * 16) + t * 16 + (i % 16);
}

template <int R, int T>
DSV4_AVX512 void packed_block_avx512(const double* w, const double* x, int64_t k0, int64_t k1, double* acc) {
  __m512d a[R][T][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      a[r][t][0] = _mm512_loadu_pd(acc + (r * T + t) * 16);
      a[r][t][1] = _mm512_loadu_pd(acc + (r * T + t) * 16 + 8);
    }
  const double* wp = w + (k0 / 16) * R * 16;
  const double* xp = x + (k0 / 16) * T * 16;
  for (int64_t i = k0; i < k1; i += 16, wp += R * 16, xp += T * 16) {
    __m512d x0[T], x1[T];
    for (int t = 0; t < T; ++t) x0[t] = _mm512_loadu_pd(xp + t * 16), x1[t] = _mm512_loadu_pd(xp + t * 16 + 8);
    for (int r = 0; r < R; ++r) {
      const __m512d w0 = _mm512_loadu_pd(wp + r * 16), w1 = _mm512_loadu_pd(wp + r * 16 + 8);
      for (int t = 0; t < T; ++t) {
        a[r][t][0] = _mm512_fmadd_pd(w0, x0[t], a[r][t][0]);
        a[r][t][1] = _mm512_fmadd_pd(w1, x1[t], a[r][t][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      _mm512_storeu_pd(acc + (r * T + t) * 16, a[r][t][0]);
      _mm512_storeu_pd(acc + (r * T + t) * 16 + 8, a[r][t][1]);
    }
}

template <int R>
DSV4_AVX512 void packed_block_tokens_avx512(int tokens, const double* w, const double* x, int64_t k0, int64_t k1,
                                            double* acc) {
  switch (tokens) {
    case 3: packed_block_avx512<R, 3>(w, x, k0, k1, acc); break;
    case 2: packed_block_avx512<R, 2>(w, x, k0, k1, acc); break;
    default: packed_block_avx512<R, 1>(w, x, k0, k1, acc); break;
  }
}

DSV4_AVX512 void packed_block_any_avx512(int rows, int tokens, const double* w, const double* x, int64_t k0,
                                         int64_t k1, double* acc) {
  switch (rows) {
    case 4: packed_block_tokens_avx512<4>(tokens, w, x, k0, k1, acc); break;
    case 3: packed_block_tokens_avx512<3>(tokens, w, x, k0, k1, acc); break;
    case 2: packed_block_tokens_avx512<2>(tokens, w, x, k0, k1, acc); break;
    default: packed_block_tokens_avx512<1>(tokens, w, x, k0, k1, acc); break;
  }
}

// Decodes rows [row0, row0 + rows) into the packed layout (groups of 4).
DSV4_AVX512 void decode_tile_packed_avx512(const Linear& w, int64_t row0, int64_t rows, float* scratch,
                                           double* packed) {
  const int64_t cols = w.cols;
  for (int64_t r = 0; r < rows; ++r) {
    decode_row_avx512(w, row0 + r, scratch);
    const int64_t first = r / kRowBlock * kRowBlock;
    const int group = int(std::min<int64_t>(kRowBlock, rows - first));
    for (int64_t i = 0; i < cols; i += 16) {
      const __m512 v = _mm512_loadu_ps(scratch + i);
      double* dst = packed + packed_index(cols, first, group, r - first, i);
      _mm512_storeu_pd(dst, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
      _mm512_storeu_pd(dst + 8, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
  }
}

// A packed tile of `rows` rows against all n packed tokens.
DSV4_AVX512 void packed_tile_times_tokens_avx512(const double* wp, int64_t rows, int64_t cols, const double* xp,
                                                 int64_t n, double* acc, double* out, int64_t out_stride) {
  std::fill_n(acc, size_t(rows * n * 16), 0.0);
  for (int64_t k0 = 0; k0 < cols; k0 += kBatchChunk) {
    const int64_t k1 = std::min(cols, k0 + kBatchChunk);
    // A token group's input chunk stays in L1 while all row groups of the
    // tile (in L2) pass over it.
    for (int64_t t = 0; t < n; t += kTokenBlock) {
      const int tt = int(std::min<int64_t>(kTokenBlock, n - t));
      for (int64_t r = 0; r < rows; r += kRowBlock) {
        const int rr = int(std::min<int64_t>(kRowBlock, rows - r));
        // Accumulators of block (r, t): rr * tt * 16 doubles at (r * n + t * rr) * 16.
        packed_block_any_avx512(rr, tt, wp + r * cols, xp + t * cols, k0, k1, acc + (r * n + t * rr) * 16);
      }
    }
  }
  for (int64_t r = 0; r < rows; r += kRowBlock) {
    const int rr = int(std::min<int64_t>(kRowBlock, rows - r));
    for (int64_t t = 0; t < n; t += kTokenBlock) {
      const int tt = int(std::min<int64_t>(kTokenBlock, n - t));
      const double* a = acc + (r * n + t * rr) * 16;
      for (int q = 0; q < rr; ++q)
        for (int u = 0; u < tt; ++u) out[(t + u) * out_stride + r + q] = fold16(a + (q * tt + u) * 16);
    }
  }
}

// ------------------------------------------------------------- dispatch ---

using DotFn = double (*)(const Linear&, int64_t, const double*);

KernelIsa detect_best() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return KernelIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KernelIsa::Avx2;
  return KernelIsa::Scalar;
}

KernelIsa initial_isa() {
  KernelIsa best = detect_best();
  if (const char* env = std::getenv("DSV4_KERNELS")) {
    std::string v = env;
    KernelIsa want = v == "scalar" ? KernelIsa::Scalar : v == "avx2" ? KernelIsa::Avx2 : KernelIsa::Avx512;
    if (int(want) <= int(best)) return want;
  }
  return best;
}

KernelIsa g_isa = initial_isa();

DotFn dot_for(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return dot_avx512;
    case KernelIsa::Avx2: return dot_avx2;
    default: return dot_scalar;
  }
}

}  // namespace

KernelIsa active_kernel_isa() { return g_isa; }
bool kernel_isa_supported(KernelIsa isa) { return int(isa) <= int(detect_best()); }
void set_kernel_isa(KernelIsa isa) {
  if (!kernel_isa_supported(isa)) throw Error(std::string("CPU does not support ") + kernel_isa_name(isa));
  g_isa = isa;
}
const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx2: return "avx2";
    default: return "scalar";
  }
}

double linear_dot(const Linear& w, int64_t row, const double* x) { return dot_for(g_isa)(w, row, x); }

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

void linear_forward(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin,
                    int64_t row_end, int64_t y_stride) {
  if (row_end < 0) row_end = w.rows;
  const int64_t out = row_end - row_begin;
  if (y_stride < 0) y_stride = out;
  const int64_t cols = w.cols;
  if (cols % 16) throw Error("linear input width " + std::to_string(cols) + " is not a multiple of 16");
  // Inputs in double, once per token (rounded through FP8 first if asked).
  AlignedVector<double> xd(size_t(n * cols));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t t = 0; t < n; ++t) {
    const float* src = x + t * cols;
    if (w.quantize_input) {
      std::copy_n(src, cols, row.data());
      fp8_round_trip(row.data(), cols, 128);
      src = row.data();
    }
    for (int64_t i = 0; i < cols; ++i) xd[size_t(t * cols + i)] = src[i];
  }
  const DotFn dot = dot_for(g_isa);
  // Tiles of rows so that each weight tile is read once for all n tokens.
  const int64_t tile = 16;
  const int64_t n_tiles = (out + tile - 1) / tile;
  const int threads = threads_for(out * cols * std::max<int64_t>(n, 1));
  const bool rows4 = g_isa == KernelIsa::Avx512 && (w.format != WeightFormat::FP4_BLOCK32 || cols % 32 == 0);
  if (n >= kPackedMinTokens && g_isa == KernelIsa::Avx512) {
    AlignedVector<double> xp(size_t(n * cols));
    for (int64_t t = 0; t < n; ++t) {
      const int64_t first = t / kTokenBlock * kTokenBlock;
      const int group = int(std::min<int64_t>(kTokenBlock, n - first));
      for (int64_t i = 0; i < cols; i += 16)
        std::copy_n(xd.data() + t * cols + i, 16, xp.data() + packed_index(cols, first, group, t - first, i));
    }
#pragma omp parallel num_threads(threads)
    {
      AlignedVector<float> scratch(static_cast<size_t>(cols));
      AlignedVector<double> wp(static_cast<size_t>(tile * cols)), acc(static_cast<size_t>(tile * n * 16)),
          res(static_cast<size_t>(n * tile));
#pragma omp for schedule(static)
      for (int64_t k = 0; k < n_tiles; ++k) {
        const int64_t o0 = k * tile, rows = std::min(out, o0 + tile) - o0;
        decode_tile_packed_avx512(w, row_begin + o0, rows, scratch.data(), wp.data());
        packed_tile_times_tokens_avx512(wp.data(), rows, cols, xp.data(), n, acc.data(), res.data(), tile);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t q = 0; q < rows; ++q) y[t * y_stride + o0 + q] = float(res[size_t(t * tile + q)]);
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t k = 0; k < n_tiles; ++k) {
    int64_t o0 = k * tile, o1 = std::min(out, o0 + tile);
    int64_t o = o0;
    if (rows4)
      for (; o + 4 <= o1; o += 4) {
        double r[4 * kPackedMinTokens];
        dot4_all_tokens_avx512(w, row_begin + o, xd.data(), n, r, 4);
        for (int64_t t = 0; t < n; ++t)
          for (int q = 0; q < 4; ++q) y[t * y_stride + o + q] = float(r[t * 4 + q]);
      }
    for (; o < o1; ++o)
      for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = float(dot(w, row_begin + o, xd.data() + t * cols));
  }
}

}  // namespace dsv4
