// The sums of the exact numerics (kernels/backend.h, exact_backend): dot
// products whose products are exact in double (a float times a float has at
// most 48 significant bits) and whose sum is taken in double, in a fixed
// order every instruction-set path keeps: element i goes to double lane
// i mod 8 with one fused multiply-add, in increasing i; the lanes fold
// (l, l + 4), (l, l + 2), (l, l + 1). The error is that of the double sum,
// about 2^-53 of the terms' magnitude, instead of the fp32 lanes' 2^-24.
#pragma once
#include <cstdint>

#include "kernels/cpu/isa.h"

namespace dsv4 {

double dot_exact(const float* a, const float* b, int64_t n, KernelIsa isa);
// b already in double (a linear's input, converted once per token).
double dot_exact(const float* a, const double* b, int64_t n, KernelIsa isa);
inline double sum_of_squares_exact(const float* x, int64_t n, KernelIsa isa) { return dot_exact(x, x, n, isa); }
// out[t] = dot_exact(a, b + t * n, n) for t < tokens, with the bits of one
// call each; four tokens share each load of `a` (n a multiple of 16).
void dot_exact_tokens(const float* a, const double* b, int64_t n, int64_t tokens, double* out, KernelIsa isa);

}  // namespace dsv4
