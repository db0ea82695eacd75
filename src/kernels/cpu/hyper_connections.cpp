// Manifold-constrained hyper-connections on the CPU: the mixing weights
// (a product with fn, normalised by the copies' RMS), Sinkhorn, the collapse
// into one sublayer input and the expansion back (docs/architecture.md
// describes where they sit in a block).
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/exact_sums.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4::cpu {

namespace {

// mix = (fn . v) / sqrt(mean(v^2) + eps) for every token; v is the token's
// hc_mult copies flattened copy-major.
std::vector<float> hc_mixes(KernelIsa isa, const HcShape& c, const HcSite& w, const float* x_hc, int64_t n, bool exact) {
  const int64_t width = c.copies * c.dim, mix = w.fn->rows;
  std::vector<float> out(size_t(n * mix));
  if (exact)
    linear_forward_exact(isa, *w.fn, x_hc, n, out.data());
  else
    linear_forward(isa, *w.fn, x_hc, n, out.data());
#pragma omp parallel for schedule(static) num_threads(threads_for(n* width))
  for (int64_t t = 0; t < n; ++t) {
    const float* v = x_hc + t * width;
    const float mean = exact ? float(sum_of_squares_exact(v, width, isa) / double(width))
                             : sum_of_squares(v, width, isa) / float(width);
    float inv = 1.0f / std::sqrt(mean + c.norm_eps);
    for (int64_t i = 0; i < mix; ++i) out[size_t(t * mix + i)] *= inv;
  }
  return out;
}

// y[i] = sum_j pre[j] * x[j][i], in j order, products and additions rounded
// separately; the AVX-512 path does the same on 16 columns at a time.
void collapse_columns(int64_t h, int64_t d, int64_t i0, const float* x, const float* pre, float* y) {
  for (int64_t i = i0; i < d; ++i) {
    float s = 0.0f;
    for (int64_t j = 0; j < h; ++j) s += pre[j] * x[j * d + i];
    y[i] = s;
  }
}
DSV4_TARGET_AVX512 void collapse_avx512(int64_t h, int64_t d, const float* x, const float* pre, float* y) {
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t j = 0; j < h; ++j)
      s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(pre[j]), _mm512_loadu_ps(x + j * d + i)));
    _mm512_storeu_ps(y + i, s);
  }
  collapse_columns(h, d, i, x, pre, y);
}
// The exact numerics' collapse: the sum in double, one rounding.
void collapse_exact(const HcShape& c, const float* x, const float* pre, float* y) {
  for (int64_t i = 0; i < c.dim; ++i) {
    double s = 0.0;
    for (int64_t j = 0; j < c.copies; ++j) s += double(pre[j]) * double(x[j * c.dim + i]);
    y[i] = float(s);
  }
}
void collapse(KernelIsa isa, const HcShape& c, const float* x, const float* pre, float* y, bool exact = false) {
  if (exact)
    collapse_exact(c, x, pre, y);
  else if (isa == KernelIsa::Avx512)
    collapse_avx512(c.copies, c.dim, x, pre, y);
  else
    collapse_columns(c.copies, c.dim, 0, x, pre, y);
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void hc_pre(KernelIsa isa, const HcShape& c, const HcSite& w, const float* x_hc, int64_t n, float* y, HcMix* out,
            const float* collapse_pre, bool exact) {
  const int64_t h = c.copies, mix_n = w.fn->rows;
  std::vector<float> mixes = hc_mixes(isa, c, w, x_hc, n, exact);
  out->pre.resize(size_t(n * h));
  out->post.resize(size_t(n * h));
  out->comb.resize(size_t(n * h * h));
  const float eps = c.eps;
#pragma omp parallel for schedule(static) num_threads(threads_for(n*(h * c.dim + 16 * h * h * c.sinkhorn_iters)))
  for (int64_t t = 0; t < n; ++t) {
    const float* mix = mixes.data() + t * mix_n;
    float* pre = out->pre.data() + t * h;
    float* post = out->post.data() + t * h;
    float* comb = out->comb.data() + t * h * h;
    for (int64_t j = 0; j < h; ++j) {
      pre[j] = sigmoid(mix[j] * w.scale[0] + w.base[j]) + eps;
      post[j] = 2.0f * sigmoid(mix[h + j] * w.scale[1] + w.base[h + j]);
    }
    // comb[j][k]: softmax over k, then alternate column / row normalisation
    // (Sinkhorn), ending with a column step: hc_sinkhorn_iters column steps.
    for (int64_t j = 0; j < h; ++j) {
      float* row = comb + j * h;
      float m = -INFINITY;
      for (int64_t k = 0; k < h; ++k) {
        row[k] = mix[2 * h + j * h + k] * w.scale[2] + w.base[2 * h + j * h + k];
        m = std::max(m, row[k]);
      }
      float sum = 0.0f;
      for (int64_t k = 0; k < h; ++k) sum += (row[k] = std::exp(row[k] - m));
      for (int64_t k = 0; k < h; ++k) row[k] = row[k] / sum + eps;
    }
    auto normalize_columns = [&] {
      for (int64_t k = 0; k < h; ++k) {
        float s = 0.0f;
        for (int64_t j = 0; j < h; ++j) s += comb[j * h + k];
        for (int64_t j = 0; j < h; ++j) comb[j * h + k] /= (s + eps);
      }
    };
    auto normalize_rows = [&] {
      for (int64_t j = 0; j < h; ++j) {
        float s = 0.0f;
        for (int64_t k = 0; k < h; ++k) s += comb[j * h + k];
        for (int64_t k = 0; k < h; ++k) comb[j * h + k] /= (s + eps);
      }
    };
    normalize_columns();
    for (int64_t it = 1; it < c.sinkhorn_iters; ++it) {
      normalize_rows();
      normalize_columns();
    }
    collapse(isa, c, x_hc + t * h * c.dim, collapse_pre ? collapse_pre + t * h : pre, y + t * c.dim, exact);
  }
}

void hc_collapse(KernelIsa isa, const HcShape& c, const float* pre, const float* x_hc, int64_t n, float* y,
                 bool exact) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c.copies * c.dim))
  for (int64_t t = 0; t < n; ++t)
    collapse(isa, c, x_hc + t * c.copies * c.dim, pre + t * c.copies, y + t * c.dim, exact);
}

