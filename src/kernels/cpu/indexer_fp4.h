// The lightning indexer's scores from FP4 queries and FP4 keys with integer
// dot products (docs/long_context.md, "Integer scores").
//
// The model rounds each indexer query to FP4 (e2m1 values times a power-of-two
// scale per 32 dims) and stores each key the same way. Twice an e2m1 value is
// an integer in [-12, 12], so a 32-dim block's dot product is an exact
// integer times the two blocks' half scales: integer multiply-adds (AVX512
// VNNI's VPDPBUSD, four products a lane) give it without rounding, four times
// as many per instruction as fp32 FMAs. The fp32 part is then one fixed
// sequence of roundings that every path repeats:
//
//   dot(h, key) = 0; for each block b in order:
//     dot += (float(I_b) * q_half[h][b]) * k_half[key][b]
//   score(key)  = 0; for each head h in order:
//     score += max(dot(h, key), 0) * weight[h]
//
// with I_b the block's integer sum of (2 q)(2 k) / scales and the half
// scales 2^(e - 1). The scalar, AVX2 and AVX-512 paths give the same bits;
// these are not the bits of the fp32 dot_fixed scores (the sums differ in
// rounding), so the fast numerics' indexer scores changed with this kernel.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace dsv4::cpu {

// One query row's heads in integer form.
struct Fp4Query {
  int64_t heads = 0, dim = 0;
  // [heads][dim]: 2 q / scale, dims of each 32-block in the keys' storage
  // order (the low nibbles' dims 0, 2, .., 30, then the high nibbles' 1, .., 31).
  std::vector<int8_t> codes;
  // The per-block values and the VNNI kernel's words are stored heads
  // innermost, so that a group of heads reads consecutive values from one
  // pointer.
  std::vector<float> half_scale;  // [dim / 32][heads]: scale / 2
  float half_scale_min = 0, half_scale_max = 0;  // over all of half_scale
  // [dim / 32][heads]: -12 * the block's sum of codes: the keys' codes are
  // stored as 2 k + 12 (unsigned, for VPDPBUSD), and this offset undoes the 12.
  std::vector<int32_t> offset;
  // [dim / 4][heads]: `codes` four to a word (VPDPBUSD's broadcast operand).
  std::vector<int32_t> words_by_group;
  // The form that sums a head's blocks in one integer (docs/long_context.md,
  // "One integer sum across the blocks"): each block's codes times
  // 2^(its exponent - the head's smallest), where every such code stays
  // within [-127, 127]; `one_sum` says that it does for every head.
  bool one_sum = false;
  std::vector<int32_t> scaled_words;   // [dim / 4][heads], four scaled codes to a word
  std::vector<int32_t> scaled_offset;  // [heads]: -kScaledKeyBias * the head's sum of scaled codes
  std::vector<float> head_half_scale;  // [heads]: the head's smallest half scale
};

// The bias of the keys' scaled codes (2 k times 2^d, d <= 3, plus this: in
// [0, 192], VPDPBUSD's unsigned operand).
constexpr int32_t kScaledKeyBias = 96;

// The integer form of `heads` query rows of `dim` values, or false when a
// 32-block is not on such a grid (2 q / scale an integer in [-127, 127] for
// the power of two `scale` >= max|q| / 6): then the fp32 scores apply. Every
// path gives the same codes and answer (AVX-512: a block in two registers;
// 0.09 s of a 4096-token prefill as the scalar loop).
bool fp4_query(const float* q, int64_t heads, int64_t dim, Fp4Query& out, KernelIsa isa = active_kernel_isa());

// scores[i] for keys [first, first + count) of `keys` (width q.dim, 32-dim
// blocks), with head weights `weights` (q.heads of them).
void fp4_scores(KernelIsa isa, const Fp4Query& q, const float* weights, const Fp4RowsView& keys, int64_t first,
                int64_t count, float* scores);

// Whether fp4_scores uses VPDPBUSD on `isa` here (AVX-512 with VNNI).
bool fp4_scores_use_vnni(KernelIsa isa);

}  // namespace dsv4::cpu
