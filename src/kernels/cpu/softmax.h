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

// The sampler's log-softmax over a vocabulary, in double (docs/kernels.md,
// "The sampler's normalizer"). exp_fixed_f64: e^x within 1 ulp for x in
// [-708, 709]: 0 below, e^709 above, NaN for NaN.
double exp_fixed_f64(double x);
// sum_j exp_fixed_f64(double(x[j]) - shift), with the terms written to
// `terms` when it is not null. Order: lane l (of 8) adds the terms of j =
// l mod 8 in increasing j; the lanes fold l += l + 4, + 2, + 1.
double exp_sum_f64(const float* x, int64_t n, double shift, double* terms, KernelIsa isa = active_kernel_isa());
// The largest of x[0..n), NaNs skipped (-inf when there is none). A maximum
// has one value whatever the order, so every path gives it.
float max_value(const float* x, int64_t n, KernelIsa isa = active_kernel_isa());
// std::max_element's index with operator<: the first maximum, NaNs skipped,
// except that a NaN at 0 is kept (nothing compares above it).
int64_t first_max_index(const float* x, int64_t n, KernelIsa isa = active_kernel_isa());

}  // namespace dsv4
