// Mixture of experts (architecture.md §4.4): sqrt(softplus) router scores, a
// selection-only bias (or a token-id hash table on the first layers),
// normalised and scaled weights, clamped SwiGLU experts and one shared expert.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/scratch.h"
#include "kernels/cpu/linear.h"
#include "model/layers.h"

namespace dsv4 {

namespace {

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

// One expert over the rows of `x` routed to it.
struct ExpertRun {
  const ExpertWeights* weights = nullptr;
  std::vector<int64_t> rows;
  std::vector<float> row_weights;  // empty: unweighted (the shared expert)
  int64_t offset = 0;              // its first row in the gathered buffers
};

// Runs the experts; run k's outputs [rows, dim] start at row runs[k].offset
// of the result. All gate and up products go as one batch of products, then
// all down products (linear_forward_many: same bits as one call each), so
// the routed experts of a decode step stream back to back.
ScratchArray<float> run_experts(const ModelConfig& c, const float* x, std::vector<ExpertRun>& runs) {
  const int64_t D = c.dim, I = c.moe_inter_dim;
  int64_t pairs = 0;
  for (ExpertRun& r : runs) {
    r.offset = pairs;
    pairs += int64_t(r.rows.size());
  }
  ScratchArray<float> xin(pairs * D), a(pairs * I), b(pairs * I), y(pairs * D);
  std::vector<LinearProduct> products;
  for (const ExpertRun& r : runs) {
    const int64_t m = int64_t(r.rows.size());
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + r.rows[size_t(i)] * D, D, xin.data() + (r.offset + i) * D);
    products.push_back({&r.weights->w1, xin.data() + r.offset * D, m, a.data() + r.offset * I});
    products.push_back({&r.weights->w3, xin.data() + r.offset * D, m, b.data() + r.offset * I});
  }
  linear_forward_many(products.data(), products.size());
  products.clear();
  for (const ExpertRun& r : runs) {
    const int64_t m = int64_t(r.rows.size());
    const bool weighted = !r.row_weights.empty();
    for (int64_t i = 0; i < m; ++i)
      swiglu(a.data() + (r.offset + i) * I, b.data() + (r.offset + i) * I, I, c.swiglu_limit,
             weighted ? r.row_weights[size_t(i)] : 1.0f, weighted);
    products.push_back({&r.weights->w2, a.data() + r.offset * I, m, y.data() + r.offset * D});
  }
  linear_forward_many(products.data(), products.size());
  return y;
}

}  // namespace

void moe_forward(const ModelConfig& c, const MoeWeights& w, const float* x, const int32_t* tokens,
                 int64_t n, float* out) {
  const int64_t E = c.n_routed_experts, K = c.n_activated_experts, D = c.dim;
  std::vector<float> logits(size_t(n * E));
  linear_forward(w.gate, x, n, logits.data());

  // Routing decisions per token.
  std::vector<int32_t> chosen(size_t(n * K));
  std::vector<float> chosen_weight(size_t(n * K));
  for (int64_t t = 0; t < n; ++t) {
    float* s = logits.data() + t * E;
    for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(softplus(s[e]));
    std::vector<int32_t> ids;
    if (w.hash_routed) {
      ids.assign(w.tid2eid.begin() + int64_t(tokens[t]) * K, w.tid2eid.begin() + (int64_t(tokens[t]) + 1) * K);
    } else {
      std::vector<float> biased(s, s + E);
      for (int64_t e = 0; e < E; ++e) biased[size_t(e)] += w.bias[size_t(e)];
      ids = top_k_indices(biased.data(), E, K);
    }
    float sum = 0.0f;
    for (int32_t id : ids) sum += s[id];
    for (int64_t k = 0; k < K; ++k) {
      chosen[size_t(t * K + k)] = ids[size_t(k)];
      chosen_weight[size_t(t * K + k)] = s[ids[size_t(k)]] / sum * float(c.route_scale);
    }
  }

  // Each expert runs once over all tokens routed to it; outputs are added
  // in ascending expert order, then the shared expert.
  std::vector<ExpertRun> runs;
  for (int64_t e = 0; e < E; ++e) {
    ExpertRun r{&w.experts[size_t(e)], {}, {}, 0};
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < K; ++k)
        if (chosen[size_t(t * K + k)] == e) {
          r.rows.push_back(t);
          r.row_weights.push_back(chosen_weight[size_t(t * K + k)]);
        }
    if (!r.rows.empty()) runs.push_back(std::move(r));
  }
  ExpertRun shared{&w.shared, std::vector<int64_t>(size_t(n)), {}, 0};
  for (int64_t t = 0; t < n; ++t) shared.rows[size_t(t)] = t;
  runs.push_back(std::move(shared));
  const ScratchArray<float> y = run_experts(c, x, runs);
  std::fill(out, out + n * D, 0.0f);
  for (const ExpertRun& r : runs)
    for (size_t i = 0; i < r.rows.size(); ++i)
      for (int64_t d = 0; d < D; ++d) out[r.rows[i] * D + d] += y[(r.offset + int64_t(i)) * D + d];
}

}  // namespace dsv4