namespace {

// One token's expansion: x[k][i] = post[k] * y[i] + sum_j comb[j][k] * x[j][i]
// with the old x. Every column i is read (all h copies) before it is
// written, so no copy of the old x is needed. The sums are taken in this
// order, products and additions rounded separately (no FMA), on every path.
// Columns [i0, d) of the token; the config allows at most 16 copies.
void hc_post_token(int64_t h, int64_t d, int64_t i0, const float* post, const float* comb, const float* y, float* x) {
  float old[16];
  for (int64_t i = i0; i < d; ++i) {
    for (int64_t j = 0; j < h; ++j) old[j] = x[j * d + i];
    for (int64_t k = 0; k < h; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < h; ++j) s += comb[j * h + k] * old[j];
      x[k * d + i] = post[k] * y[i] + s;
    }
  }
}

// The same operations on 16 columns at a time, about ten times faster than
// the scalar loop (docs/kernels.md).
DSV4_TARGET_AVX512 void hc_post_token_avx512(int64_t h, int64_t d, const float* post, const float* comb, const float* y,
                                             float* x) {
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    __m512 old[16];
    for (int64_t j = 0; j < h; ++j) old[j] = _mm512_loadu_ps(x + j * d + i);
    const __m512 yv = _mm512_loadu_ps(y + i);
    for (int64_t k = 0; k < h; ++k) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t j = 0; j < h; ++j) s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(comb[j * h + k]), old[j]));
      _mm512_storeu_ps(x + k * d + i, _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(post[k]), yv), s));
    }
  }
  hc_post_token(h, d, i, post, comb, y, x);
}

// The exact numerics' expansion: each new copy value summed in double.
void hc_post_token_exact(int64_t h, int64_t d, const float* post, const float* comb, const float* y, float* x) {
  double old[16];
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < h; ++j) old[j] = x[j * d + i];
    for (int64_t k = 0; k < h; ++k) {
      double s = double(post[k]) * double(y[i]);
      for (int64_t j = 0; j < h; ++j) s += double(comb[j * h + k]) * old[j];
      x[k * d + i] = float(s);
    }
  }
}

}  // namespace

void hc_post(KernelIsa isa, const HcShape& c, const HcMix& mix, const float* y, float* x_hc, int64_t n, bool exact) {
  const int64_t h = c.copies, d = c.dim;
  const bool avx512 = isa == KernelIsa::Avx512;
  if (exact) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n * 2 * h * h * d))
    for (int64_t t = 0; t < n; ++t)
      hc_post_token_exact(h, d, mix.post.data() + t * h, mix.comb.data() + t * h * h, y + t * d, x_hc + t * h * d);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads_for(n * 2 * h * h * d))
  for (int64_t t = 0; t < n; ++t) {
    const float* post = mix.post.data() + t * h;
    const float* comb = mix.comb.data() + t * h * h;
    if (avx512)
      hc_post_token_avx512(h, d, post, comb, y + t * d, x_hc + t * h * d);
    else
      hc_post_token(h, d, 0, post, comb, y + t * d, x_hc + t * h * d);
  }
}

void hc_head(KernelIsa isa, const HcShape& c, const HcSite& w, const float* x_hc, int64_t n, float* y, bool exact) {
  const int64_t h = c.copies;
  std::vector<float> mixes = hc_mixes(isa, c, w, x_hc, n, exact);
  for (int64_t t = 0; t < n; ++t) {
    float pre[16];
    for (int64_t j = 0; j < h; ++j) pre[j] = sigmoid(mixes[size_t(t * h + j)] * w.scale[0] + w.base[j]) + c.eps;
    collapse(isa, c, x_hc + t * h * c.dim, pre, y + t * c.dim, exact);
  }
}

}  // namespace dsv4::cpu
