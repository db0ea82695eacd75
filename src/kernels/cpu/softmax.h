// The attention's softmax with a sink, vectorized with one definition on
// every path (docs/kernels.md, "The attention's softmax").
//
// std::exp cannot be vectorized without changing its bits (glibc's expf is
// not correctly rounded, and its vector variants differ from it), and a
// sequential sum of the exponentials cannot be vectorized at all. So the
// fast numerics define both: exp_fixed is a polynomial in basic IEEE
// operations that the scalar, AVX2 and AVX-512 paths evaluate identically,
// and the denominator sums 16 lanes (j mod 16) folded like dot_fixed.
#pragma once
#include <cstdint>

#include "kernels/cpu/isa.h"

namespace dsv4 {

// e^x within 2 ulp for x in [-87.33, 88]: 0 below that range, e^88 above it,
// NaN for NaN. Scalar definition of the vector paths' bits.
float exp_fixed(float x);
// e[j] = exp_fixed(x[j]), every path the same bits.
void exp_fixed_rows(const float* x, int64_t n, float* e, KernelIsa isa = active_kernel_isa());

// In place: x[j] <- exp(scale * x[j] - m) / (sum_k exp(scale * x[k] - m) +
// exp(sink - m)), m = max(sink, scale * x[k]). Order: x[j] * scale rounded;
// exp_fixed; the sum's lane l adds the exponentials of j = l mod 16 in
// increasing j, the lanes fold l += l + 8, + 4, + 2, + 1, then the sink's
// term is added; each probability is one division.
void softmax_with_sink(float* x, int64_t n, float scale, float sink, KernelIsa isa = active_kernel_isa());

}  // namespace dsv4
