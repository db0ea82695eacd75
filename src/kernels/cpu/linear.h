// The CPU implementation of the weight-format products (the contract is in
// kernels/linear.h): one scalar reference and AVX2 / AVX-512 paths that give
// its bits, chosen per call by a KernelIsa.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/cpu/isa.h"
#include "kernels/linear.h"

namespace dsv4 {

// y = W[row] . x in the canonical order (x in column order).
double linear_dot(const Linear& w, int64_t row, const float* x, KernelIsa isa = active_kernel_isa());
// Scalar reference: dequantize each weight and sum left to right in long double.
double linear_dot_reference(const Linear& w, int64_t row, const float* x);

// Y[t][o] = W[o] . X[t] for rows [row_begin, row_end) of W, n tokens.
// X is [n, x_stride] (x_stride < 0: cols; rounded through FP8 first when
// w.quantize_input), Y is [n, y_stride] and receives columns 0 ..
// row_end-row_begin-1.
void linear_forward(KernelIsa isa, const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin = 0,
                    int64_t row_end = -1, int64_t y_stride = -1, int64_t x_stride = -1);
// The same on the process's kernel path (active_kernel_isa).
inline void linear_forward(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin = 0,
                           int64_t row_end = -1, int64_t y_stride = -1, int64_t x_stride = -1) {
  linear_forward(active_kernel_isa(), w, x, n, y, row_begin, row_end, y_stride, x_stride);
}

// The products, with the bits linear_forward gives each of them. Those with
// few tokens (decode) share one parallel region, the threads claiming
// pieces of the matrices in turn: the routed experts of a decode step (about
// 80 experts x 3 matrices of 4 MB per layer at batch 16) stream back to back
// instead of paying a fork, a join and a cold start each.
void linear_forward_many(KernelIsa isa, const LinearProduct* products, size_t count);
inline void linear_forward_many(const LinearProduct* products, size_t count) {
  linear_forward_many(active_kernel_isa(), products, count);
}

// The exact numerics' product (exact_sums.h): every weight decoded to a
// float, times the (rounded) input in double, summed in double in the
// fixed lane order; one rounding to float at the end. Slower than the
// canonical order (products of all formats stay exact, the sum does not
// lose the fp32 lanes' bits), used where results must agree with a
// reference to a few units of the last place (V4.1's golden data).
void linear_forward_exact(KernelIsa isa, const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin = 0,
                          int64_t row_end = -1, int64_t y_stride = -1, int64_t x_stride = -1);

// Decodes one weight row to floats (embedding lookups, tests).
void linear_decode_row(const Linear& w, int64_t row, float* out);

}  // namespace dsv4
