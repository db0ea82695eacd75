// Token sampling with seeded, counter-based randomness: the draw for the k-th
// generated token of a request depends only on (seed, k), so a request samples
// the same tokens alone or in any batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/constraint.h"

namespace dsv4 {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int64_t top_k = -1;  // <= 0: off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int64_t max_new_tokens = 128;
  // The client asked for max_new_tokens (an error if it does not fit, see
  // validate_request) rather than taking a default (cut to fit).
  bool max_new_tokens_explicit = false;
  int64_t min_new_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  uint64_t seed = 0;
  int64_t top_logprobs = 0;  // alternatives to report per token (0..20)
  // OpenAI's logit_bias: (token, bias) pairs added to the raw logits before
  // the penalties, temperature and truncation (greedy included). Token ids
  // inside the vocabulary; the server takes biases in [-100, 100]. Empty:
  // sampling is exactly as without it. Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Constrained decoding (response_format, regex, ebnf, forced tool calls):
  // each sequence starts its own state from it. Null: unconstrained.
  std::shared_ptr<const ConstraintFactory> constraint;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0;                           // log-softmax of the raw logits
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives
};

// Counts of tokens already generated, for the penalties.
struct PenaltyState {
  std::vector<std::pair<int32_t, int32_t>> counts;  // (token, count), sorted by token
  void add(int32_t token);
  int32_t count(int32_t token) const;
};

// The distribution a token was drawn from: the raw logits after logit_bias, penalties,
// blocked tokens, temperature and top-k / top-p / min-p, renormalized. Every
// token that could have been drawn, with its probability, sorted by token id
// (tokens not listed had probability 0). Greedy decoding draws from a one-hot
// distribution. Speculative decoding needs it to accept or reject a drafted
// token by the ratio of the target's and the draft's probabilities.
struct TokenDistribution {
  std::vector<std::pair<int32_t, float>> probs;
  float prob(int32_t token) const;
};

// log sum_v exp(logits[v]): the max m, then exp_sum_f64 of the logits
// shifted by m (a fixed lane order, exp_fixed_f64: every kernel path gives
// the same bits), m + log(sum). Optionally the terms exp(logits[v] - m), m
// and the sum. Every logprob the engine reports is logits[t] minus this.
double log_partition(const float* logits, int64_t vocab, double* terms = nullptr, double* max_out = nullptr,
                     double* sum_out = nullptr);

// logits: [vocab] raw model output (not modified). `step` is the index of the
// token being generated (0 for the first). blocked_tokens cannot be drawn
// (EOS ids before min_new_tokens). When `distribution` is given it receives
// the distribution the token was drawn from; asking for it changes nothing
// about the draw. `allowed` (a grammar's mask) limits the draw to its tokens:
// the others get -inf before temperature and truncation, like blocked tokens;
// logprobs stay those of the raw logits (as with logit_bias). It must allow at
// least one token.
SampledToken sample_token(const float* logits, int64_t vocab, const SamplingParams& params,
                          const PenaltyState& penalties, const std::vector<int32_t>& prompt, int64_t step,
                          const std::vector<int32_t>& blocked_tokens, TokenDistribution* distribution = nullptr,
                          const TokenMask* allowed = nullptr);

// Uniform double in [0, 1) from (seed, step); a pure function.
double counter_uniform(uint64_t seed, uint64_t step);

}  // namespace dsv4
