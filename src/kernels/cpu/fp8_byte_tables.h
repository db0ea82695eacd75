// e4m3 codes to bf16 words by byte-table lookups (AVX512-VBMI's vpermt2b),
// with the 128 x 128 block's scale applied by one saturating subtraction:
// about nine vector uops per 64 weights, where the fp16 decoding, its scale
// multiplies and packing the floats' high halves take about twenty. The
// words come in one of two layouts: step pairs for VDPBF16PS
// (linear_fp8_pairs.cpp) or plain column order for the fp32 eight-row
// kernel, which widens them (linear_avx512_eight_rows.cpp).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_internal.h"

namespace dsv4::linear_detail {

// The bf16 of every e4m3 code's magnitude (bits 0-6) with its exponent
// raised by kExponentBias, split in its high byte (sign bit clear) and its
// low byte, as vpermi2b tables: the lookup reads the low seven bits of each
// index byte, so the code itself is the index and its sign goes into the
// high byte after, for nonzero codes only. Code 0x7F (NaN) reads as 480, as
// the other SIMD decoders read it (docs/kernels.md). Both zero codes give
// the word 0: a -0 weight adds the same as a +0 one to a chain that starts
// at +0, which never becomes -0 (a sum is -0 only if both terms are).
//
// The scale: a word w with exponent field f + kExponentBias (f: the code's
// own, 118-135) minus (kExponentBias - (s - 127)) << 7 is the code times
// 2^(s - 127), exactly, for every block scale s in [kBf16ExactMinFp8Scale,
// kMaxHalfPathScale] (the result's field f + s - 127 lies in [1, 254]: a
// normal bf16, and within [77, 254] from kBf16DotMinFp8Scale, as the
// VDPBF16PS kernels need); a zero word stays zero under the saturating
// subtraction, and the sign bit above the field is never borrowed from.
// One vpsubusw per 32 words, without masks.
constexpr int kExponentBias = 120;
static_assert(kMaxHalfPathScale - 127 < kExponentBias && 135 + kExponentBias <= 255);
static_assert(118 + kBf16ExactMinFp8Scale - 127 >= 1);
struct E4m3ByteTables {
  alignas(64) uint8_t high[128], low[128];
  // Byte indices of vpermt2b (low bytes: 0-63, high bytes: 64-127) that
  // lay 64 decoded columns out as two registers of words. Step pairs:
  // dword j of the first holds column j in its high word (the step
  // VDPBF16PS adds first) and column 16 + j in its low word; the second
  // columns 32 + j and 48 + j. Columns: word j of the first is column j,
  // of the second column 32 + j.
  alignas(64) uint8_t first_pairs[64], second_pairs[64];
  alignas(64) uint8_t first_columns[64], second_columns[64];
  // The same two layouts for the fp16 decoding (fp8_words_by_fp16): word
  // indices of vpermt2w over 32 decoded floats (16 in each source, index
  // 32 + : the second), each word the high half of a float.
  alignas(64) uint16_t pair_words[32], column_words[32];
  E4m3ByteTables() {
    for (int c = 0; c < 128; ++c) {
      const float v = c == 0x7f ? 480.0f : e4m3_to_float(uint8_t(c));
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint32_t word = v == 0.0f ? 0 : (bits >> 16) + (uint32_t(kExponentBias) << 7);
      high[c] = uint8_t(word >> 8);
      low[c] = uint8_t(word);
    }
    for (int j = 0; j < 16; ++j)
      for (int half = 0; half < 2; ++half) {
        uint8_t* dst = (half == 0 ? first_pairs : second_pairs) + 4 * j;
        const int first = 32 * half + j, second = first + 16;
        dst[0] = uint8_t(second);
        dst[1] = uint8_t(64 + second);
        dst[2] = uint8_t(first);
        dst[3] = uint8_t(64 + first);
      }
    for (int j = 0; j < 32; ++j)
      for (int half = 0; half < 2; ++half) {
        uint8_t* dst = (half == 0 ? first_columns : second_columns) + 2 * j;
        dst[0] = uint8_t(32 * half + j);
        dst[1] = uint8_t(64 + 32 * half + j);
      }
    for (int j = 0; j < 16; ++j) {
      pair_words[2 * j] = uint16_t(32 + 2 * j + 1);  // column 16 + j: the step VDPBF16PS adds second
      pair_words[2 * j + 1] = uint16_t(2 * j + 1);   // column j
      column_words[j] = uint16_t(2 * j + 1);
      column_words[16 + j] = uint16_t(32 + 2 * j + 1);
    }
  }
};
inline const E4m3ByteTables& e4m3_byte_tables() {
  static const E4m3ByteTables tables;
  return tables;
}

// The subtrahend that applies scale byte s (see above), in every word.
DSV4_TARGET_AVX512_VBMI inline __m512i scale_subtrahend(uint8_t s) {
  return _mm512_set1_epi16(short((kExponentBias + 127 - int(s)) << 7));
}

struct E4m3ByteDecoder {
  __m512i high0, high1, low0, low1, first, second;
  DSV4_TARGET_AVX512_VBMI E4m3ByteDecoder(const uint8_t* first_layout, const uint8_t* second_layout)
      : high0(_mm512_load_si512(e4m3_byte_tables().high)),
        high1(_mm512_load_si512(e4m3_byte_tables().high + 64)),
        low0(_mm512_load_si512(e4m3_byte_tables().low)),
        low1(_mm512_load_si512(e4m3_byte_tables().low + 64)),
        first(_mm512_load_si512(first_layout)),
        second(_mm512_load_si512(second_layout)) {}
  DSV4_TARGET_AVX512_VBMI static E4m3ByteDecoder pairs() {
    return E4m3ByteDecoder(e4m3_byte_tables().first_pairs, e4m3_byte_tables().second_pairs);
  }
  DSV4_TARGET_AVX512_VBMI static E4m3ByteDecoder columns() {
    return E4m3ByteDecoder(e4m3_byte_tables().first_columns, e4m3_byte_tables().second_columns);
  }
  // 64 codes of a block with the subtrahend `scale` as two registers of
  // words in the decoder's layout: step pairs (columns 0-15 and 16-31,
  // 32-47 and 48-63) or columns (0-31, 32-63).
  DSV4_TARGET_AVX512_VBMI void decode_words(const uint8_t* codes, __m512i scale, __m512i& words0,
                                            __m512i& words1) const {
    const __m512i b = _mm512_loadu_si512(codes);
    // The signs of the nonzero codes: a -0 (0x80) must give the word 0 like
    // +0, which the subtraction keeps at 0 (0x8000 would lose its sign).
    const __m512i signs = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(b, _mm512_set1_epi8(0x7f)), b);
    const __m512i high =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, b, high1), signs, _mm512_set1_epi8(char(0x80)), 0xF8);
    const __m512i low = _mm512_permutex2var_epi8(low0, b, low1);
    words0 = _mm512_subs_epu16(_mm512_permutex2var_epi8(low, first, high), scale);
    words1 = _mm512_subs_epu16(_mm512_permutex2var_epi8(low, second, high), scale);
  }
  DSV4_TARGET_AVX512_BF16_VBMI void decode(const uint8_t* codes, __m512i scale, __m512bh& steps01,
                                           __m512bh& steps23) const {
    __m512i words0, words1;
    decode_words(codes, scale, words0, words1);
    steps01 = (__m512bh)words0;
    steps23 = (__m512bh)words1;
  }
};

