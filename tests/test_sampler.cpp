// Sampling: distributions, truncations and seeded reproducibility.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/sampler.h"

namespace dsv4 {
namespace {

SampledToken draw(const std::vector<float>& logits, SamplingParams p, int64_t step = 0) {
  PenaltyState none;
  return sample_token(logits.data(), int64_t(logits.size()), p, none, {}, step, {});
}

TEST(Sampler, GreedyAndTopKOnePickTheArgmax) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(draw(l, p).token, 1);
  p.temperature = 1;
  p.top_k = 1;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    p.seed = seed;
    EXPECT_EQ(draw(l, p).token, 1);
  }
}

TEST(Sampler, SameSeedAndStepGiveTheSameToken) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i)));
  SamplingParams p;
  p.seed = 99;
  for (int64_t step = 0; step < 20; ++step) {
    EXPECT_EQ(draw(l, p, step).token, draw(l, p, step).token);
  }
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f};
  double z = 0;
  for (float v : l) z += std::exp(double(v));
  SamplingParams p;
  std::vector<int> counts(4, 0);
  const int trials = 20000;
  for (int i = 0; i < trials; ++i) {
    p.seed = uint64_t(i) * 7919;
    ++counts[size_t(draw(l, p, i).token)];
  }
  for (int v = 0; v < 4; ++v)
    EXPECT_NEAR(counts[size_t(v)] / double(trials), std::exp(double(l[size_t(v)])) / z, 0.015);
}

TEST(Sampler, TopPAndMinPRemoveTheTail) {
  std::vector<float> l = {3.0f, 2.9f, 0.0f, -5.0f};  // probs ~ .51 .46 .025 .0002
  SamplingParams p;
  p.top_p = 0.9f;
  for (int i = 0; i < 2000; ++i) {
    p.seed = uint64_t(i);
    int32_t t = draw(l, p, i).token;
    EXPECT_TRUE(t == 0 || t == 1) << t;
  }
  SamplingParams q;
  q.min_p = 0.1f;
  for (int i = 0; i < 2000; ++i) {
    q.seed = uint64_t(i);
    int32_t t = draw(l, q, i).token;
    EXPECT_TRUE(t == 0 || t == 1) << t;
  }
}

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogits) {
  std::vector<float> l = {1.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 2;
  SampledToken t = draw(l, p);
  double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(t.logprob, 3.0 - z, 1e-6);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].first, 2);
  EXPECT_EQ(t.top[1].first, 1);
}

