#include "kernels/cpu/softmax.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/numeric.h"

namespace dsv4 {

namespace {

double bits_to_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// Cephes' expf: x = n ln2 + r with n = round(x log2 e), ln2 split in two so
// that n * kLn2Hi is exact, then e^r by a degree-7 polynomial and 2^n into
// the exponent bits. Every step is one IEEE operation (fused multiply-adds
// where written), so the vector paths repeat the scalar bits.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
// Below kLow the result would not be a normal float (2^n needs n >= -126);
// it is 0 there. Above kHigh (2^127) the input is clamped.
constexpr float kLow = -87.33654f, kHigh = 88.0f;

DSV4_TARGET_AVX512 inline __m512 exp_fixed_avx512(__m512 x) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), low = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kLow), _CMP_LT_OQ);
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(kHigh), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kP0);
  for (float c : {kP1, kP2, kP3, kP4, kP5}) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_mul_ps(y, _mm512_castsi512_ps(pow2));
  return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(__mmask16(~low), e), nan, x);
}

DSV4_TARGET_AVX2 inline __m256 exp_fixed_avx2(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), low = _mm256_cmp_ps(x, _mm256_set1_ps(kLow), _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(kHigh), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kP0);
  for (float c : {kP1, kP2, kP3, kP4, kP5}) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_andnot_ps(low, _mm256_mul_ps(y, _mm256_castsi256_ps(pow2)));
  return _mm256_blendv_ps(e, x, nan);
}

// The fold of 16 lanes l += l + 8, + 4, + 2, + 1 (as dot_fixed).
float fold_lanes(float lanes[16]) {
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

void softmax_with_sink_scalar(float* x, int64_t n, float scale, float sink) {
  float mx = sink;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j] *= scale);
  float lanes[16] = {};
  for (int64_t j = 0; j < n; ++j) lanes[j % 16] += (x[j] = exp_fixed(x[j] - mx));
  const float denominator = fold_lanes(lanes) + exp_fixed(sink - mx);
  for (int64_t j = 0; j < n; ++j) x[j] /= denominator;
}

DSV4_TARGET_AVX512 void softmax_with_sink_avx512(float* x, int64_t n, float scale, float sink) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(sink);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), scale_v);
    _mm512_mask_storeu_ps(x + j, m, v);
    mx = _mm512_mask_max_ps(mx, m, v, mx);
  }
  const float top = _mm512_reduce_max_ps(mx);
  const __m512 top_v = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512 e = exp_fixed_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), top_v));
    _mm512_mask_storeu_ps(x + j, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  const __m512 denominator = _mm512_set1_ps(fold_lanes(lanes) + exp_fixed(sink - top));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(x + j, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + j), denominator));
  }
}

DSV4_TARGET_AVX2 void softmax_with_sink_avx2(float* x, int64_t n, float scale, float sink) {
  const int64_t n8 = n / 8 * 8;
  const __m256 scale_v = _mm256_set1_ps(scale);
  __m256 mx = _mm256_set1_ps(sink);
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), scale_v);
    _mm256_storeu_ps(x + j, v);
    mx = _mm256_max_ps(v, mx);
  }
  alignas(32) float part[8];
  _mm256_store_ps(part, mx);
  float top = part[0];
  for (int l = 1; l < 8; ++l) top = std::max(top, part[l]);
  for (int64_t j = n8; j < n; ++j) top = std::max(top, x[j] *= scale);
  // Lanes 0-7 of the 16 in `lo`, 8-15 in `hi`: vectors of 8 alternate.
  const __m256 top_v = _mm256_set1_ps(top);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = exp_fixed_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), top_v));
    _mm256_storeu_ps(x + j, e);
    if (j % 16 == 0)
      lo = _mm256_add_ps(lo, e);
    else
      hi = _mm256_add_ps(hi, e);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (int64_t j = n8; j < n; ++j) lanes[j % 16] += (x[j] = exp_fixed(x[j] - top));
  const float denominator = fold_lanes(lanes) + exp_fixed(sink - top);
  const __m256 denominator_v = _mm256_set1_ps(denominator);
  for (int64_t j = 0; j < n8; j += 8) _mm256_storeu_ps(x + j, _mm256_div_ps(_mm256_loadu_ps(x + j), denominator_v));
  for (int64_t j = n8; j < n; ++j) x[j] /= denominator;
}

