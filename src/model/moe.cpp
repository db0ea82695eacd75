// Mixture of experts (architecture.md §4.4): sqrt(softplus) router scores, a
// selection-only bias (or a token-id hash table on the first layers),
// normalised and scaled weights, clamped SwiGLU experts and one shared expert.
#include <algorithm>
#include <cmath>
#include <vector>

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

// Runs one expert on the rows of `x` listed in `rows`; writes [rows, dim].
void expert_forward(const ModelConfig& c, const ExpertWeights& e, const float* x,
                    const std::vector<int64_t>& rows, const std::vector<float>& row_weights,
                    bool weighted, float* y) {
  const int64_t n = int64_t(rows.size()), D = c.dim, I = c.moe_inter_dim;
  std::vector<float> xin(size_t(n * D)), a(size_t(n * I)), b(size_t(n * I));
  for (int64_t i = 0; i < n; ++i) std::copy_n(x + rows[size_t(i)] * D, D, xin.data() + i * D);
  linear_forward(e.w1, xin.data(), n, a.data());
  linear_forward(e.w3, xin.data(), n, b.data());
  for (int64_t i = 0; i < n; ++i)
    swiglu(a.data() + i * I, b.data() + i * I, I, c.swiglu_limit,
           weighted ? row_weights[size_t(i)] : 1.0f, weighted);
  linear_forward(e.w2, a.data(), n, y);
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
  // in ascending expert order, then the shared expert. All routed experts'
  // gate and up products go as one batch of products, then all their down
  // products (linear_forward_many: same bits as one call each).
  std::fill(out, out + n * D, 0.0f);
  struct Routed {
    const ExpertWeights* weights;
    std::vector<int64_t> rows;
    std::vector<float> row_weights;
    int64_t offset;  // first row in the gathered buffers
  };
  std::vector<Routed> routed;
  int64_t pairs = 0;
  for (int64_t e = 0; e < E; ++e) {
    Routed r{&w.experts[size_t(e)], {}, {}, pairs};
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < K; ++k)
        if (chosen[size_t(t * K + k)] == e) {
          r.rows.push_back(t);
          r.row_weights.push_back(chosen_weight[size_t(t * K + k)]);
        }
    if (r.rows.empty()) continue;
    pairs += int64_t(r.rows.size());
    routed.push_back(std::move(r));
  }
  const int64_t I = c.moe_inter_dim;
  std::vector<float> xin(size_t(pairs * D)), a(size_t(pairs * I)), b(size_t(pairs * I)), y(size_t(pairs * D));
  std::vector<LinearProduct> products;
  for (const Routed& r : routed) {
    const int64_t m = int64_t(r.rows.size());
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + r.rows[size_t(i)] * D, D, xin.data() + (r.offset + i) * D);
    products.push_back({&r.weights->w1, xin.data() + r.offset * D, m, a.data() + r.offset * I});
    products.push_back({&r.weights->w3, xin.data() + r.offset * D, m, b.data() + r.offset * I});
  }
  linear_forward_many(products.data(), products.size());
  products.clear();
  for (const Routed& r : routed) {
    const int64_t m = int64_t(r.rows.size());
    for (int64_t i = 0; i < m; ++i)
      swiglu(a.data() + (r.offset + i) * I, b.data() + (r.offset + i) * I, I, c.swiglu_limit,
             r.row_weights[size_t(i)], true);
    products.push_back({&r.weights->w2, a.data() + r.offset * I, m, y.data() + r.offset * D});
  }
  linear_forward_many(products.data(), products.size());
  for (const Routed& r : routed)
    for (size_t i = 0; i < r.rows.size(); ++i)
      for (int64_t d = 0; d < D; ++d) out[r.rows[i] * D + d] += y[(size_t(r.offset) + i) * size_t(D) + size_t(d)];
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) all[size_t(t)] = t;
  y.resize(size_t(n * D));
  expert_forward(c, w.shared, x, all, {}, false, y.data());
  for (int64_t i = 0; i < n * D; ++i) out[i] += y[size_t(i)];
}

}  // namespace dsv4
