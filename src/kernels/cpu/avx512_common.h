// Small AVX-512 helpers that several kernel files inline into their loops:
// the canonical fold of 16 fp32 lanes (fold16 in linear_internal.h), an
// e4m3 decoder and a 16 x 16 transpose.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace dsv4::linear_detail {

// fold16's first level, in double: lane l plus lane l + 8.
DSV4_TARGET_AVX512 inline __m512d fold16_first_level_avx512(__m512 lanes) {
  return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(lanes)),
                       _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1))));
}

// fold16 of the 16 lanes of a register, in registers (the same additions).
DSV4_TARGET_AVX512 inline double fold16_avx512(__m512 lanes) {
  const __m512d s8 = fold16_first_level_avx512(lanes);
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

// fold16_avx512 of four registers at once, returned as {a, b, c, d}: each
// register's lanes go through the same additions in the same order (lane l
// plus lane l + 8, then those eight pairs four apart, then (0 + 2) + (1 + 3)),
// so the same bits, but the second and later levels of the tree act on two
// or four registers per instruction: about 9.5 uops per register against
// about 13 for a fold16_avx512 and its scalar add.
DSV4_TARGET_AVX512 inline __m256d fold16x4_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512d sa = fold16_first_level_avx512(a), sb = fold16_first_level_avx512(b);
  const __m512d sc = fold16_first_level_avx512(c), sd = fold16_first_level_avx512(d);
  // s4[l] = s8[l] + s8[l + 4]: {a's four | b's four}, {c's four | d's four}.
  const __m512d ab = _mm512_add_pd(_mm512_shuffle_f64x2(sa, sb, 0x44), _mm512_shuffle_f64x2(sa, sb, 0xEE));
  const __m512d cd = _mm512_add_pd(_mm512_shuffle_f64x2(sc, sd, 0x44), _mm512_shuffle_f64x2(sc, sd, 0xEE));
  // s4[0] + s4[2] and s4[1] + s4[3] in elements 0 and 1 of each half.
  const __m512d ab2 = _mm512_add_pd(ab, _mm512_permutex_pd(ab, 0x4E));
  const __m512d cd2 = _mm512_add_pd(cd, _mm512_permutex_pd(cd, 0x4E));
  // (s4[0] + s4[2]) + (s4[1] + s4[3]): {a, c, a, c, b, d, b, d}.
  const __m512d folded = _mm512_add_pd(_mm512_unpacklo_pd(ab2, cd2), _mm512_unpackhi_pd(ab2, cd2));
  return _mm512_castpd512_pd256(_mm512_permutexvar_pd(_mm512_setr_epi64(0, 4, 1, 5, 0, 4, 1, 5), folded));
}

// sum[r * stride + t] += fold16_avx512(a[r][t]) for every row and token: four
// tokens of a row at a time with fold16x4_avx512 (the same sums), the rest
// one by one.
template <int R, int T>
DSV4_TARGET_AVX512 inline void add_folds_avx512(const __m512 (&a)[R][T], double* sum, int64_t stride) {
  for (int r = 0; r < R; ++r) {
    double* row = sum + r * stride;
    int t = 0;
    for (; t + 4 <= T; t += 4)
      _mm256_storeu_pd(row + t, _mm256_add_pd(_mm256_loadu_pd(row + t),
                                              fold16x4_avx512(a[r][t], a[r][t + 1], a[r][t + 2], a[r][t + 3])));
    for (; t < T; ++t) row[t] += fold16_avx512(a[r][t]);
  }
}

// 32 e4m3 bytes as floats times 2^-8, read as the top bits of fp16s:
// sign-extending a byte to 16 bits and shifting it left by 7 puts the
// exponent and mantissa where fp16 keeps them (bit 14, a copy of the sign,
// is cleared), subnormals included. One widening, shift and mask for both
// halves saves uops on the ports that also run the FMAs (docs/kernels.md).
DSV4_TARGET_AVX512 inline void e4m3x32_to_ps_times_2m8(const uint8_t* bytes32, __m512& lo, __m512& hi) {
  __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)bytes32)), 7);
  h = _mm512_and_si512(h, _mm512_set1_epi16(int16_t(0xBFFF)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// 16 bf16 values as floats: one word permutation (vpermw, zero-masked) puts
// value j in the high half of lane j, where a float keeps the bf16 bits;
// one p5 uop where widening and shifting take a p5 and a p0 uop.
DSV4_TARGET_AVX512 inline __m512i bf16_widen_index() {
  alignas(64) static const uint16_t index[32] = {0, 0, 0, 1, 0, 2,  0, 3,  0, 4,  0, 5,  0, 6,  0, 7,
                                                 0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
  return _mm512_load_si512(index);
}
DSV4_TARGET_AVX512 inline __m512 bf16x16_to_ps_avx512(const uint16_t* p, __m512i widen) {
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
      __mmask32(0xAAAAAAAAu), widen, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)p))));
}

// r[i][j] -> r[j][i] for a 16 x 16 block of floats.
DSV4_TARGET_AVX512 inline void transpose16x16(__m512 r[16]) {
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

}  // namespace dsv4::linear_detail