DSV4_TARGET_AVX512 int64_t exp_fixed_rows_avx512(const float* x, int64_t n, float* e) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(e + j, exp_fixed_avx512(_mm512_loadu_ps(x + j)));
  return j;
}

DSV4_TARGET_AVX2 int64_t exp_fixed_rows_avx2(const float* x, int64_t n, float* e) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(e + j, exp_fixed_avx2(_mm256_loadu_ps(x + j)));
  return j;
}

// The double version: the same reduction with ln2 split so that n ln2_hi is
// exact for |n| < 2^11, and e^r by its Taylor series to degree 13 (the
// first omitted term is below 2^-57 of the result on |r| <= ln2 / 2).
constexpr double kLog2eD = 1.4426950408889634074;
constexpr double kLn2HiD = 0x1.62e42fefa3800p-1, kLn2LoD = 0x1.ef35793c76730p-45;
constexpr double kLowD = -708.0, kHighD = 709.0;
constexpr int kTaylorDegree = 13;
struct TaylorCoefficients {
  double c[kTaylorDegree + 1];  // c[k] = 1 / k!
  constexpr TaylorCoefficients() : c() {
    double f = 1.0;
    for (int k = 0; k <= kTaylorDegree; ++k) {
      if (k > 0) f *= double(k);
      c[k] = 1.0 / f;
    }
  }
};
constexpr TaylorCoefficients kTaylor;

DSV4_TARGET_AVX512 inline __m512d exp_fixed_f64_avx512(__m512d x) {
  const __mmask8 nan = _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), low = _mm512_cmp_pd_mask(x, _mm512_set1_pd(kLowD), _CMP_LT_OQ);
  const __m512d xc = _mm512_min_pd(_mm512_set1_pd(kHighD), x);
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(xc, _mm512_set1_pd(kLog2eD)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2HiD), xc);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2LoD), r);
  __m512d y = _mm512_set1_pd(kTaylor.c[kTaylorDegree]);
  for (int k = kTaylorDegree - 1; k >= 0; --k) y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(kTaylor.c[k]));
  const __m512i pow2 = _mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtpd_epi64(n), _mm512_set1_epi64(1023)), 52);
  const __m512d e = _mm512_mul_pd(y, _mm512_castsi512_pd(pow2));
  return _mm512_mask_mov_pd(_mm512_maskz_mov_pd(__mmask8(~low), e), nan, x);
}

DSV4_TARGET_AVX2 inline __m256d exp_fixed_f64_avx2(__m256d x) {
  const __m256d nan = _mm256_cmp_pd(x, x, _CMP_UNORD_Q), low = _mm256_cmp_pd(x, _mm256_set1_pd(kLowD), _CMP_LT_OQ);
  const __m256d xc = _mm256_min_pd(_mm256_set1_pd(kHighD), x);
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(xc, _mm256_set1_pd(kLog2eD)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2HiD), xc);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2LoD), r);
  __m256d y = _mm256_set1_pd(kTaylor.c[kTaylorDegree]);
  for (int k = kTaylorDegree - 1; k >= 0; --k) y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(kTaylor.c[k]));
  // n is integral and in [-1022, 1023] here; NaN lanes are replaced below.
  const __m256i n64 = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(_mm256_blendv_pd(n, _mm256_setzero_pd(), nan)));
  const __m256i pow2 = _mm256_slli_epi64(_mm256_add_epi64(n64, _mm256_set1_epi64x(1023)), 52);
  const __m256d e = _mm256_andnot_pd(low, _mm256_mul_pd(y, _mm256_castsi256_pd(pow2)));
  return _mm256_blendv_pd(e, x, nan);
}

double fold8(double lanes[8]) {
  for (int w = 4; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

DSV4_TARGET_AVX512 double exp_sum_f64_avx512(const float* x, int64_t n, double shift, double* terms) {
  const __m512d shift_v = _mm512_set1_pd(shift);
  __m512d sum = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 m = n - j >= 8 ? __mmask8(0xff) : __mmask8((1u << (n - j)) - 1);
    const __m512d e =
        exp_fixed_f64_avx512(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + j)), shift_v));
    if (terms) _mm512_mask_storeu_pd(terms + j, m, e);
    sum = _mm512_mask_add_pd(sum, m, sum, e);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, sum);
  return fold8(lanes);
}

