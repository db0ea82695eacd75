// The FP4 register path with AVX512-BF16's VDPBF16PS: four rows against up
// to seven tokens (a decode step's routed experts), where the CPU runs that
// instruction at least as fast as the fp32 FMAs (bf16_dot_enabled) and also
// has AVX512-VBMI (avx512_vbmi_enabled).
//
// Why it gives the canonical bits: see linear_bf16.cpp. A 32-column FP4
// block in storage order is two steps of the 16 lanes (byte j: the low
// nibble is step k of lane j, the high nibble step k + 1), so each byte
// gives lane j's step pair directly: one word lookup (vpermw) turns the
// block's index words into the 16 pair words, where the fp32 kernel needs
// two float lookups (vpermps) and two FMAs per token. Those lookups compete
// with the FMAs for the vector ports, and on AMD Zen 5 the pair form
// decodes and multiplies a one-token expert about a quarter faster
// (docs/kernels.md, "FP4 step pairs"). The index words come from one
// broadcast load and one vpmultishiftqb (VBMI), in a permuted lane order
// (Fp4LaneOrder below).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_BF16 DSV4_TARGET_AVX512_BF16
#define DSV4_BF16_VBMI DSV4_TARGET_AVX512_BF16_VBMI

namespace dsv4::linear_detail {

namespace {

// Per scale byte, the bf16 of the 16 e2m1 codes times the scale (the top
// half of the float, exact: two significant bits), twice: entries 16-31
// repeat 0-15, since vpermw reads five index bits and the fifth is never
// masked off (see Fp4LaneOrder).
struct E2m1PairTables {
  alignas(64) uint16_t words[256][32];
  E2m1PairTables() {
    const E2m1Tables& values = e2m1_tables();
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 16; ++c) {
        uint32_t bits;
        std::memcpy(&bits, &values.values[s][c], 4);
        words[s][c] = words[s][16 + c] = uint16_t(bits >> 16);
      }
  }
};
const E2m1PairTables& e2m1_pair_tables() {
  static const E2m1PairTables tables;
  return tables;
}

// The lane order of the decoder. A block's 16 bytes are loaded into each
// 128-bit quarter of a register (a load, no shuffle), and vpmultishiftqb
// takes each byte of the index words from bits of its own 64-bit word,
// which holds bytes 0-7 of the block (the even words of a quarter) or 8-15
// (the odd ones). So lane P = 4q + 2h + i (quarter q, 64-bit word h, dword
// i) can index storage lane j = 8h + 2q + i, and does. The tokens' pair
// words are permuted the same way once per product (fp4_pair_token_steps),
// and the accumulators back to the storage lanes before they are folded:
// every lane then sums the same products in the same order as in the other
// kernels (docs/kernels.md, "FP4 step pairs").
struct Fp4LaneOrder {
  alignas(64) uint8_t control[64];    // vpmultishiftqb: each byte's bit offset
  alignas(64) uint32_t permuted[16];  // lane P <- storage lane j(P)
  alignas(64) uint32_t storage[16];   // storage lane j <- lane P(j)
  Fp4LaneOrder() {
    for (int lane = 0; lane < 16; ++lane) {
      const int quarter = lane / 4, word = lane / 2 % 2, dword = lane % 2;
      const int byte = 8 * word + 2 * quarter + dword;
      const int offset = 8 * (2 * quarter + dword);  // of the byte within its 64-bit word
      // Word 2P (the step VDPBF16PS adds second) looks up the high nibble:
      // the 8 bits from bit 4 of the byte, whose fifth (vpermw reads five)
      // is bit 0 of the next byte (of the word's first byte for its last:
      // the offsets wrap around the 64-bit word). Word 2P + 1 looks up the
      // byte itself: its low five bits are the low nibble and bit 4. Both
      // stray bits meet the repeated table; the upper byte of each index
      // word is not read.
      uint8_t* c = control + 4 * lane;
      c[0] = c[1] = uint8_t(offset + 4);
      c[2] = c[3] = uint8_t(offset);
      permuted[lane] = uint32_t(byte);
      storage[byte] = uint32_t(lane);
    }
  }
};
const Fp4LaneOrder& fp4_lane_order() {
  static const Fp4LaneOrder order;
  return order;
}

// A block's 16 bytes as its 16 pair words in the lane order above: word
// 2P + 1 (the first step, which VDPBF16PS adds first) the low nibble's
// value, word 2P the high nibble's. Besides the lookup, one load and one
// vpmultishiftqb, where widening the bytes to dwords took a widening, two
// shifts and an OR (docs/kernels.md).
DSV4_BF16_VBMI inline __m512bh e2m1_block_pairs(const uint8_t* bytes16, __m512i table, __m512i control) {
  const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)bytes16));
  return (__m512bh)_mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(control, b), table);
}

