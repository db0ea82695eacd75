// The cached FP8 rows' decoding by arithmetic instead of a table: the
// attention decodes the rows it reads a key tile at a time, twice a step
// (scores, then weighted sums), so the decoding is on its critical path.
// With the table's 16-element gather, decoding per tile was no faster than
// writing every row's floats to memory first (docs/long_context.md, "Cached
// rows decoded per key tile"). AVX-512 decodes 32 values at a time through
// fp16 (decode_e4m3_by_fp16_avx512), which keeps fp32 subnormals out of
// the multiplications; the other vector paths and unaligned ends build
// fp32 bit patterns:
//
// An e4m3 byte s eeee mmm has the value of the fp32 bit pattern
// s 0000eeee mmm0...0 times 2^120: the pattern's exponent field eeee is the
// e4m3 exponent with bias 127 instead of 7, and where eeee is 0 both are
// subnormal with the same mantissa weights (m * 2^-9 = m * 2^-129 * 2^120).
// Multiplying by a power of two is exact here (no flush of subnormal
// inputs: the kernels never set DAZ), so the value times the block scale
// is rounded once, as the table's value times the scale is. The two NaN
// codes (s 1111 111) get the table's NaN with the code's sign.
#include "kernels/cpu/fp8_rows.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/cpu/ops.h"

namespace dsv4::cpu {

namespace {

// Whether any of codes [i, end) is one of the two NaN codes (s 1111 111).
DSV4_TARGET_AVX512 bool has_nan_code_avx512(const uint8_t* codes, int64_t i, int64_t end) {
  const __m512i low7 = _mm512_set1_epi8(0x7F);
  __mmask64 nan = 0;
  for (; i < end; i += 64) {
    const __mmask64 in = end - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (end - i)) - 1;
    const __m512i c = _mm512_maskz_loadu_epi8(in, codes + i);
    nan |= _mm512_mask_cmpeq_epi8_mask(in, _mm512_and_si512(c, low7), low7);
  }
  return nan != 0;
}

// Values [i, end) of the e4m3 part (i, end and the block multiples of 16),
// 16 at a time. A code sign-extended to 32 bits and shifted left by 20
// leaves its magnitude in bits 20-26 and copies of its sign in 27-31; the
// mask keeps bit 31 of those. Where the block's scale 2^(b - 127) has b <=
// 134, one multiplication by 2^(b - 7) (exact, a normal float) gives the
// value times the scale with the table's one rounding; larger scales (and
// the NaN scale) multiply twice. The NaN codes are fixed up only in rows
// that have them.
template <bool kNanCodes>
DSV4_TARGET_AVX512 void decode_e4m3_avx512(const uint8_t* codes, const uint8_t* scales, int64_t block, int64_t i,
                                           int64_t end, float* out) {
  const __m512i keep = _mm512_set1_epi32(int32_t(0x87F00000u));
  const __m512i magnitude = _mm512_set1_epi32(0x07F00000), nan_bits = _mm512_set1_epi32(0x7FC00000);
  const __m512 rebias = _mm512_set1_ps(0x1p120f);
  // The first vector sets the scale, then the start of every block (one
  // division per row: a division per vector took as long as the decoding).
  int64_t block_index = i / block, next_block = i;
  bool one_multiply = true;
  __m512 factor = rebias;
  for (; i < end; i += 16) {
    if (i == next_block) {
      const uint8_t b = scales[block_index];
      one_multiply = b <= 134;
      // 2^(b - 7): exponent field b - 7 + 127.
      factor = _mm512_set1_ps(one_multiply ? std::bit_cast<float>(uint32_t(b + 120) << 23) : kNumericTables.e8m0[b]);
      next_block = ++block_index * block;
    }
    const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(v, 20), keep);
    __m512 value = _mm512_castsi512_ps(bits);
    if (!one_multiply) value = _mm512_mul_ps(value, rebias);
    if constexpr (kNanCodes) {
      // (bits & ~magnitude) | nan_bits: the code's sign on the table's NaN.
      const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, magnitude), magnitude);
      value = _mm512_mask_mov_ps(value, nan,
                                 _mm512_castsi512_ps(_mm512_ternarylogic_epi32(bits, magnitude, nan_bits, 0xBA)));
    }
    _mm512_storeu_ps(out + i, _mm512_mul_ps(value, factor));
  }
}