DSV4_TARGET_AVX2 double exp_sum_f64_avx2(const float* x, int64_t n, double shift, double* terms) {
  // Lanes 0-3 in `lo`, 4-7 in `hi`: vectors of 4 alternate.
  const __m256d shift_v = _mm256_set1_pd(shift);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const int64_t n8 = n / 8 * 8;
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256d e0 = exp_fixed_f64_avx2(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j)), shift_v));
    const __m256d e1 = exp_fixed_f64_avx2(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j + 4)), shift_v));
    if (terms) {
      _mm256_storeu_pd(terms + j, e0);
      _mm256_storeu_pd(terms + j + 4, e1);
    }
    lo = _mm256_add_pd(lo, e0);
    hi = _mm256_add_pd(hi, e1);
  }
  alignas(32) double lanes[8];
  _mm256_store_pd(lanes, lo);
  _mm256_store_pd(lanes + 4, hi);
  for (int64_t j = n8; j < n; ++j) {
    const double e = exp_fixed_f64(double(x[j]) - shift);
    if (terms) terms[j] = e;
    lanes[j % 8] += e;
  }
  return fold8(lanes);
}

DSV4_TARGET_AVX512 float max_value_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);  // a NaN load keeps m
  float top = _mm512_reduce_max_ps(m);
  for (; j < n; ++j) top = std::max(top, x[j]);
  return top;
}

DSV4_TARGET_AVX2 float max_value_avx2(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + j), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float top = lanes[0];
  for (int l = 1; l < 8; ++l) top = std::max(top, lanes[l]);
  for (; j < n; ++j) top = std::max(top, x[j]);
  return top;
}

}  // namespace

float exp_fixed(float x) {
  if (x != x) return x;
  if (x < kLow) return 0.0f;
  x = std::min(x, kHigh);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float y = kP0;
  for (float c : {kP1, kP2, kP3, kP4, kP5}) y = std::fma(y, r, c);
  y = std::fma(y, r * r, r) + 1.0f;
  return y * bits_to_float(uint32_t(int32_t(n) + 127) << 23);
}

void exp_fixed_rows(const float* x, int64_t n, float* e, KernelIsa isa) {
  int64_t j = isa == KernelIsa::Avx512 ? exp_fixed_rows_avx512(x, n, e)
              : isa == KernelIsa::Avx2 ? exp_fixed_rows_avx2(x, n, e)
                                       : 0;
  for (; j < n; ++j) e[j] = exp_fixed(x[j]);
}

double exp_fixed_f64(double x) {
  if (x != x) return x;
  if (x < kLowD) return 0.0;
  x = std::min(x, kHighD);
  const double n = std::nearbyint(x * kLog2eD);
  double r = std::fma(-n, kLn2HiD, x);
  r = std::fma(-n, kLn2LoD, r);
  double y = kTaylor.c[kTaylorDegree];
  for (int k = kTaylorDegree - 1; k >= 0; --k) y = std::fma(y, r, kTaylor.c[k]);
  return y * bits_to_double(uint64_t(int64_t(n) + 1023) << 52);
}

double exp_sum_f64(const float* x, int64_t n, double shift, double* terms, KernelIsa isa) {
  if (isa == KernelIsa::Avx512) return exp_sum_f64_avx512(x, n, shift, terms);
  if (isa == KernelIsa::Avx2) return exp_sum_f64_avx2(x, n, shift, terms);
  double lanes[8] = {};
  for (int64_t j = 0; j < n; ++j) {
    const double e = exp_fixed_f64(double(x[j]) - shift);
    if (terms) terms[j] = e;
    lanes[j % 8] += e;
  }
  return fold8(lanes);
}

float max_value(const float* x, int64_t n, KernelIsa isa) {
  if (isa == KernelIsa::Avx512) return max_value_avx512(x, n);
  if (isa == KernelIsa::Avx2) return max_value_avx2(x, n);
  float top = -INFINITY;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, x[j]);
  return top;
}

int64_t first_max_index(const float* x, int64_t n, KernelIsa isa) {
  if (n <= 0 || std::isnan(x[0])) return 0;
  const float top = max_value(x, n, isa);
  for (int64_t j = 0; j < n; ++j)
    if (x[j] == top) return j;
  return 0;
}

void softmax_with_sink(float* x, int64_t n, float scale, float sink, KernelIsa isa) {
  if (isa == KernelIsa::Avx512) return softmax_with_sink_avx512(x, n, scale, sink);
  if (isa == KernelIsa::Avx2) return softmax_with_sink_avx2(x, n, scale, sink);
  softmax_with_sink_scalar(x, n, scale, sink);
}

}  // namespace dsv4
