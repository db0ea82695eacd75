// What the CPU weight-product kernels (kernels/cpu/linear*.cpp) share: the
// scalar decoders, the canonical order's chunk and fold (kernels/linear.h),
// the FP4 value tables, the limits that choose between the register path and
// the packed GEMM, and the per-ISA entry points that linear.cpp dispatches
// to. The design is described in docs/kernels.md.
//
// The small helpers are inline here so that every kernel file still inlines
// them into its loops, as when the kernels were one file.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/numeric.h"
#include "kernels/cpu/isa.h"
#include "kernels/linear.h"

namespace dsv4::linear_detail {

// ---------------------------------------------------------------- scalar ---

// Decodes weights [i0, i0+16) of a row into floats with the scale applied.
inline void decode16(const Linear& w, int64_t row, int64_t i0, float* out) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: std::memcpy(out, reinterpret_cast<const float*>(w.data) + row * n + i0, 64); return;
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
inline void to_storage_order(const Linear& w, const float* x, float* out) {
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

// The canonical order (see linear.h): within each segment of kSegment
// columns, element i goes to fp32 lane i mod 16 with one fused multiply-add,
// in increasing i, from zero; each lane adds its segment sums in fp32 in
// order over a chunk of kChunk columns; the chunk's 16 lanes are folded in
// double in a fixed tree; the chunk sums are added in double in increasing
// chunk order.
constexpr int64_t kChunk = 1024;
constexpr int64_t kSegment = 256, kSegmentSteps = kSegment / 16, kSegmentPairs = kSegmentSteps / 2;
static_assert(kChunk % kSegment == 0 && kSegment % 128 == 0, "segments tile chunks and FP8 scale blocks");

inline double fold16(const float* lanes) {
  double s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = double(lanes[l]) + double(lanes[l + 8]);
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The 16 e2m1 values times 2^(s - 127) for every ue8m0 byte s, computed as
// the scalar decoder computes them (code value * scale in float): loading a
// block's table is cheaper than scaling one per block and row.
//
// The same values as the top 16 bits of their float bits, for a byte lookup
// per half (AVX2, where a permute of floats is slow on some CPUs): the low
// bytes of the 16 codes, then their high bytes. An e2m1 value times a power
// of two has at most two significant bits, so its low 16 bits are zero, for
// the subnormal products of the smallest scales too; `top_halves_exact[s]`
// checks it (and so covers the NaN scale byte) rather than assuming it.
struct E2m1Tables {
  alignas(64) float values[256][16];
  alignas(64) uint8_t top_half_bytes[256][32];
  bool top_halves_exact[256];
  E2m1Tables() {
    for (int s = 0; s < 256; ++s) {
      top_halves_exact[s] = true;
      for (int c = 0; c < 16; ++c) {
        values[s][c] = e2m1_to_float(uint8_t(c)) * e8m0_to_float(uint8_t(s));
        uint32_t bits;
        std::memcpy(&bits, &values[s][c], 4);
        top_half_bytes[s][c] = uint8_t(bits >> 16);
        top_half_bytes[s][16 + c] = uint8_t(bits >> 24);
        top_halves_exact[s] = top_halves_exact[s] && (bits & 0xFFFF) == 0;
      }
    }
  }
};
inline const E2m1Tables& e2m1_tables() {
  static const E2m1Tables tables;
  return tables;
}

// Largest ue8m0 byte for which scale * 256 is still a finite float: the
// SIMD fp16 decoders of e4m3 take the scale times 256.
constexpr uint8_t kMaxHalfPathScale = 127 + 119;

// FP8 rows of whole 128-row blocks against up to this many tokens take the
// block's scales in a copy of the inputs (register_rows_avx512).
constexpr int64_t kFp8PrescaledMaxTokens = 4;
// Up to this many tokens, FP8 rows of whole 128-row blocks whose inputs keep
// the fp32 kernel take the whole-row function, four tokens a pass
// (fp8_whole_rows_avx512; more tokens keep the L1 buffer of decoded rows).
constexpr int64_t kFp8WholeRowsMaxTokens = 8;

// Calls f(std::integral_constant<int, N>{}) with N = n clamped to [1, Max]:
// a kernel templated on its register block (rows, tokens), chosen by a
// run-time count.
template <int Max, class F>
inline void with_block_size(int n, const F& f) {
  if constexpr (Max == 1)
    f(std::integral_constant<int, 1>{});
  else if (n >= Max)
    f(std::integral_constant<int, Max>{});
  else
    with_block_size<Max - 1>(n, f);
}

// ------------------------------------------------------ which path runs ---

// Below this many tokens, weights are decoded in registers (the register
// path, linear_avx512_rows.cpp) instead of into packed panels. With
// several token groups the first decodes each chunk's rows into an L1
// buffer that the others read (BF16, FP8), so a second decoding costs
// nothing and the register path stays faster up to 16 tokens; FP4 rows (no
// buffer) are packed from 8 tokens (measurements in docs/kernels.md).
constexpr int64_t kPackedMinTokensFp4 = 8, kPackedMinTokensBuffered = 17;
constexpr int64_t kMaxRegisterTokens = std::max(kPackedMinTokensFp4, kPackedMinTokensBuffered) - 1;

// Matrices of fewer rows (the hyper-connection mixes: 24 x 16384 fp32)
// stay on the register path at any token count, kMaxRegisterTokens tokens
// at a time with the weights in L2: packing every token's input costs
// more than such a product.
constexpr int64_t kPackedMinRows = 64;

inline int64_t packed_min_tokens(const Linear& w) {
  return w.format == WeightFormat::FP4_BLOCK32 ? kPackedMinTokensFp4 : kPackedMinTokensBuffered;  // BF16, F32 and FP8
}

// Up to this many tokens, BF16 and FP8 products on AVX-512 stay on the
// register path past packed_min_tokens, in balanced groups of at most
// kMaxRegisterTokens tokens that each stream the weights again: the packed
// GEMM's dot form packs every panel and folds a 4 x 6 block per chunk, and
// below these counts that cost more than reading the weights once per
// group (the LM head with 17 tokens: 122 ms packed, 74 ms in two groups;
// docs/kernels.md, "Register groups"). FP4 rows decode again per group, so
// they pack from kPackedMinTokensFp4 as before.
constexpr int64_t kRegisterGroupsMaxTokensBf16 = 64, kRegisterGroupsMaxTokensFp8 = 32;

inline int64_t register_groups_max_tokens(const Linear& w) {
  return w.format == WeightFormat::BF16           ? kRegisterGroupsMaxTokensBf16
         : w.format == WeightFormat::FP8_BLOCK128 ? kRegisterGroupsMaxTokensFp8
                                                  : 0;
}

// From this many tokens on, the packed GEMM's outer form (below, its dot
// form; gemm_driver.h). Its panel transpose and input packing pay off only
// over many tokens: the dot form was as fast or faster up to 96 tokens, the
// outer form faster from 128 (docs/kernels.md).
constexpr int64_t kOuterMinTokens = 128;

// The four rows of a register group: row(r) = first + r * stride. A thread
// walks the rows of a piece as four streams (stride = a quarter of the
// piece; the group after this one holds the next row of each stream), the
// access pattern of the four-stream bandwidth measure: each stream runs on
// through row after row, where consecutive groups of four rows restarted
// four short streams every few KB.
// A register group with one token group (batch 1) asks for each stream's
// bytes kPrefetchBytesAhead ahead as it goes (past a row's end: the next row
// of the stream, which the same thread takes next): the hardware
// prefetchers alone kept too few lines in flight for DRAM-resident weights
// (docs/kernels.md). 1.5 KB: on AMD Zen 5 the one-token LM head ran 5%
// faster than with 1 KB, 2 KB was between them and 3 KB slower; the FP4
// experts and FP8 products ran the same.
constexpr int64_t kPrefetchBytesAhead = 1536;

// Kernels take it by const reference: passed by value into another file's
// kernel, it was copied with wide loads just after the caller's narrow
// stores, a store-forwarding stall at every group of four rows
// (docs/kernels.md, "Row groups passed by reference").
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

// ----------------------------------------------------------- entry points ---
// All take inputs in storage order (linear.cpp prepares them) and give the
// scalar path's bits.

// The FP8 scale bytes s (a range; none is [1, 0]) for which inputs whose
// nonzero values have exponent fields in [min_field, max_field] stay exact
// when multiplied by 2^(s - 119) (the block scale times the 256 of the fp16
// decoding): scaling up is exact until a value overflows, scaling down
// until a nonzero one leaves the normal floats. None when an input is not
// finite (field 255).
inline std::pair<int, int> prescalable_scale_range(int min_field, int max_field) {
  if (max_field == 255) return {1, 0};
  // Down: the smallest value, 2^(min_field - 127) or less for a subnormal,
  // needs min_field - 127 + s - 119 >= -126. Up: the largest, below
  // 2^(max_field - 126), needs max_field - 127 + s - 119 <= 127.
  return {std::max(0, 120 - min_field), std::min<int>(kMaxHalfPathScale, 373 - max_field)};
}
// The range for the inputs xs[0 .. count): linear.cpp (scalar, for AVX2)
// and linear_avx512_rows.cpp (count a multiple of 16). It runs once per
// piece of rows of a one-token FP8 product, so it must cost little beside
// the rows.
std::pair<int, int> prescalable_scales(const float* xs, int64_t count);
DSV4_TARGET_AVX512 std::pair<int, int> prescalable_scales_avx512(const float* xs, int64_t count);

// linear_avx2.cpp
// One row against one token.
DSV4_TARGET_AVX2 double dot_avx2(const Linear& w, int64_t row, const float* x);
// Rows [lo, hi) of rows [row_begin, ...) against one token, y[o] receiving row
// row_begin + o (four streams, see RowGroup; FP8 rows of whole 128-row blocks
// 32 rows apart, with the block's scales in a copy of the input).
DSV4_TARGET_AVX2 void rows_one_token_avx2(const Linear& w, int64_t row_begin, int64_t lo, int64_t hi, const float* xs,
                                          float* y);
// Rows [lo, hi) against n tokens, y[t * y_stride + o - lo] receiving row o:
// one row at a time below kRowPairTokens tokens, pairs of rows from there.
constexpr int64_t kRowPairTokens = 5;
DSV4_TARGET_AVX2 void rows_tokens_avx2(const Linear& w, int64_t lo, int64_t hi, const float* xs, int64_t n, float* y,
                                       int64_t y_stride);
// The outer-form packed GEMM (xp packed by pack_token_outer, gemm_driver.h).
void packed_gemm_outer_avx2(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                            int64_t y_stride, int threads);

// Storage positions [0, cols) of a row, scale applied (the exact numerics'
// decoding; the scalar one is decode16_storage). Same values on every path.
DSV4_TARGET_AVX2 void decode_row_avx2(const Linear& w, int64_t row, float* out);
DSV4_TARGET_AVX512 void decode_row_avx512(const Linear& w, int64_t row, float* out);

// linear_avx512.cpp
DSV4_TARGET_AVX512 double dot_avx512(const Linear& w, int64_t row, const float* x);
// The register path (linear_avx512_rows.cpp): rows [o0, o1) of rows
// [row_begin, ...) against n <= kMaxRegisterTokens tokens (xs: [n][cols]),
// Y[t][o] at y[t * y_stride + o].
// pairs: for FP4, and for FP8 up to kFp8FourRowMaxTokens and from
// kEightRowMinTokensFp8 tokens, the tokens' step-pair words
// (pair_token_steps) where the VDPBF16PS kernels may run, else null.
DSV4_TARGET_AVX512 void register_rows_avx512(const Linear& w, int64_t row_begin, int64_t o0, int64_t o1,
                                             const float* xs, int64_t n, float* y, int64_t y_stride,
                                             const uint32_t* pairs = nullptr);
// The packed GEMMs, dot form (xp packed by pack_token_dot) and outer form
// (pack_token_outer), for rows [row_begin, row_begin + out) on `threads` threads.
DSV4_TARGET_AVX512 void packed_gemm_dot_avx512(const Linear& w, int64_t row_begin, int64_t out, const float* xp,
                                               int64_t n, float* y, int64_t y_stride, int threads);
void packed_gemm_outer_avx512(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                              int64_t y_stride, int threads);
// Storage positions [c0, c1) of one row, decoded with the scale applied,
// to dst, dst + step, ... (16 floats each).
DSV4_TARGET_AVX512 void decode_chunk_avx512(const Linear& w, int64_t row, int64_t c0, int64_t c1, float* dst,
                                            int64_t step);
// Rows [row, row + count) (count <= 16; the rest zeros), positions [c0, c0 +
// 16 * steps), decoded to rows_tmp[r * steps * 16 ...]: the outer forms'
// panel input, before its transpose.
DSV4_TARGET_AVX512 void decode_16_rows_avx512(const Linear& w, int64_t row, int count, int64_t c0, int64_t steps,
                                              float* rows_tmp);
// The outer form's fold: lanes[(l * tokens + t) * 32 + row] -> sums[t * stride + row] (+=), for rows [0,
// width), width a multiple of 8 (the AMX kernel folds 16 or 32).
DSV4_TARGET_AVX512 void fold_lanes_avx512(const float* lanes, int tokens, double* sums, int64_t sums_stride, int width);
// All 32 rows of an outer-form panel group: the packed_gemm_outer drivers' fold.
DSV4_TARGET_AVX512 inline void fold_panel_lanes_avx512(const float* lanes, int tokens, double* sums,
                                                       int64_t sums_stride) {
  fold_lanes_avx512(lanes, tokens, sums, sums_stride, 32);
}

// The eight-row kernels: eight rows against the tokens in pairs (from
// kEightRowTriplesMinTokens tokens mostly in triples), so that an input
// vector feeds eight accumulators (docs/kernels.md, "Eight rows").
// BF16 rows from two tokens (one token keeps the four-row kernel's
// streaming prefetches, as fast or faster); FP8 rows of whole 128-row
// blocks with VDPBF16PS from kEightRowMinTokensFp8 (linear_fp8_pairs.cpp).
// The eight rows are consecutive (one 64 KB stretch of a BF16 matrix with
// 4096 columns), except for BF16 products of more than
// kEightRowConsecutiveMaxTokensBf16 tokens, which take one row of each of
// eight streams an eighth of the thread's rows apart. Measured on AMD Zen 5
// against the two neighbours of four streams these kernels took before:
// where the product streams near the bandwidth (two to six tokens) the
// consecutive rows read 13-24% faster from DRAM and the eight streams 5-8%
// slower than those; where its FMAs bound it (seven and more) the eight
// streams are 7-15% faster and the consecutive rows up to 10% slower
// (docs/kernels.md, "Eight consecutive rows").
constexpr int kEightRows = 8;
constexpr int64_t kEightRowMinTokens = 2, kEightRowMinTokensFp8 = 5, kEightRowConsecutiveMaxTokensBf16 = 6;
// From this many tokens the eight-row kernels take them mostly three at a
// time: the BF16 kernel (dot8_bf16_avx512) 2-8% faster from DRAM and 6-14%
// in cache at 5-16 tokens on AMD Zen 5, but 13% slower from DRAM with three
// tokens as one group (docs/kernels.md, "Token triples"); the FP8 one with
// VDPBF16PS (dot8_fp8_pairs) 2-8% faster in cache at 5-16 tokens ("FP8
// eight rows with byte tables").
constexpr int64_t kEightRowTriplesMinTokens = 5;
// The token groups of the eight-row kernels: pairs (the last one alone when
// n is odd), or from kEightRowTriplesMinTokens tokens triples, with pairs
// where four or two tokens are left (16 tokens: 3, 3, 3, 3, 2, 2). Returns
// the count; group g is tokens [first[g], first[g] + size[g]).
inline int eight_row_token_groups(int64_t n, int64_t* first, int64_t* size) {
  int groups = 0;
  for (int64_t t = 0; t < n; t += size[groups++]) {
    const int64_t left = n - t;
    first[groups] = t;
    size[groups] = n >= kEightRowTriplesMinTokens && left != 4 && left >= 3 ? 3 : std::min<int64_t>(left, 2);
  }
  return groups;
}
// linear_avx512_eight_rows.cpp. rows[0..8) against n <= kMaxRegisterTokens
// tokens (xs: [n][cols]); out[t * 8 + r] receives (rows[r], token t).
// next_rows: the thread takes rows[r] + next_rows next (0: none), whose
// first bytes the last chunk prefetches. BF16 rows:
DSV4_TARGET_AVX512 void dot8_bf16_avx512(const Linear& w, const int64_t* rows, int64_t next_rows, const float* xs,
                                         int64_t n, double* out);
// FP8 rows (cols a multiple of 32) of one 128-row block whose scales all lie
// in [kBf16ExactMinFp8Scale, kMaxHalfPathScale], against inputs in fp32
// (V4's wo_a, or wherever the VDPBF16PS kernels do not run), from
// kEightRowMinTokensFp32Fp8 tokens: decoded into bf16 once per chunk.
DSV4_TARGET_AVX512 void dot8_fp8_as_bf16_avx512(const Linear& w, const int64_t* rows, int64_t next_rows,
                                                const float* xs, int64_t n, double* out);
// The block scale bytes from which every decoded e4m3 weight (smallest
// nonzero 2^-9 times the scale) is a normal fp32 value, hence exact in bf16.
constexpr int kBf16ExactMinFp8Scale = 127 - 126 + 9;
constexpr int64_t kEightRowMinTokensFp32Fp8 = kFp8WholeRowsMaxTokens + 1;
// Whether every span of the 128-row block holding `row` has a scale in
// [min_scale, kMaxHalfPathScale].
inline bool fp8_block_scales_within(const Linear& w, int64_t row, int min_scale) {
  const uint8_t* s = w.scale + row / 128 * w.scale_cols;
  // Without an early exit, so that the compiler vectorizes it: the loop that
  // left at the first bad scale took 13% of a four-token product (5-12% of
  // a one-token one; docs/kernels.md, "FP8 and FP4 one token"), when the
  // four-row kernel checked its rows at every call. Its caller now checks
  // each stream's block once (rows_as_four_streams).
  unsigned outside = 0;
  for (int64_t k = 0; k < w.scale_cols; ++k) outside |= unsigned(s[k] < min_scale) | unsigned(s[k] > kMaxHalfPathScale);
  return outside == 0;
}

// linear_bf16.cpp: the packed GEMMs with AVX512-BF16's VDPBF16PS, for the
// products where it gives the canonical bits (bf16_dot_exact). Inputs are
// packed by pack_token_dot_bf16 / pack_token_outer_bf16.
// Whether the weights of rows [row_begin, row_end) and the n prepared
// inputs xs ([n][cols]) qualify: an FP8 or FP4 weight with FP8-rounded
// inputs, and no nonzero weight or input below 2^-50 (so that no sum can be
// subnormal, which VDPBF16PS flushes to zero; see docs/kernels.md).
// The block scale bytes that keep the smallest nonzero weight at 2^-50 or
// above: e4m3's smallest subnormal is 2^-9, e2m1's smallest value 2^-1.
constexpr int kBf16DotMinFp8Scale = 127 - 50 + 9, kBf16DotMinFp4Scale = 127 - 50 + 1;
bool bf16_dot_weights_qualify(const Linear& w, int64_t row_begin, int64_t row_end);
bool bf16_dot_inputs_qualify(const float* xs, int64_t count);
void pack_token_dot_bf16(const float* src, int64_t cols, int64_t n, int64_t t, float* xp);
void pack_token_outer_bf16(const float* src, int64_t cols, int64_t n, int64_t t, float* xp);
void packed_gemm_dot_bf16(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                          int64_t y_stride, int threads);
void packed_gemm_outer_bf16(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                            int64_t y_stride, int threads);

// The FP4 register path with VDPBF16PS. A token's prepared inputs (storage
// order, FP8-rounded, cols a multiple of 32) as step-pair words (in
// linear_bf16.cpp, beside the packed forms' pair packing): dst[b / 2 + j]
// holds positions b + j (high half) and b + 16 + j of each 32-column block b.
// With lane_order (16 entries), word j of each block goes to the place P
// with lane_order[P] == j instead.
DSV4_TARGET_AVX512_BF16 void pair_token_steps(const float* src, int64_t cols, uint32_t* dst,
                                              const uint32_t* lane_order = nullptr);
// linear_fp4_pairs.cpp (AVX512-BF16 and AVX512-VBMI): pair_token_steps in
// the lane order of the FP4 kernel below.
DSV4_TARGET_AVX512_BF16 void fp4_pair_token_steps(const float* src, int64_t cols, uint32_t* dst);
// The four rows of `g` (FP4) against n < kPackedMinTokensFp4 tokens whose
// pair words (fp4_pair_token_steps, cols / 2 per token) qualify
// (bf16_dot_inputs_qualify), as dot4_fp4_avx512 gives them, same bits;
// false (nothing written) where a block scale of the rows is below
// kBf16DotMinFp4Scale.
DSV4_TARGET_AVX512_BF16_VBMI bool dot4_fp4_pairs(const Linear& w, const RowGroup& g, const uint32_t* pairs, int64_t n,
                                                 double* out, int64_t out_stride);
// linear_fp8_pairs.cpp: FP8 rows[0..8) of one 128-row block (two of each
// stream, as the eight-row kernels take them) whose scales all lie in
// [kBf16DotMinFp8Scale, kMaxHalfPathScale], against n <= kMaxRegisterTokens
// tokens with VDPBF16PS, whose pair words (cols / 2 per token, cols a
// multiple of 32) qualify; out[t * 8 + r] receives (rows[r], token t), the
// bits of the fp32 kernels. next_rows: the thread takes rows[r] + next_rows
// next (0: none), whose first bytes the last chunk prefetches.
DSV4_TARGET_AVX512_BF16 void dot8_fp8_pairs(const Linear& w, const int64_t* rows, int64_t next_rows,
                                            const uint32_t* pairs, int64_t n, double* out);

// linear_amx.cpp: the packed GEMM with AMX tiles for the products where
// VDPBF16PS would give the canonical bits (bf16_dot_*_qualify), weights of
// whole segments (cols a multiple of kSegment), on a CPU with AMX-BF16 whose
// kernel granted the tile data (amx_enabled). Tokens go in groups of
// kAmxTokens (a tile's rows); xp holds n rounded up to a whole group.
constexpr int64_t kAmxTokens = 16;
// From this many tokens on (docs/kernels.md, "AMX").
constexpr int64_t kAmxMinTokens = 16;
// The group of kAmxTokens tokens from `first` of the n prepared inputs xs
// ([n][cols], storage order, FP8-rounded) into its place in xp; tokens past
// n are zeros.
void pack_group_amx(const float* xs, int64_t n, int64_t cols, int64_t first, float* xp);
void packed_gemm_amx(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                     int64_t y_stride, int threads);
// How many products packed_gemm_amx has run in this process (tests check
// that the AMX kernel, not a fallback, gave their bits).
int64_t amx_products();

// linear_fp8_pairs.cpp: the four rows of `g` (FP8, cols a multiple of 64;
// rows of any blocks) against n <= kFp8FourRowMaxTokens tokens whose pair
// words (cols / 2 per token) qualify, with VDPBF16PS and byte-table
// decoding (AVX512-VBMI); out[t * out_stride + r] receives the fp32
// kernels' bits. Precondition, checked by the caller once per 128-row block
// of each stream rather than here at every group: every block scale of the
// four rows lies in [kBf16DotMinFp8Scale, kMaxHalfPathScale]
// (fp8_block_scales_within).
constexpr int64_t kFp8FourRowMaxTokens = kEightRowMinTokensFp8 - 1;
DSV4_TARGET_AVX512_BF16_VBMI void dot4_fp8_pairs(const Linear& w, const RowGroup& g, const uint32_t* pairs, int64_t n,
                                                 double* out, int64_t out_stride);

}  // namespace dsv4::linear_detail