// The fp16 decoding's way to the same words, where the CPU lacks VBMI and
// for a 32-column tail: columns [c0, c1) (a multiple of 32; c0 a multiple
// of 128, or [c0, c1) within one 128-column span) of an FP8 row (scales:
// its block's; each in [kBf16ExactMinFp8Scale, kMaxHalfPathScale]), 32 at
// a time decoded as floats times the scale
// (exact), their high halves laid out by `layout` (pair_words or
// column_words) into dst, two bytes a column (column c0 first).
DSV4_TARGET_AVX512 inline void fp8_words_by_fp16(const uint8_t* row, const uint8_t* scales, int64_t c0, int64_t c1,
                                                 const uint16_t* layout, uint8_t* dst) {
  const __m512i index = _mm512_load_si512(layout);
  for (int64_t b = c0; b < c1; b += 128) {
    // e4m3 * 2^-8 from the fp16 decoding, times 2^(s - 127) * 2^8.
    const __m512 scale256 = _mm512_set1_ps(e8m0_to_float(scales[b / 128]) * 256.0f);
    const int64_t end = std::min(c1, b + 128);
    for (int64_t i = b; i < end; i += 32) {
      __m512 first, second;
      e4m3x32_to_ps_times_2m8(row + i, first, second);
      _mm512_storeu_si512(dst + 2 * (i - c0),
                          _mm512_permutex2var_epi16(_mm512_castps_si512(_mm512_mul_ps(first, scale256)), index,
                                                    _mm512_castps_si512(_mm512_mul_ps(second, scale256))));
    }
  }
}

// The FP8 chunk [c0, c1) of rows p[0..kEightRows) (scales: their block's,
// each in the decoder's range) decoded by `decoder` into dst[r], two bytes a
// column (column c0 first), 64 columns at a time; where a 128-column span
// ends 32 columns after the last 64, tail(r, i, end) decodes [i, end) of
// row r (the fp16 decoding).
template <class Tail>
DSV4_TARGET_AVX512_VBMI inline void eight_rows_by_byte_tables(const E4m3ByteDecoder& decoder, const uint8_t* const* p,
                                                              const uint8_t* scales, int64_t c0, int64_t c1,
                                                              uint8_t* const* dst, const Tail& tail) {
  for (int64_t b = c0; b < c1; b += 128) {
    const __m512i subtrahend = scale_subtrahend(scales[b / 128]);
    const int64_t end = std::min(c1, b + 128);
    for (int r = 0; r < kEightRows; ++r) {
      int64_t i = b;
      for (; i + 64 <= end; i += 64) {
        __m512i words0, words1;
        decoder.decode_words(p[r] + i, subtrahend, words0, words1);
        _mm512_store_si512(dst[r] + 2 * (i - c0), words0);
        _mm512_store_si512(dst[r] + 2 * (i - c0) + 64, words1);
      }
      if (i < end) tail(r, i, end);
    }
  }
}

}  // namespace dsv4::linear_detail