// Values [i, end) of the e4m3 part, 32 at a time (i, end and the block
// multiples of 32) through fp16, the weight decoders' trick
// (docs/kernels.md, "Formats"): a code sign-extended to 16 bits, shifted
// left by 7 and with bit 14 cleared is the fp16 of its value times 2^-8,
// subnormal codes included, and vcvtph2ps makes that a normal float. One
// multiplication by 2^(b - 119) (scale 2^(b - 127) times 2^8, a normal float
// for b <= 246) then rounds the value times the scale once, as the table's
// product does; larger scales and the NaN scale multiply by 2^8 first. So
// no fp32 subnormal ever enters an arithmetic instruction: where
// decode_e4m3_avx512 multiplies the fp32 subnormals of the 14 subnormal
// codes, AMD Zen 5 took about three times as long for a vector holding one.
// The NaN codes are looked for in the same pass (two operations per 32
// values, where has_nan_code_avx512 read every code again first); false
// means a NaN code was seen and the values are to be decoded again by
// decode_e4m3_avx512<true>. docs/long_context.md, "The cached rows'
// decoding through fp16".
DSV4_TARGET_AVX512 bool decode_e4m3_by_fp16_avx512(const uint8_t* codes, const uint8_t* scales, int64_t block,
                                                   int64_t i, int64_t end, float* out) {
  const __m512i clear_bit14 = _mm512_set1_epi16(int16_t(0xBFFF)), nan_bits = _mm512_set1_epi16(0x3F80);
  __mmask32 nan = 0;
  for (int64_t b = i / block; i < end; ++b) {
    const int64_t block_end = std::min(end, (b + 1) * block);
    const uint8_t s = scales[b];
    const bool one_multiply = s <= 246;
    // 2^(s - 119): exponent field s - 119 + 127.
    const __m512 factor =
        _mm512_set1_ps(one_multiply ? std::bit_cast<float>(uint32_t(s + 8) << 23) : kNumericTables.e8m0[s]);
    const __m512 to_value = _mm512_set1_ps(one_multiply ? 1.0f : 256.0f);
    for (; i < block_end; i += 32) {
      const __m512i h = _mm512_and_si512(
          _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i))), 7),
          clear_bit14);
      nan |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, nan_bits), nan_bits);
      __m512 low = _mm512_cvtph_ps(_mm512_castsi512_si256(h)), high = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
      if (!one_multiply) low = _mm512_mul_ps(low, to_value), high = _mm512_mul_ps(high, to_value);
      _mm512_storeu_ps(out + i, _mm512_mul_ps(low, factor));
      _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(high, factor));
    }
  }
  return nan == 0;
}

// decode_e4m3_avx512's bits, 8 at a time, always with the two
// multiplications and the NaN codes' fix-up.
DSV4_TARGET_AVX2 void decode_e4m3_avx2(const uint8_t* codes, const uint8_t* scales, int64_t block, int64_t i,
                                       int64_t end, float* out) {
  const __m256i keep = _mm256_set1_epi32(int32_t(0x87F00000u));
  const __m256i magnitude = _mm256_set1_epi32(0x07F00000), nan_bits = _mm256_set1_epi32(0x7FC00000);
  const __m256 rebias = _mm256_set1_ps(0x1p120f);
  int64_t block_index = i / block, next_block = i;
  __m256 scale = _mm256_setzero_ps();
  for (; i < end; i += 8) {
    if (i == next_block) {
      scale = _mm256_set1_ps(kNumericTables.e8m0[scales[block_index]]);
      next_block = ++block_index * block;
    }
    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    const __m256i bits = _mm256_and_si256(_mm256_slli_epi32(v, 20), keep);
    const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(bits), rebias);
    const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(bits, magnitude), magnitude));
    const __m256 nan_value = _mm256_castsi256_ps(_mm256_or_si256(_mm256_andnot_si256(magnitude, bits), nan_bits));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_blendv_ps(value, nan_value, nan), scale));
  }
}

}  // namespace

