// Weight matrices in their checkpoint formats and the products with them.
//
// Every output element y[t][o] is one dot product with a canonical reduction
// order: each weight is decoded with its block scale applied (exact in fp32),
// multiplied by the input in double (exact: at most 8 x 24 significant bits),
// and summed in 16 double lanes (lane l takes the elements i = l mod 16) that
// are folded in a fixed tree. Threads only split the (t, o) space. So a
// token's result depends neither on its batch, nor on the chunk size, nor on
// the thread count, nor on which SIMD path (scalar, AVX2, AVX-512) ran it.
//
// Why double: with fp32 sums, the summation-order noise of a GEMM is enough
// to flip the FP8 rounding of a downstream activation now and then (on
// tiny-flash-fp8 one flip at position 95 moved 12% of the following logits
// rows by up to 0.06). Exact products summed in double agree with a float64
// evaluation of the reference math, which the golden data are stabilised
// against.
#pragma once
#include <cstdint>
#include <string>

namespace dsv4 {

enum class WeightFormat {
  F32,
  BF16,
  FP8_BLOCK128,  // e4m3 values, one ue8m0 scale per 128x128 block
  FP4_BLOCK32,   // e2m1 nibbles packed two per byte, one ue8m0 scale per 1x32
};

const char* weight_format_name(WeightFormat format);

struct Linear {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;  // ue8m0 bytes, layout depends on format
  int64_t scale_cols = 0;          // second dimension of the scale tensor
  // The reference rounds the input through FP8 (1x128 blocks) before every
  // FP8/FP4 weight product, except the bf16-dequantized wo_a.
  bool quantize_input = false;

  bool empty() const { return data == nullptr; }
  int64_t weight_bytes() const;  // bytes read for one full pass over the weight
};

// Which SIMD implementation linear_forward uses (chosen from the CPU at start,
// overridable with DSV4_KERNELS=scalar|avx2|avx512 for testing).
enum class KernelIsa { Scalar, Avx2, Avx512 };
KernelIsa active_kernel_isa();
void set_kernel_isa(KernelIsa isa);  // must be supported by the CPU
bool kernel_isa_supported(KernelIsa isa);
const char* kernel_isa_name(KernelIsa isa);

// y = W[row] . x, with x given in double (see above).
double linear_dot(const Linear& w, int64_t row, const double* x);
// Scalar reference: dequantize each weight and sum left to right in long double.
double linear_dot_reference(const Linear& w, int64_t row, const float* x);

// Y[t][o] = W[o] . X[t] for rows [row_begin, row_end) of W, n tokens.
// X is [n, cols] (rounded through FP8 first when w.quantize_input), Y is
// [n, y_stride] and receives columns 0 .. row_end-row_begin-1.
void linear_forward(const Linear& w, const float* x, int64_t n, float* y,
                    int64_t row_begin = 0, int64_t row_end = -1, int64_t y_stride = -1);

// Decodes one weight row to floats (embedding lookups, tests).
void linear_decode_row(const Linear& w, int64_t row, float* out);

}  // namespace dsv4
