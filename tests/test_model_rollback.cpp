// Rollback of a decode state (what speculative verification needs): a state
// that went k tokens past a checkpoint and is rolled back to any position in
// between continues with the very bits of a run that never went further, and
// its snapshot is byte-equal to that run's state. Random checkpoints, draft
// lengths (up to the 128-token window), acceptance points and chunkings, on
// every golden model, main model and MTP block.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "golden_util.h"

namespace dsv4::test {
namespace {

struct Feeder {
  const Model& model;
  const std::vector<int32_t>& tokens;
  int64_t V, W;
  // Feeds tokens [b, b + len) to the main model and the MTP block;
  // logits rows land at b in `logits` / `mtp` when given.
  void feed(SequenceState& s, int64_t b, int64_t len, float* logits, float* mtp) const {
    std::vector<float> l(size_t(len * V)), hc(size_t(len * W));
    model.forward(s, tokens.data() + b, len, l.data(), hc.data());
    if (logits) std::copy(l.begin(), l.end(), logits + b * V);
    const int64_t m = std::min(len, int64_t(tokens.size()) - 1 - b);
    if (m > 0) {
      std::vector<float> ml(size_t(m * V));
      model.forward_mtp(s, hc.data(), tokens.data() + b + 1, m, ml.data());
      if (mtp) std::copy(ml.begin(), ml.end(), mtp + b * V);
    }
  }
  void feed_chunked(SequenceState& s, int64_t b, int64_t e, int64_t chunk) const {
    for (int64_t p = b; p < e; p += chunk) feed(s, p, std::min(chunk, e - p), nullptr, nullptr);
  }
};

class Rollback : public ::testing::TestWithParam<std::string> {};

TEST_P(Rollback, RollbackGivesTheBitsOfARunThatStopped) {
  auto model = Model::load(model_dir(GetParam()));
  TensorStore golden = TensorStore::open(model_dir(GetParam()) + "/golden.safetensors");
  std::vector<int32_t> tokens = read_i32(golden, "tokens");
  for (int32_t t : read_i32(golden, "decode_tokens")) tokens.push_back(t);
  const int64_t N = int64_t(tokens.size()), V = model->config().vocab_size;
  const int64_t W = model->config().hc_mult * model->config().dim;
  ASSERT_GT(N, 160);
  const Feeder f{*model, tokens, V, W};
  const RunResult reference = run_schedule(*model, tokens, N, N, true);

  std::mt19937 rng(1234);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t P = std::uniform_int_distribution<int64_t>(1, N - 140)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 128)(rng);
    const int64_t j = std::uniform_int_distribution<int64_t>(0, k)(rng);
    const int64_t chunk = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    const bool draft_one_by_one = trial % 2 == 1;
    SCOPED_TRACE("checkpoint " + std::to_string(P) + ", " + std::to_string(k) + " drafted, " + std::to_string(j) +
                 " kept, chunk " + std::to_string(chunk));

    SequenceState a = model->new_state();
    f.feed_chunked(a, 0, P, chunk);
    a.checkpoint();
    if (draft_one_by_one)
      f.feed_chunked(a, P, P + k, 1);
    else
      f.feed(a, P, k, nullptr, nullptr);
    a.rollback(P + j);
    a.end_checkpoint();

    SequenceState b = model->new_state();
    f.feed_chunked(b, 0, P + j, 7);
    EXPECT_EQ(a.n_tokens, b.n_tokens);
    EXPECT_EQ(a.mtp_tokens, b.mtp_tokens);
    EXPECT_TRUE(a.snapshot() == b.snapshot()) << "states differ after the rollback";

    // Continue to the end one token at a time: the reference's bits.
    std::vector<float> logits(size_t(N * V)), mtp(size_t(N * V));
    const int64_t end = std::min(N, P + j + 24);
    for (int64_t p = P + j; p < end; ++p) f.feed(a, p, 1, logits.data(), mtp.data());
    EXPECT_EQ(0, std::memcmp(logits.data() + (P + j) * V, reference.logits.data() + (P + j) * V,
                             size_t((end - P - j) * V) * 4));
    const int64_t mtp_end = std::min(end, N - 1);
    EXPECT_EQ(0, std::memcmp(mtp.data() + (P + j) * V, reference.mtp_logits.data() + (P + j) * V,
                             size_t((mtp_end - P - j) * V) * 4));
  }
}

TEST_P(Rollback, RefusesPositionsOutsideTheCheckpoint) {
  auto model = Model::load(model_dir(GetParam()));
  TensorStore golden = TensorStore::open(model_dir(GetParam()) + "/golden.safetensors");
  std::vector<int32_t> tokens = read_i32(golden, "tokens");
  SequenceState s = model->new_state();
  std::vector<float> logits(size_t(20 * model->config().vocab_size));
  EXPECT_THROW(s.rollback(0), Error);
  model->forward(s, tokens.data(), 10, logits.data());
  s.checkpoint();
  model->forward(s, tokens.data() + 10, 5, logits.data());
  EXPECT_THROW(s.rollback(9), Error);
  EXPECT_THROW(s.rollback(16), Error);
  s.rollback(12);
  EXPECT_EQ(s.n_tokens, 12);
}

INSTANTIATE_TEST_SUITE_P(Golden, Rollback, ::testing::Values("tiny-flash-bf16", "tiny-flash-fp8", "tiny-pro-fp8"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace dsv4::test
