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
  for (int64_t step = 0; step < 20; ++step) EXPECT_EQ(draw(l, p, step).token, draw(l, p, step).token);
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
  for (int v = 0; v < 4; ++v) EXPECT_NEAR(counts[size_t(v)] / double(trials), std::exp(double(l[size_t(v)])) / z, 0.015);
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

}  // namespace
}  // namespace dsv4
