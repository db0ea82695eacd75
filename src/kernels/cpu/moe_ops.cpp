// Mixture-of-experts operations on the CPU: the router and the experts'
// clamped SwiGLU products, batched so that every expert's weights are read
// once for all the rows routed to it.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/scratch.h"
#include "core/threads.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4::cpu {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// PyTorch's softplus with threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// h = silu(min(a, L)) * clamp(b, -L, L) * weight, in place into a.
void swiglu(float* a, const float* b, int64_t n, float limit, float weight, bool weighted) {
  for (int64_t i = 0; i < n; ++i) {
    float gate = a[i], up = b[i];
    if (limit > 0) {
      up = std::clamp(up, -limit, limit);
      gate = std::min(gate, limit);
    }
    float h = gate * sigmoid(gate) * up;
    a[i] = weighted ? weight * h : h;
  }
}

}  // namespace

void moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias, const int32_t* hash_table,
               const int32_t* tokens, float route_scale, int32_t* chosen, float* chosen_weights) {
  const int64_t E = experts, K = k;
  std::vector<float> biased(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    float* s = scores + t * E;
    for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(softplus(s[e]));
    std::vector<int32_t> ids;
    if (hash_table) {
      ids.assign(hash_table + int64_t(tokens[t]) * K, hash_table + (int64_t(tokens[t]) + 1) * K);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[size_t(e)] = s[e] + (bias ? bias[e] : 0.0f);
      ids = top_k_indices(biased.data(), E, K);
    }
    float sum = 0.0f;
    for (int32_t id : ids) sum += s[id];
    for (int64_t j = 0; j < K; ++j) {
      chosen[t * K + j] = ids[size_t(j)];
      chosen_weights[t * K + j] = s[ids[size_t(j)]] / sum * route_scale;
    }
  }
}

// All gate and up products go as one batch of products, then all down
// products (linear_forward_many: the same bits as one call each), so the
// routed experts of a decode step stream back to back.
void experts(KernelIsa isa, const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks,
             size_t count, float swiglu_limit, float* out, bool exact) {
  auto run = [&](std::vector<LinearProduct>& products) {
    if (!exact) return linear_forward_many(isa, products.data(), products.size());
    for (const LinearProduct& p : products)
      linear_forward_exact(isa, *p.w, p.x, p.n, p.y, p.row_begin, p.end(), p.stride(), p.input_stride());
  };
  const int64_t D = dim, I = inter;
  std::vector<int64_t> offset(count);
  int64_t pairs = 0;
  for (size_t k = 0; k < count; ++k) {
    offset[k] = pairs;
    pairs += tasks[k].count;
  }
  ScratchArray<float> xin(pairs * D), a(pairs * I), b(pairs * I), y(pairs * D);
  std::vector<LinearProduct> products;
  for (size_t k = 0; k < count; ++k) {
    const ExpertTask& task = tasks[k];
    for (int64_t i = 0; i < task.count; ++i) std::copy_n(x + task.rows[i] * D, D, xin.data() + (offset[k] + i) * D);
    products.push_back({task.w1, xin.data() + offset[k] * D, task.count, a.data() + offset[k] * I});
    products.push_back({task.w3, xin.data() + offset[k] * D, task.count, b.data() + offset[k] * I});
  }
  run(products);
  // The SwiGLU of every (expert, row) pair, spread over the threads: one
  // std::exp per value, 5 ns each on AMD Zen 5, was 1.2 ms a layer at a
  // 16-sequence decode step on one thread. Each value is computed alone, so
  // the split changes no bit.
  std::vector<std::pair<int32_t, int32_t>> rows_of(static_cast<size_t>(pairs));  // (task, row)
  for (size_t k = 0; k < count; ++k)
    for (int64_t i = 0; i < tasks[k].count; ++i) rows_of[size_t(offset[k] + i)] = {int32_t(k), int32_t(i)};
  const int threads = threads_for(pairs * I * 64);  // about 64 cycles a value
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < pairs; ++r) {
    const ExpertTask& task = tasks[rows_of[size_t(r)].first];
    const int64_t i = rows_of[size_t(r)].second;
    const bool weighted = task.weights != nullptr;
    swiglu(a.data() + r * I, b.data() + r * I, I, swiglu_limit, weighted ? task.weights[i] : 1.0f, weighted);
  }
  products.clear();
  for (size_t k = 0; k < count; ++k)
    products.push_back({tasks[k].w2, a.data() + offset[k] * I, tasks[k].count, y.data() + offset[k] * D});
  run(products);
  std::fill(out, out + rows * D, 0.0f);
  for (size_t k = 0; k < count; ++k)
    for (int64_t i = 0; i < tasks[k].count; ++i)
      for (int64_t d = 0; d < D; ++d) out[tasks[k].rows[i] * D + d] += y[(offset[k] + i) * D + d];
}

}  // namespace dsv4::cpu