TEST(Sampler, PenaltiesAndBlockedTokens) {
  std::vector<float> l = {2.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0;
  PenaltyState seen;
  seen.add(0);
  p.frequency_penalty = 0.5f;
  EXPECT_EQ(sample_token(l.data(), 2, p, seen, {}, 0, {}).token, 1);
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 1.2f;
  EXPECT_EQ(sample_token(l.data(), 2, r, PenaltyState{}, {0}, 0, {}).token, 1);
  SamplingParams b;
  b.temperature = 0;
  EXPECT_EQ(sample_token(l.data(), 2, b, PenaltyState{}, {}, 0, {0}).token, 1);
}

// The distribution handed back is the one drawn from: it sums to 1, holds the
// drawn token, respects the truncations, and asking for it changes nothing.
TEST(Sampler, ReturnsTheDistributionItDrewFrom) {
  std::vector<float> l(3000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(3.0 * std::sin(double(i) * 0.37));
  PenaltyState seen;
  seen.add(5);
  seen.add(5);
  seen.add(17);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> blocked = {42, 2999};
  std::vector<SamplingParams> cases(6);
  cases[1].top_k = 7;
  cases[2].top_p = 0.5f;
  cases[3].min_p = 0.2f;
  cases[4].temperature = 0.3f, cases[4].top_k = 100, cases[4].top_p = 0.9f, cases[4].min_p = 0.01f;
  cases[5].temperature = 1.7f, cases[5].repetition_penalty = 1.3f, cases[5].frequency_penalty = 0.5f,
  cases[5].presence_penalty = 0.4f;
  for (size_t c = 0; c < cases.size(); ++c) {
    SamplingParams p = cases[c];
    p.top_logprobs = 2;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      p.seed = seed;
      SampledToken plain = sample_token(l.data(), int64_t(l.size()), p, seen, prompt, int64_t(seed), blocked);
      TokenDistribution d;
      SampledToken t = sample_token(l.data(), int64_t(l.size()), p, seen, prompt, int64_t(seed), blocked, &d);
      EXPECT_EQ(t.token, plain.token);
      EXPECT_EQ(t.logprob, plain.logprob);
      EXPECT_EQ(t.top, plain.top);
      ASSERT_FALSE(d.probs.empty());
      double sum = 0;
      for (size_t i = 0; i < d.probs.size(); ++i) {
        EXPECT_GT(d.probs[i].second, 0.0f);
        if (i > 0) {
          EXPECT_LT(d.probs[i - 1].first, d.probs[i].first);  // sorted by id, no repeats
        }
        sum += d.probs[i].second;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << c;
      EXPECT_GT(d.prob(t.token), 0.0f) << c;
      EXPECT_EQ(d.prob(42), 0.0f);  // blocked
      EXPECT_EQ(d.prob(2999), 0.0f);
      if (p.top_k > 0) {
        EXPECT_LE(int64_t(d.probs.size()), p.top_k);
      }
    }
  }
  // Untruncated sampling at temperature 1 without penalties: the softmax.
  std::vector<float> small = {0.0f, 1.0f, 2.0f, -1.0f};
  TokenDistribution d;
  SamplingParams p;
  sample_token(small.data(), 4, p, PenaltyState{}, {}, 0, {}, &d);
  double z = 0;
  for (float v : small) z += std::exp(double(v));
  ASSERT_EQ(d.probs.size(), 4u);
  for (int v = 0; v < 4; ++v) {
    EXPECT_NEAR(d.prob(v), std::exp(double(small[size_t(v)])) / z, 1e-6);
  }
  // top_p = 0.9 over probs ~ .51 .46 .025 .0002 keeps two tokens, renormalized.
  std::vector<float> tail = {3.0f, 2.9f, 0.0f, -5.0f};
  p.top_p = 0.9f;
  sample_token(tail.data(), 4, p, PenaltyState{}, {}, 0, {}, &d);
  ASSERT_EQ(d.probs.size(), 2u);
  EXPECT_NEAR(d.prob(0), 1.0 / (1.0 + std::exp(-0.1)), 1e-6);
}

TEST(Sampler, GreedyDistributionIsOneHot) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0;
  TokenDistribution d;
  SampledToken t = sample_token(l.data(), 4, p, PenaltyState{}, {}, 0, {1}, &d);  // 1 blocked: 3 wins
  EXPECT_EQ(t.token, 3);
  ASSERT_EQ(d.probs.size(), 1u);
  EXPECT_EQ(d.probs[0].first, 3);
  EXPECT_EQ(d.probs[0].second, 1.0f);
  EXPECT_EQ(d.prob(1), 0.0f);
}

// logit_bias (OpenAI): +100 forces a token, -100 bans one, greedy and sampled
// alike; the raw-logit logprobs are unchanged; an empty bias list samples
// exactly as before (same tokens for every seed).
TEST(Sampler, LogitBiasForcesAndBansTokens) {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i) * 1.7) * 4.0);  // in [-4, 4]
  SamplingParams greedy;
  greedy.temperature = 0;
  const int32_t argmax = draw(l, greedy).token;
  const int32_t forced = argmax == 5 ? 6 : 5;
  double z = 0;
  for (float v : l) z += std::exp(double(v));
  const double log_z = std::log(z);
  SamplingParams g = greedy;
  g.logit_bias = {{forced, 100.0f}};
  EXPECT_EQ(draw(l, g).token, forced);
  g.logit_bias = {{argmax, -100.0f}};
  EXPECT_NE(draw(l, g).token, argmax);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams p;
    p.seed = seed;
    p.top_logprobs = 2;
    const SampledToken plain = draw(l, p);
    SamplingParams empty = p;
    empty.logit_bias = {};
    EXPECT_EQ(draw(l, empty).token, plain.token);
    SamplingParams f = p;
    f.logit_bias = {{forced, 100.0f}};
    const SampledToken t = draw(l, f);
    EXPECT_EQ(t.token, forced);
    EXPECT_NEAR(t.logprob, double(l[size_t(forced)]) - log_z, 1e-5);
    EXPECT_EQ(t.top, plain.top);  // logprobs are of the raw logits
    SamplingParams b = p;
    b.logit_bias = {{argmax, -100.0f}, {plain.token, -100.0f}};
    const SampledToken banned = draw(l, b);
    EXPECT_NE(banned.token, argmax);
    EXPECT_NE(banned.token, plain.token);
    b.top_p = 0.9f;
    b.top_k = 8;
    EXPECT_NE(draw(l, b).token, plain.token);
  }
}

}  // namespace
}  // namespace dsv4
