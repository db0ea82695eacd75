// Weight matrices in their checkpoint formats, and the reduction contract
// that every backend's product with them follows.
//
// Every output element y[t][o] is one dot product with a canonical reduction
// order. Each weight is decoded with its block scale applied (exact in
// fp32). The columns are taken in chunks of 1024 and each chunk in segments
// of 256; within a segment, element i goes into fp32 lane (i mod 16) with
// one fused multiply-add, in increasing i, starting from zero; a lane's
// segment sums are added in fp32 in segment order; the chunk's 16 lanes are
// folded in double in a fixed tree and the chunk sums added in double. FP4
// matrices use their storage order instead of the column order: in each
// 32-column block the 16 even columns (low nibbles) come before the 16 odd
// ones (high nibbles), so that a vector of nibbles is a vector of lanes; the
// input is permuted to match, once per token. Threads only split the (t, o)
// space. So a token's result depends neither on its batch, nor on the chunk
// size, nor on the thread count, nor on which SIMD path (scalar, AVX2,
// AVX-512, AMX) ran it.
//
// Why fp32 lanes: the official kernels accumulate in fp32 too, and the golden
// data (stabilised so that a float64 evaluation agrees) are matched as
// closely as with the previous exact-products-in-double order (tiny-flash-fp8
// median 1.55e-6, p99 5.1e-6, max 1.6e-5 with the segments, as printed by
// tests/test_model_golden.cpp),
// at half the register width per lane and without any fp32->fp64
// conversions, which is what bound the kernels. The chunks let a batched
// GEMM keep 16-lane accumulators in registers only per chunk. An fp32 engine
// can still, rarely, round a downstream FP8 activation the other way than the
// float64 reference (section 5 of the notes that came with the golden data);
// the golden tolerances leave room for that.
//
// VDPBF16PS (AVX512-BF16) gives these bits where every operand is exact in
// bf16 (FP8-rounded inputs, FP8/FP4 weights) and no sum can be subnormal:
// it adds two exact products per lane with a rounding after each, the odd
// element first, so one instruction advances a lane's chain by two steps
// (kernels/cpu/linear_bf16.cpp, docs/kernels.md).
//
// Why segments of 16 steps: AMX's TDPBF16PS, given one nonzero product per
// bf16 pair, adds 16 steps' exact products in order starting from zero and
// then adds that sum to its accumulator with one rounding. So one tile
// instruction computes a lane's segment and its addition to the lane, and
// the AMX kernels give the same bits as the others (docs/kernels.md, "AMX").
// A lane now rounds 16 + 3 times per chunk, not 64.
#pragma once
#include <cstddef>
#include <cstdint>

namespace dsv4 {

enum class WeightFormat {
  F32,
  BF16,
  FP8_BLOCK128,  // e4m3 values, one ue8m0 scale per 128x128 block
  FP4_BLOCK32,   // e2m1 nibbles packed two per byte, one ue8m0 scale per 1x32
};
constexpr int kWeightFormats = 4;

const char* weight_format_name(WeightFormat format);

struct Linear {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;  // ue8m0 bytes, layout depends on format
  int64_t scale_cols = 0;          // second dimension of the scale tensor
  // The reference rounds the input through FP8 (1 x input_block blocks:
  // 128 in V4, 32 in V4.1) before every FP8/FP4 weight product, except the
  // bf16-dequantized wo_a. V4.1's FP8 weights are expanded to BF16 at load
  // (exact) and keep this rounding.
  bool quantize_input = false;
  int64_t input_block = 128;

  bool empty() const { return data == nullptr; }
  int64_t weight_bytes() const;  // bytes read for one full pass over the weight
};

// One product Y = X W^T over rows [row_begin, row_end) of W, as
// KernelBackend::linear takes it: X is [n, x_stride] (token t's w->cols
// inputs at x + t * x_stride; x_stride < 0: w->cols), Y is [n, y_stride]
// with row o of W in column o - row_begin (row_end < 0: to the last row;
// y_stride < 0: the range's row count).
struct LinearProduct {
  const Linear* w = nullptr;
  const float* x = nullptr;
  int64_t n = 0;
  float* y = nullptr;
  int64_t row_begin = 0, row_end = -1, y_stride = -1, x_stride = -1;

  int64_t end() const { return row_end < 0 ? w->rows : row_end; }
  int64_t rows() const { return end() - row_begin; }
  int64_t stride() const { return y_stride < 0 ? rows() : y_stride; }
  int64_t input_stride() const { return x_stride < 0 ? w->cols : x_stride; }
};

}  // namespace dsv4