// Whether every block scale of the four rows keeps the weights at 2^-50 or
// above (see linear_bf16.cpp).
DSV4_BF16 bool scales_qualify(const uint8_t* const* scales, int64_t count) {
  const __m512i min_scale = _mm512_set1_epi8(char(kBf16DotMinFp4Scale));
  for (int r = 0; r < 4; ++r)
    for (int64_t i = 0; i < count; i += 64) {
      const __mmask64 live = count - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (count - i)) - 1;
      if (_mm512_mask_cmplt_epu8_mask(live, _mm512_maskz_loadu_epi8(live, scales[r] + i), min_scale)) return false;
    }
  return true;
}

// As dot4_fp4_avx512: the group's T tokens over the chunk [c0, c1), the
// folded lanes added to sums[row * kMaxRegisterTokens + t]; x[t] are the
// tokens' pair words (cols / 2 per token) in the lane order above.
template <int T>
DSV4_BF16_VBMI inline void fp4_pairs_group_chunk(const uint8_t* const* p, const uint8_t* const* s, int64_t c0,
                                                 int64_t c1, const uint32_t* const* x, bool prefetch, double* sums) {
  const E2m1PairTables& tables = e2m1_pair_tables();
  const __m512i control = _mm512_load_si512(fp4_lane_order().control);
  __m512 lanes[4][T];  // the segments' sums
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  const uint8_t* bytes[4];
  const uint8_t* scales[4];
  for (int r = 0; r < 4; ++r) {
    bytes[r] = p[r] + c0 / 2;
    scales[r] = s[r] + c0 / 32;
  }
  for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
    __m512 a[4][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    for (int64_t b = s0; b < std::min(c1, s0 + kSegment); b += 32) {
      if (prefetch && b % 128 == 0)  // one cache line per row, as the fp32 kernel
        for (int r = 0; r < 4; ++r) _mm_prefetch((const char*)bytes[r] + kPrefetchBytesAhead, _MM_HINT_T0);
      __m512bh xv[T];
      for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x[t] + b / 2);
      for (int r = 0; r < 4; ++r) {
        const __m512bh w = e2m1_block_pairs(bytes[r], _mm512_load_si512(tables.words[*scales[r]]), control);
        bytes[r] += 16;
        ++scales[r];
        for (int t = 0; t < T; ++t) a[r][t] = _mm512_dpbf16_ps(a[r][t], w, xv[t]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
  }
  const __m512i storage = _mm512_load_si512(fp4_lane_order().storage);
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_permutexvar_ps(storage, t);
  add_folds_avx512<4, T>(lanes, sums, kMaxRegisterTokens);
}

// Up to four tokens (a decode step's routed experts see one to four): the
// group's whole rows in one call, the sums in registers and every row
// addressed from the block index. The same products, chunks and folds as
// fp4_pairs_group_chunk (the same bits), without its per-chunk pointer
// arrays and sums in memory: with one token that form spent about a quarter
// of its time outside the step loop and ran 8-10% slower (docs/kernels.md,
// "FP8 and FP4 one token").
//
// kWholeSegments (one token only): cols is a multiple of kSegment (every V4
// matrix), so each segment is exactly eight blocks. The step loop then has
// a fixed trip count that the compiler unrolls straight, with the
// prefetches at fixed places; with a trip count known only at run time it
// jumps into an unrolled copy and tests the prefetch condition at every
// block. One token ran 3-10% faster from memory that way; two and four
// tokens, compiled the same way, 4-45% slower (docs/kernels.md, "FP4 and
// FP8 segments of a fixed length").
template <int T, bool kWholeSegments>
DSV4_BF16_VBMI void fp4_pairs_whole_rows(const uint8_t* const* p, const uint8_t* const* s, int64_t cols,
                                         const uint32_t* pairs, bool prefetch, double* out, int64_t out_stride) {
  const E2m1PairTables& tables = e2m1_pair_tables();
  const __m512i control = _mm512_load_si512(fp4_lane_order().control);
  const __m512i storage = _mm512_load_si512(fp4_lane_order().storage);
  const uint8_t *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
  const uint8_t *s0 = s[0], *s1 = s[1], *s2 = s[2], *s3 = s[3];
  const uint32_t* x[T];
  for (int t = 0; t < T; ++t) x[t] = pairs + t * (cols / 2);
  __m256d sums[T];  // rows 0-3 of each token
  for (auto& sum : sums) sum = _mm256_setzero_pd();
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t chunk_end = std::min(cols, c0 + kChunk) / 32;  // blocks
    __m512 l0[T], l1[T], l2[T], l3[T];                           // the lanes: the segments' sums
    for (int t = 0; t < T; ++t) l0[t] = l1[t] = l2[t] = l3[t] = _mm512_setzero_ps();
    for (int64_t first = c0 / 32; first < chunk_end; first += kSegment / 32) {
      const int64_t blocks = kWholeSegments ? kSegment / 32 : std::min(chunk_end, first + kSegment / 32) - first;
      __m512 a0[T], a1[T], a2[T], a3[T];
      for (int t = 0; t < T; ++t) a0[t] = a1[t] = a2[t] = a3[t] = _mm512_setzero_ps();
        // A segment's eight blocks unrolled: as a loop of eight the one-token
        // product ran 2-5% slower than the chunk's loop of 32 before the
        // segments (docs/kernels.md, "Segments and AMX on the Intel Xeon").
#pragma GCC unroll 8
      for (int64_t j = 0; j < blocks; ++j) {
        const int64_t k = first + j;   // first is a multiple of 8
        if (prefetch && j % 4 == 0) {  // one cache line per row, as fp4_pairs_group_chunk
          _mm_prefetch((const char*)p0 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)p1 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)p2 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)p3 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
        }
        __m512bh xv[T];
        for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x[t] + 16 * k);
        const __m512bh w0 = e2m1_block_pairs(p0 + 16 * k, _mm512_load_si512(tables.words[s0[k]]), control);
        for (int t = 0; t < T; ++t) a0[t] = _mm512_dpbf16_ps(a0[t], w0, xv[t]);
        const __m512bh w1 = e2m1_block_pairs(p1 + 16 * k, _mm512_load_si512(tables.words[s1[k]]), control);
        for (int t = 0; t < T; ++t) a1[t] = _mm512_dpbf16_ps(a1[t], w1, xv[t]);
        const __m512bh w2 = e2m1_block_pairs(p2 + 16 * k, _mm512_load_si512(tables.words[s2[k]]), control);
        for (int t = 0; t < T; ++t) a2[t] = _mm512_dpbf16_ps(a2[t], w2, xv[t]);
        const __m512bh w3 = e2m1_block_pairs(p3 + 16 * k, _mm512_load_si512(tables.words[s3[k]]), control);
        for (int t = 0; t < T; ++t) a3[t] = _mm512_dpbf16_ps(a3[t], w3, xv[t]);
      }
      for (int t = 0; t < T; ++t) {
        l0[t] = _mm512_add_ps(l0[t], a0[t]);
        l1[t] = _mm512_add_ps(l1[t], a1[t]);
        l2[t] = _mm512_add_ps(l2[t], a2[t]);
        l3[t] = _mm512_add_ps(l3[t], a3[t]);
      }
    }
    // Each register back in storage order, folded by the same tree as
    // fold16_avx512 (four rows at once), added to its row's sum.
    for (int t = 0; t < T; ++t)
      sums[t] = _mm256_add_pd(
          sums[t], fold16x4_avx512(_mm512_permutexvar_ps(storage, l0[t]), _mm512_permutexvar_ps(storage, l1[t]),
                                   _mm512_permutexvar_ps(storage, l2[t]), _mm512_permutexvar_ps(storage, l3[t])));
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_pd(out + t * out_stride, sums[t]);
}

}  // namespace

