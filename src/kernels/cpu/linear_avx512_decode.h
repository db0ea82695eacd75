// The AVX-512 decoders of the weight formats into floats, shared by the
// packed GEMM's decoding (linear_avx512.cpp) and the register path
// (linear_avx512_rows.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/linear_internal.h"

namespace dsv4::linear_detail {

// See e4m3_to_ps_avx2: rebiased exponent, subnormal codes as 1.m*2^-6 - 2^-6.
DSV4_TARGET_AVX512 inline __m512 e4m3_to_ps_avx512(__m128i bytes16, __m512 scale) {
  __m512i b = _mm512_cvtepu8_epi32(bytes16);
  __m512i em = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
  __mmask16 sub = _mm512_testn_epi32_mask(em, _mm512_set1_epi32(0x78));
  __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
  bits = _mm512_mask_add_epi32(bits, sub, bits, _mm512_set1_epi32(1 << 23));
  __m512 v = _mm512_castsi512_ps(bits);
  v = _mm512_mask_sub_ps(v, sub, v, _mm512_set1_ps(0x1p-6f));
  v = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(v), _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24)));
  return _mm512_mul_ps(v, scale);
}
// e4m3 read as the top bits of an fp16: sign-extending the byte to 16 bits
// and shifting it left by 7 puts the exponent and mantissa where fp16 keeps
// them (bit 14, a copy of the sign, is cleared). The fp16 then holds the
// e4m3 value times 2^-8, subnormals included, so `scale256` is the block
// scale times 256. Cheaper than e4m3_to_ps_avx512 for the same floats.
DSV4_TARGET_AVX512 inline __m512 e4m3_to_ps_times_2m8(__m128i bytes16) {
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes16), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0xBFFF)));
  return _mm512_cvtph_ps(h);
}
DSV4_TARGET_AVX512 inline __m512 e4m3_to_ps_via_half(__m128i bytes16, __m512 scale256) {
  return _mm512_mul_ps(e4m3_to_ps_times_2m8(bytes16), scale256);
}
// The SIMD e4m3 decoders read the two NaN codes (0x7F, 0xFF) as +-480 where
// the scalar table says NaN: checkpoints never hold them (a NaN weight), so
// the bit-identity of the paths is only claimed for real e4m3 values.

// FP4 in storage order (see linear.h): the 16 bytes of a 32-column block
// give its even elements (low nibbles) and then its odd ones (high nibbles).
// `table` holds the 16 e2m1 codes' values times the block scale. vpermps
// reads only the low 4 bits of each index, so the bytes need no masking.
DSV4_TARGET_AVX512 inline void e2m1_block_avx512(const uint8_t* bytes16, __m512 table, __m512& even, __m512& odd) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)bytes16));
  even = _mm512_permutexvar_ps(b, table);
  odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
}

DSV4_TARGET_AVX512 inline __m512 e2m1_table_avx512(const E2m1Tables& tables, uint8_t scale) {
  return _mm512_load_ps(tables.values[scale]);
}

// Storage positions [i, i+16) of a row, scale applied (plain decoders; the
// row-group kernels below have faster ones).
DSV4_TARGET_AVX512 inline __m512 decode16_avx512(const Linear& w, int64_t row, int64_t i) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: return _mm512_loadu_ps(reinterpret_cast<const float*>(w.data) + row * n + i);
    case WeightFormat::BF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(
              _mm256_loadu_si256((const __m256i*)(reinterpret_cast<const uint16_t*>(w.data) + row * n + i))),
          16));
    case WeightFormat::FP8_BLOCK128:
      return e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(w.data + row * n + i)),
                               _mm512_set1_ps(e8m0_to_float(w.scale[(row / 128) * w.scale_cols + i / 128])));
    case WeightFormat::FP4_BLOCK32: {
      __m512 even, odd;
      e2m1_block_avx512(w.data + row * (n / 2) + i / 32 * 16,
                        e2m1_table_avx512(e2m1_tables(), w.scale[row * w.scale_cols + i / 32]), even, odd);
      return i % 32 ? odd : even;
    }
  }
  return _mm512_setzero_ps();
}

}  // namespace dsv4::linear_detail
