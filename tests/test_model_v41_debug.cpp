// DeepSeek-V4.1 intermediate states against the reference's debug tensors
// of the tiny-v41-flash case: Engram row ids, the residual after each
// Engram add and after each block, the window rows, the groups' compressed
// rows and index keys. They localise a failure before it reaches the logits.
#include <gtest/gtest.h>

#include "golden_util.h"

namespace dsv4::test {
namespace {

const char* kCase = "tiny-v41-flash";

double relative_max_diff(const float* a, const float* b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return m > 0 ? d / m : d;
}

TEST(V41Debug, EngramRowIdsMatchReference) {
  auto model = Model::load(model_dir(kCase));
  TensorStore g = TensorStore::open(model_dir(kCase) + "/golden.safetensors");
  const std::vector<int32_t> tokens = read_i32(g, "tokens"), ref = read_i32(g, "debug.engram_hash_ids");
  const EngramHasher& hasher = model->engram_hasher();
  const int64_t T = int64_t(tokens.size()), cols = hasher.columns(), layers = 2;
  ASSERT_EQ(int64_t(ref.size()), T * layers * cols);
  for (int64_t slot = 0; slot < layers; ++slot) {
    // Hashed in two pieces: the history of the first piece carries over.
    std::vector<int64_t> ids(size_t(T * cols));
    const std::vector<int32_t> history(tokens.begin(), tokens.begin() + 100);
    hasher.hash(slot, {}, tokens.data(), 100, ids.data());
    hasher.hash(slot, history, tokens.data() + 100, T - 100, ids.data() + 100 * cols);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < cols; ++k)
        ASSERT_EQ(ids[size_t(t * cols + k)], ref[size_t((t * layers + slot) * cols + k)])
            << "position " << t << " layer slot " << slot << " column " << k;
  }
}

TEST(V41Debug, StatesAndCachesMatchReference) {
  const double tol = 1e-4;
  auto model = Model::load(model_dir(kCase));
  TensorStore g = TensorStore::open(model_dir(kCase) + "/golden.safetensors");
  const std::vector<int32_t> tokens = read_i32(g, "tokens"), positions = read_i32(g, "debug.positions");
  const std::vector<float> hc = read_f32(g, "debug.hc_states");
  const ModelConfig& c = model->config();
  const int64_t W = c.hc_mult * c.dim, P = int64_t(positions.size()), T = int64_t(tokens.size());
  int64_t checked = 0;
  auto check_positions = [&](const float* x, int64_t start, int64_t n, const float* ref, const std::string& what) {
    for (int64_t p = 0; p < P; ++p) {
      const int64_t pos = positions[size_t(p)];
      if (pos < start || pos >= start + n) continue;
      EXPECT_LE(relative_max_diff(x + (pos - start) * W, ref + p * W, W), tol) << what << " position " << pos;
      ++checked;
    }
  };
  model->set_hc_observer([&](int64_t index, const float* x, int64_t start, int64_t n) {
    check_positions(x, start, n, hc.data() + index * P * W, "hc state " + std::to_string(index));
  });
  model->set_engram_observer([&](int64_t layer, const float* x, int64_t start, int64_t n) {
    const std::string name = "debug.layer" + std::to_string(layer) + ".engram_out";
    const std::vector<float> ref = read_f32(g, name);
    check_positions(x, start, n, ref.data(), name);
  });
  SequenceState state = model->new_state();
  std::vector<float> logits(size_t(T * c.vocab_size));
  model->forward(state, tokens.data(), T, logits.data());
  EXPECT_EQ(checked, (c.n_layers + 1 + int64_t(c.engram_layer_ids.size())) * P);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerState& s = state.layers[size_t(l)];
    const std::string prefix = "debug.layer" + std::to_string(l) + ".";
    const std::vector<float> kv_last = read_f32(g, prefix + "kv_row_last");
    std::vector<float> row(size_t(c.head_dim));
    s.window.decode((T - 1) % c.window, row.data());
    EXPECT_LE(relative_max_diff(row.data(), kv_last.data(), c.head_dim), tol) << prefix << "kv_row_last";
    if (model->layouts()[size_t(l)].kv_group != l) continue;
    const std::vector<float> rows = read_f32(g, prefix + "compressed_kv_tail");
    const std::vector<float> keys = read_f32(g, prefix + "index_keys_tail");
    const int64_t count = T / model->layouts()[size_t(l)].ratio;
    ASSERT_EQ(s.compressed_fp4.rows(), count) << prefix;
    ASSERT_EQ(s.index_keys.rows(), count) << prefix;
    for (int64_t i = 0; i < 8; ++i) {
      s.compressed_fp4.decode(count - 8 + i, row.data());
      EXPECT_LE(relative_max_diff(row.data(), rows.data() + i * c.head_dim, c.head_dim), tol)
          << prefix << "compressed_kv_tail row " << i;
      std::vector<float> key(size_t(c.index_head_dim));
      s.index_keys.decode(count - 8 + i, key.data());
      EXPECT_LE(relative_max_diff(key.data(), keys.data() + i * c.index_head_dim, c.index_head_dim), tol)
          << prefix << "index_keys_tail row " << i;
    }
  }
}

}  // namespace
}  // namespace dsv4::test
