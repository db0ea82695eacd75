#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/cpu/softmax.h"

namespace dsv4 {

void PenaltyState::add(int32_t token) {
  auto it = std::lower_bound(counts.begin(), counts.end(), std::make_pair(token, INT32_MIN));
  if (it != counts.end() && it->first == token)
    ++it->second;
  else
    counts.insert(it, {token, 1});
}

int32_t PenaltyState::count(int32_t token) const {
  auto it = std::lower_bound(counts.begin(), counts.end(), std::make_pair(token, INT32_MIN));
  return it != counts.end() && it->first == token ? it->second : 0;
}

float TokenDistribution::prob(int32_t token) const {
  auto it = std::lower_bound(probs.begin(), probs.end(), std::make_pair(token, -1.0f),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  return it != probs.end() && it->first == token ? it->second : 0.0f;
}

double counter_uniform(uint64_t seed, uint64_t step) {
  // splitmix64 over the pair: good enough statistically, and stateless.
  uint64_t z = seed ^ (step + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

double log_partition(const float* logits, int64_t vocab, double* terms, double* max_out, double* sum_out) {
  const double mx = double(max_value(logits, vocab));
  const double sum = exp_sum_f64(logits, vocab, mx, terms);
  if (max_out) *max_out = mx;
  if (sum_out) *sum_out = sum;
  return mx + std::log(sum);
}

SampledToken sample_token(const float* logits, int64_t vocab, const SamplingParams& p, const PenaltyState& penalties,
                          const std::vector<int32_t>& prompt, int64_t step, const std::vector<int32_t>& blocked,
                          TokenDistribution* dist, const TokenMask* allowed) {
  SampledToken out;
  // Log-softmax of the raw logits, for logprobs; the terms are kept for the
  // draw below when it samples (greedy needs only the sum).
  std::vector<double> exps(p.temperature > 0.0f ? size_t(vocab) : 0);
  double mx = 0, sum = 0;
  const double log_z = log_partition(logits, vocab, exps.empty() ? nullptr : exps.data(), &mx, &sum);

  // Processed scores: logit_bias, penalties, blocked tokens, temperature.
  std::vector<float> s(logits, logits + vocab);
  for (auto& [tok, bias] : p.logit_bias)
    if (tok >= 0 && tok < vocab) s[size_t(tok)] += bias;
  if (p.repetition_penalty != 1.0f) {
    std::vector<int32_t> seen = prompt;
    for (auto& [tok, n] : penalties.counts) seen.push_back(tok);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen)
      if (t >= 0 && t < vocab)
        s[size_t(t)] = s[size_t(t)] > 0 ? s[size_t(t)] / p.repetition_penalty : s[size_t(t)] * p.repetition_penalty;
  }
  for (auto& [tok, n] : penalties.counts)
    if (tok >= 0 && tok < vocab) s[size_t(tok)] -= p.frequency_penalty * float(n) + p.presence_penalty;
  for (int32_t t : blocked)
    if (t >= 0 && t < vocab) s[size_t(t)] = -std::numeric_limits<float>::infinity();
  if (allowed)
    for (int64_t v = 0; v < vocab; ++v)
      if (!mask_has(*allowed, v)) s[size_t(v)] = -std::numeric_limits<float>::infinity();

  int32_t chosen = 0;
  if (p.temperature <= 0.0f) {
    chosen = int32_t(first_max_index(s.data(), vocab));  // std::max_element's choice
    if (dist) dist->probs = {{chosen, 1.0f}};
  } else {
    // Candidates in a fixed order: all tokens by id when no truncation is
    // asked for (no sort over the vocabulary), otherwise the smallest prefix
    // of the probability-sorted list that top_k / min_p / top_p need.
    const double inv_t = 1.0 / double(p.temperature);
    std::vector<double> prob;
    double total = 0;
    if (inv_t == 1.0 && std::memcmp(s.data(), logits, size_t(vocab) * sizeof(float)) == 0) {
      // Temperature 1 and nothing processed (the common case): these are
      // the log-softmax's terms, the same numbers in the same order.
      prob = std::move(exps);
      total = sum;
    } else {
      const double m = double(max_value(s.data(), vocab));
      prob.resize(static_cast<size_t>(vocab));
      for (int64_t v = 0; v < vocab; ++v) total += (prob[size_t(v)] = std::exp((double(s[size_t(v)]) - m) * inv_t));
    }
    for (auto& v : prob) v /= total;
    const bool truncate = (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
    std::vector<int32_t> order;
    size_t n;
    if (!truncate) {
      n = size_t(vocab);  // every token by id: `order` stays empty (see candidate below)
    } else {
      auto by_prob = [&](int32_t a, int32_t b) {
        return prob[size_t(a)] > prob[size_t(b)] || (prob[size_t(a)] == prob[size_t(b)] && a < b);
      };
      std::vector<int32_t> all;
      if (p.min_p > 0) {  // min_p drops everything below min_p * max first
        double top = 0;
        for (double v : prob) top = std::max(top, v);
        for (int64_t v = 0; v < vocab; ++v)
          if (prob[size_t(v)] >= double(p.min_p) * top) all.push_back(int32_t(v));
      } else {
        all.resize(static_cast<size_t>(vocab));
        std::iota(all.begin(), all.end(), 0);
      }
      const int64_t available = int64_t(all.size());
      int64_t limit = (p.top_k > 0 && p.top_k < available) ? p.top_k : available;
      // Grow the sorted prefix until it covers top_p (usually a few hundred).
      int64_t k = std::min<int64_t>(limit, 256);
      for (;;) {
        std::partial_sort(all.begin(), all.begin() + k, all.end(), by_prob);
        double cum = 0;
        for (int64_t i = 0; i < k; ++i) cum += prob[size_t(all[size_t(i)])];
        if (k >= limit || cum >= double(p.top_p)) break;
        k = std::min<int64_t>(limit, k * 4);
      }
      order.assign(all.begin(), all.begin() + k);
      n = order.size();
      const double top = prob[size_t(order[0])];
      if (p.min_p > 0)
        while (n > 1 && prob[size_t(order[n - 1])] < double(p.min_p) * top) --n;
      if (p.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < n; ++i) {
          cum += prob[size_t(order[i])];
          if (cum >= double(p.top_p)) {
            n = i + 1;
            break;
          }
        }
      }
    }
    // (Sums in lambdas: GCC kept these accumulators on the stack in the
    // function body, a store and reload per term of a vocabulary.)
    // The i-th candidate: order[i], or token i when nothing is truncated
    // (no 129k-entry identity list to build and read through).
    auto candidate = [&](size_t i) { return truncate ? order[i] : int32_t(i); };
    const double mass = [&] {
      double sum_of_candidates = 0;
      for (size_t i = 0; i < n; ++i) sum_of_candidates += prob[size_t(candidate(i))];
      return sum_of_candidates;
    }();
    if (dist) {
      // The candidates renormalized by the mass the draw below spreads over;
      // those that underflowed to zero (blocked tokens) are left out.
      dist->probs.clear();
      for (size_t i = 0; i < n; ++i)
        if (prob[size_t(candidate(i))] > 0)
          dist->probs.push_back({candidate(i), float(prob[size_t(candidate(i))] / mass)});
      std::sort(dist->probs.begin(), dist->probs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    chosen = [&] {
      double u = counter_uniform(p.seed, uint64_t(step)) * mass;
      for (size_t i = 0; i < n; ++i) {
        u -= prob[size_t(candidate(i))];
        if (u < 0) return candidate(i);
      }
      return candidate(n - 1);
    }();
  }
  out.token = chosen;
  out.logprob = float(double(logits[chosen]) - log_z);
  if (p.top_logprobs > 0) {
    int64_t k = std::min<int64_t>(p.top_logprobs, vocab);
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int64_t i = 0; i < k; ++i) out.top.push_back({idx[size_t(i)], float(double(logits[idx[size_t(i)]]) - log_z)});
  }
  return out;
}

}  // namespace dsv4
