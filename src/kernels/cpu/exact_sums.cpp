#include "kernels/cpu/exact_sums.h"

#include <immintrin.h>

#include <cmath>

namespace dsv4 {

namespace {

inline double fold8(const double* lanes) {
  double s4[4], s2[2];
  for (int l = 0; l < 4; ++l) s4[l] = lanes[l] + lanes[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}

// Elements [from, n) in order into their lanes (the paths' common tail).
template <typename B>
inline void tail(const float* a, const B* b, int64_t from, int64_t n, double* lanes) {
  for (int64_t i = from; i < n; ++i) lanes[i % 8] = std::fma(double(a[i]), double(b[i]), lanes[i % 8]);
}

DSV4_TARGET_AVX512 int64_t lanes_avx512(const float* a, const double* b, int64_t n, double* lanes) {
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(a + i);
    acc = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), _mm512_loadu_pd(b + i), acc);
    acc = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))),
                          _mm512_loadu_pd(b + i + 8), acc);
  }
  _mm512_storeu_pd(lanes, acc);
  return i;
}

DSV4_TARGET_AVX512 int64_t lanes_avx512(const float* a, const float* b, int64_t n, double* lanes) {
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a + i)), _mm512_cvtps_pd(_mm256_loadu_ps(b + i)), acc);
  _mm512_storeu_pd(lanes, acc);
  return i;
}

DSV4_TARGET_AVX2 int64_t lanes_avx2(const float* a, const double* b, int64_t n, double* lanes) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i)), _mm256_loadu_pd(b + i), lo);
    hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i + 4)), _mm256_loadu_pd(b + i + 4), hi);
  }
  _mm256_storeu_pd(lanes, lo);
  _mm256_storeu_pd(lanes + 4, hi);
  return i;
}

DSV4_TARGET_AVX2 int64_t lanes_avx2(const float* a, const float* b, int64_t n, double* lanes) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i)), _mm256_cvtps_pd(_mm_loadu_ps(b + i)), lo);
    hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i + 4)), _mm256_cvtps_pd(_mm_loadu_ps(b + i + 4)), hi);
  }
  _mm256_storeu_pd(lanes, lo);
  _mm256_storeu_pd(lanes + 4, hi);
  return i;
}

template <typename B>
double dot(const float* a, const B* b, int64_t n, KernelIsa isa) {
  double lanes[8] = {};
  int64_t i = 0;
  switch (isa) {
    case KernelIsa::Avx512: i = lanes_avx512(a, b, n, lanes); break;
    case KernelIsa::Avx2: i = lanes_avx2(a, b, n, lanes); break;
    default: break;
  }
  tail(a, b, i, n, lanes);
  return fold8(lanes);
}

// Four tokens at a time: the lanes of each as lanes_avx512 / lanes_avx2 fill
// them (element i into lane i mod 8, increasing i).
DSV4_TARGET_AVX512 void four_tokens_avx512(const float* a, const double* b, int64_t n, double* out) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  for (int64_t i = 0; i < n; i += 8) {
    const __m512d w = _mm512_cvtps_pd(_mm256_loadu_ps(a + i));
    for (int k = 0; k < 4; ++k) acc[k] = _mm512_fmadd_pd(w, _mm512_loadu_pd(b + k * n + i), acc[k]);
  }
  for (int k = 0; k < 4; ++k) {
    double lanes[8];
    _mm512_storeu_pd(lanes, acc[k]);
    out[k] = fold8(lanes);
  }
}

DSV4_TARGET_AVX2 void four_tokens_avx2(const float* a, const double* b, int64_t n, double* out) {
  __m256d lo[4], hi[4];
  for (int k = 0; k < 4; ++k) lo[k] = hi[k] = _mm256_setzero_pd();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256d wl = _mm256_cvtps_pd(_mm_loadu_ps(a + i)), wh = _mm256_cvtps_pd(_mm_loadu_ps(a + i + 4));
    for (int k = 0; k < 4; ++k) {
      lo[k] = _mm256_fmadd_pd(wl, _mm256_loadu_pd(b + k * n + i), lo[k]);
      hi[k] = _mm256_fmadd_pd(wh, _mm256_loadu_pd(b + k * n + i + 4), hi[k]);
    }
  }
  for (int k = 0; k < 4; ++k) {
    double lanes[8];
    _mm256_storeu_pd(lanes, lo[k]);
    _mm256_storeu_pd(lanes + 4, hi[k]);
    out[k] = fold8(lanes);
  }
}

}  // namespace

void dot_exact_tokens(const float* a, const double* b, int64_t n, int64_t tokens, double* out, KernelIsa isa) {
  int64_t t = 0;
  if (n % 8 == 0 && isa != KernelIsa::Scalar)
    for (; t + 4 <= tokens; t += 4) {
      if (isa == KernelIsa::Avx512)
        four_tokens_avx512(a, b + t * n, n, out + t);
      else
        four_tokens_avx2(a, b + t * n, n, out + t);
    }
  for (; t < tokens; ++t) out[t] = dot(a, b + t * n, n, isa);
}

double dot_exact(const float* a, const float* b, int64_t n, KernelIsa isa) { return dot(a, b, n, isa); }
double dot_exact(const float* a, const double* b, int64_t n, KernelIsa isa) { return dot(a, b, n, isa); }

}  // namespace dsv4