DSV4_BF16 void fp4_pair_token_steps(const float* src, int64_t cols, uint32_t* dst) {
  pair_token_steps(src, cols, dst, fp4_lane_order().permuted);
}

DSV4_BF16_VBMI bool dot4_fp4_pairs(const Linear& w, const RowGroup& g, const uint32_t* pairs, int64_t n, double* out,
                                   int64_t out_stride) {
  const int64_t cols = w.cols, row_bytes = cols / 2;
  const uint8_t* p[4];
  const uint8_t* s[4];
  for (int r = 0; r < 4; ++r) {
    p[r] = w.data + g.row(r) * row_bytes;
    s[r] = w.scale + g.row(r) * w.scale_cols;
  }
  if (!scales_qualify(s, w.scale_cols)) return false;
  switch (n) {
    case 1:
      if (cols % kSegment == 0)
        fp4_pairs_whole_rows<1, true>(p, s, cols, pairs, g.has_next, out, out_stride);
      else
        fp4_pairs_whole_rows<1, false>(p, s, cols, pairs, g.has_next, out, out_stride);
      return true;
    case 2: fp4_pairs_whole_rows<2, false>(p, s, cols, pairs, g.has_next, out, out_stride); return true;
    case 3: fp4_pairs_whole_rows<3, false>(p, s, cols, pairs, g.has_next, out, out_stride); return true;
    case 4: fp4_pairs_whole_rows<4, false>(p, s, cols, pairs, g.has_next, out, out_stride); return true;
  }
  double sums[4][kMaxRegisterTokens] = {};
  const int64_t groups = (n + 3) / 4;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t t = group * 4;
      const uint32_t* x[4];
      for (int u = 0; u < 4; ++u) x[u] = pairs + std::min(t + u, n - 1) * (cols / 2);
      const bool prefetch = g.has_next && group == 0;
      double* sum = &sums[0][t];
      switch (std::min<int64_t>(4, n - t)) {
        case 4: fp4_pairs_group_chunk<4>(p, s, c0, c1, x, prefetch, sum); break;
        case 3: fp4_pairs_group_chunk<3>(p, s, c0, c1, x, prefetch, sum); break;
        case 2: fp4_pairs_group_chunk<2>(p, s, c0, c1, x, prefetch, sum); break;
        default: fp4_pairs_group_chunk<1>(p, s, c0, c1, x, prefetch, sum); break;
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int64_t t = 0; t < n; ++t) out[t * out_stride + r] = sums[r][t];
  return true;
}

}  // namespace dsv4::linear_detail
