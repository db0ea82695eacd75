// Manifold-constrained hyper-connections (architecture.md §4.2, §4.5).
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/linear.h"
#include "model/layers.h"

namespace dsv4 {

namespace {

// mix = (fn . v) / sqrt(mean(v^2) + eps) for every token; v is the token's
// hc_mult copies flattened copy-major.
std::vector<float> hc_mixes(const ModelConfig& c, const HyperConnectionWeights& w,
                            const float* x_hc, int64_t n) {
  const int64_t width = c.hc_mult * c.dim, mix = w.fn.rows;
  std::vector<float> out(size_t(n * mix));
  linear_forward(w.fn, x_hc, n, out.data());
#pragma omp parallel for schedule(static) num_threads(threads_for(n * width))
  for (int64_t t = 0; t < n; ++t) {
    const float* v = x_hc + t * width;
    float inv = 1.0f / std::sqrt(sum_of_squares(v, width) / float(width) + c.norm_eps);
    for (int64_t i = 0; i < mix; ++i) out[size_t(t * mix + i)] *= inv;
  }
  return out;
}

void collapse(const ModelConfig& c, const float* x, const float* pre, float* y) {
  for (int64_t d = 0; d < c.dim; ++d) {
    float s = 0.0f;
    for (int64_t j = 0; j < c.hc_mult; ++j) s += pre[j] * x[j * c.dim + d];
    y[d] = s;
  }
}

}  // namespace

void hc_pre(const ModelConfig& c, const HyperConnectionWeights& w, const float* x_hc, int64_t n,
            float* y, HcMix* out) {
  const int64_t h = c.hc_mult, mix_n = c.hc_mix();
  std::vector<float> mixes = hc_mixes(c, w, x_hc, n);
  out->pre.resize(size_t(n * h));
  out->post.resize(size_t(n * h));
  out->comb.resize(size_t(n * h * h));
  const float eps = c.hc_eps;
#pragma omp parallel for schedule(static) num_threads(threads_for(n * (h * c.dim + 16 * h * h * c.hc_sinkhorn_iters)))
  for (int64_t t = 0; t < n; ++t) {
    const float* mix = mixes.data() + t * mix_n;
    float* pre = out->pre.data() + t * h;
    float* post = out->post.data() + t * h;
    float* comb = out->comb.data() + t * h * h;
    for (int64_t j = 0; j < h; ++j) {
      pre[j] = sigmoid(mix[j] * w.scale[0] + w.base[size_t(j)]) + eps;
      post[j] = 2.0f * sigmoid(mix[h + j] * w.scale[1] + w.base[size_t(h + j)]);
    }
    // comb[j][k]: softmax over k, then alternate column / row normalisation
    // (Sinkhorn), ending with a column step: hc_sinkhorn_iters column steps.
    for (int64_t j = 0; j < h; ++j) {
      float* row = comb + j * h;
      float m = -INFINITY;
      for (int64_t k = 0; k < h; ++k) {
        row[k] = mix[2 * h + j * h + k] * w.scale[2] + w.base[size_t(2 * h + j * h + k)];
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
    for (int64_t it = 1; it < c.hc_sinkhorn_iters; ++it) {
      normalize_rows();
      normalize_columns();
    }
    collapse(c, x_hc + t * h * c.dim, pre, y + t * c.dim);
  }
}

void hc_post(const ModelConfig& c, const HcMix& mix, const float* y, float* x_hc, int64_t n) {
  const int64_t h = c.hc_mult, d = c.dim;
#pragma omp parallel for schedule(static) num_threads(threads_for(n * 2 * h * h * d))
  for (int64_t t = 0; t < n; ++t) {
    float* x = x_hc + t * h * d;
    const float* post = mix.post.data() + t * h;
    const float* comb = mix.comb.data() + t * h * h;
    std::vector<float> old(x, x + h * d);
    for (int64_t k = 0; k < h; ++k)
      for (int64_t i = 0; i < d; ++i) {
        float s = 0.0f;
        for (int64_t j = 0; j < h; ++j) s += comb[j * h + k] * old[size_t(j * d + i)];
        x[k * d + i] = post[k] * y[t * d + i] + s;
      }
  }
}

void hc_head_collapse(const ModelConfig& c, const HyperConnectionWeights& w, const float* x_hc,
                      int64_t n, float* y) {
  const int64_t h = c.hc_mult;
  std::vector<float> mixes = hc_mixes(c, w, x_hc, n);
  for (int64_t t = 0; t < n; ++t) {
    float pre[16];
    for (int64_t j = 0; j < h; ++j)
      pre[j] = sigmoid(mixes[size_t(t * h + j)] * w.scale[0] + w.base[size_t(j)]) + c.hc_eps;
    collapse(c, x_hc + t * h * c.dim, pre, y + t * c.dim);
  }
}

}  // namespace dsv4
