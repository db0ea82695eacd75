// Mixture of experts (docs/architecture.md): sqrt(softplus) router scores, a
// selection-only bias (or a token-id hash table on the first layers),
// normalised and scaled weights, clamped SwiGLU experts and one shared
// expert. This file decides which rows go to which expert; the backend runs
// the router and the experts.
#include <vector>

#include "model/layers.h"

namespace dsv4 {

void moe_forward(const KernelBackend& kb, const ModelConfig& c, const MoeWeights& w, const float* x,
                 const int32_t* tokens, int64_t n, float* out) {
  const int64_t E = int64_t(w.experts.size()), K = w.top_k;
  std::vector<float> scores(size_t(n * E));
  kb.linear(w.gate, x, n, scores.data());
  std::vector<int32_t> chosen(size_t(n * K));
  std::vector<float> chosen_weight(size_t(n * K));
  kb.moe_route(scores.data(), n, E, K, w.hash_routed ? nullptr : w.bias.data(),
               w.hash_routed ? w.tid2eid.data() : nullptr, tokens, float(c.route_scale), chosen.data(),
               chosen_weight.data());

  // Each expert runs once over all tokens routed to it; outputs are added
  // in ascending expert order, then the shared expert.
  struct Routed {
    std::vector<int64_t> rows;
    std::vector<float> weights;
  };
  std::vector<Routed> routed(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k) {
      Routed& r = routed[size_t(chosen[size_t(t * K + k)])];
      r.rows.push_back(t);
      r.weights.push_back(chosen_weight[size_t(t * K + k)]);
    }
  std::vector<ExpertTask> tasks;
  for (int64_t e = 0; e < E; ++e) {
    const Routed& r = routed[size_t(e)];
    if (r.rows.empty()) continue;
    const ExpertWeights& ew = w.experts[size_t(e)];
    tasks.push_back({&ew.w1, &ew.w2, &ew.w3, r.rows.data(), r.weights.data(), int64_t(r.rows.size())});
  }
  std::vector<int64_t> all_rows(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) all_rows[size_t(t)] = t;
  tasks.push_back({&w.shared.w1, &w.shared.w2, &w.shared.w3, all_rows.data(), nullptr, n});
  kb.experts(x, n, c.dim, c.moe_inter_dim, tasks.data(), tasks.size(), c.swiglu_limit, out);
}

}  // namespace dsv4
