// The synthetic long-context states `dsv4 bench --context` decodes from:
// every cached row a context of N tokens leaves, in its storage format, and
// a decode step from it that runs like any other.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "golden_util.h"
#include "model/synthetic_state.h"

namespace dsv4 {
namespace {

class SyntheticState : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticState, HoldsTheRowsOfItsContextAndDecodes) {
  auto model = Model::load(test::model_dir(GetParam()));
  const ModelConfig& c = model->config();
  const int64_t tokens = 4096;
  SequenceState s = synthetic_context_state(c, tokens, 1);
  EXPECT_EQ(s.n_tokens, tokens);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerState& layer = s.layers[size_t(l)];
    SCOPED_TRACE(std::string("layer ") + std::to_string(l) + " (" + layer.layout.name() + ")");
    EXPECT_EQ(layer.window.rows(), c.window);
    if (!layer.layout.owns_compressor(l)) continue;
    const int64_t rows = tokens / layer.layout.ratio;
    if (layer.layout.kind == LayerKind::Grouped) {
      EXPECT_EQ(layer.compressed_fp4.rows(), rows);
      EXPECT_EQ(layer.index_keys.rows(), rows);
    } else {
      EXPECT_EQ(layer.compressed.rows(), rows);
      EXPECT_EQ(layer.index_keys.rows(), layer.layout.has_indexer() ? rows : 0);
    }
  }
  // Decoding from it: finite logits, one more token, and the same bits as
  // decoding from a copy (the state is an ordinary one).
  SequenceState copy = s;
  std::vector<float> a(size_t(c.vocab_size)), b(size_t(c.vocab_size));
  const int32_t token = 7;
  model->forward(s, &token, 1, a.data());
  model->forward(copy, &token, 1, b.data());
  EXPECT_EQ(s.n_tokens, tokens + 1);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(a, b);
  EXPECT_THROW(synthetic_context_state(c, c.window - 1, 1), Error);
}

INSTANTIATE_TEST_SUITE_P(Golden, SyntheticState, ::testing::Values("tiny-flash-fp8", "tiny-v41-flash"));

}  // namespace
}  // namespace dsv4