void decode_fp8_row(KernelIsa isa, const Fp8RowsView& v, int64_t id, int64_t d0, int64_t d1, float* row) {
  const int64_t blocks = (v.nope + v.block - 1) / v.block, rope = v.width - v.nope;
  const uint8_t* codes = v.codes + id * v.nope;
  const uint8_t* scales = v.scales + id * blocks;
  const int64_t end = std::min(d1, v.nope);
  int64_t i = d0;
  // AVX-512: whole groups of 32 that stay within one block each, through
  // fp16. Then whole vectors within one block each (block and start on a
  // vector boundary); the rest by the table.
  const int64_t width = isa == KernelIsa::Avx512 ? 16 : isa == KernelIsa::Avx2 ? 8 : 0;
  if (isa == KernelIsa::Avx512 && i % 32 == 0 && v.block % 32 == 0 && i + 32 <= end) {
    const int64_t vector_end = i + (end - i) / 32 * 32;
    if (!decode_e4m3_by_fp16_avx512(codes, scales, v.block, i, vector_end, row))
      decode_e4m3_avx512<true>(codes, scales, v.block, i, vector_end, row);
    i = vector_end;
  }
  if (width && i % width == 0 && v.block % width == 0 && i < end) {
    const int64_t vector_end = i + (end - i) / width * width;
    if (isa == KernelIsa::Avx512 && has_nan_code_avx512(codes, i, vector_end))
      decode_e4m3_avx512<true>(codes, scales, v.block, i, vector_end, row);
    else if (isa == KernelIsa::Avx512)
      decode_e4m3_avx512<false>(codes, scales, v.block, i, vector_end, row);
    else
      decode_e4m3_avx2(codes, scales, v.block, i, vector_end, row);
    i = vector_end;
  }
  for (; i < end; ++i) row[i] = e4m3_to_float(codes[i]) * e8m0_to_float(scales[i / v.block]);
  const int64_t r0 = std::max(d0, v.nope);
  if (r0 < d1) std::memcpy(row + r0, v.rope + id * rope + (r0 - v.nope), size_t(d1 - r0) * sizeof(float));
}

// Whole rows into memory, a row per thread at a time (the window ring's
// rows, a prefill chunk's compressed rows, the rows a CSA layer's indexer
// chose).
void decode_fp8_rows(KernelIsa isa, const Fp8RowsView& v, const int64_t* ids, int64_t count, float* out) {
#pragma omp parallel for schedule(static) num_threads(threads_for(count* v.width * 2))
  for (int64_t k = 0; k < count; ++k) decode_fp8_row(isa, v, ids[k], 0, v.width, out + k * v.width);
}

void prefetch_fp8_row(const Fp8RowsView& v, int64_t id, int64_t d0, int64_t d1) {
  const int64_t end = std::min(d1, v.nope), rope = v.width - v.nope;
  const char* codes = reinterpret_cast<const char*>(v.codes + id * v.nope);
  for (int64_t i = d0; i < end; i += 64) _mm_prefetch(codes + i, _MM_HINT_T0);
  if (d0 < end) _mm_prefetch(codes + end - 1, _MM_HINT_T0);
  const char* floats = reinterpret_cast<const char*>(v.rope + id * rope);
  for (int64_t i = std::max(d0, v.nope); i < d1; i += 16) _mm_prefetch(floats + (i - v.nope) * 4, _MM_HINT_T0);
}

}  // namespace dsv4::cpu
