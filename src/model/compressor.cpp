// KV compressor of CSA (ratio 4, overlapping windows) and HCA (ratio 128)
// layers, and the indexer's own compressor (docs/architecture.md).
//
// Tokens are pushed one at a time through the partial-window state, whether
// they arrive in a prefill chunk or in decode, so both paths are the same code.
#include <cmath>
#include <cstring>
#include <vector>

#include "model/layers.h"

namespace dsv4 {

void compressor_products(const CompressorWeights& w, const float* x, int64_t n_rows, CompressorProjections& p,
                         std::vector<LinearProduct>& products) {
  // Projections in fp32 on the unrounded input.
  const int64_t slot_width = (w.overlap ? 2 : 1) * w.width;
  p.kv.resize(size_t(n_rows * slot_width));
  p.score.resize(size_t(n_rows * slot_width));
  products.push_back({&w.wkv, x, n_rows, p.kv.data()});
  products.push_back({&w.wgate, x, n_rows, p.score.data()});
}

void compressor_push(const KernelBackend& kb, const ModelConfig& c, const CompressorWeights& w, const RopeTable& rope,
                     bool indexer_keys, LayerState& layer, const CompressorProjections& proj, int64_t row0,
                     int64_t start, int64_t n) {
  CompressorState& state = indexer_keys ? layer.index_compressor : layer.compressor;
  const int64_t m = w.ratio, width = w.width;
  const int64_t slot_width = (w.overlap ? 2 : 1) * width;
  const std::vector<float>& kv = proj.kv;
  const std::vector<float>& score = proj.score;
  std::vector<float> pooled(static_cast<size_t>(width));
  const int64_t candidates = w.overlap ? 2 * m : m;
  std::vector<const float*> kv_of(static_cast<size_t>(candidates)), score_of(static_cast<size_t>(candidates));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = start + t, r = pos % m;
    const int64_t slot = w.overlap ? m + r : r;
    state.save(pos, slot * slot_width, slot_width);
    float* kv_slot = state.kv.data() + slot * slot_width;
    float* score_slot = state.score.data() + slot * slot_width;
    std::memcpy(kv_slot, kv.data() + (row0 + t) * slot_width, size_t(slot_width) * 4);
    const float* ape = w.ape.data() + r * slot_width;
    for (int64_t i = 0; i < slot_width; ++i) score_slot[i] = score[size_t((row0 + t) * slot_width + i)] + ape[i];
    if ((pos + 1) % m != 0) continue;

    // Window complete: softmax-pool each channel over its candidates. With
    // overlap, slots 0..m-1 hold the previous window (their first half feeds
    // this row) and slots m..2m-1 the current one (second half).
    for (int64_t s = 0; s < candidates; ++s) {
      const int64_t offset = (w.overlap && s >= m) ? width : 0;
      kv_of[size_t(s)] = state.kv.data() + s * slot_width + offset;
      score_of[size_t(s)] = state.score.data() + s * slot_width + offset;
    }
    kb.softmax_pool(kv_of.data(), score_of.data(), candidates, width, pooled.data());
    if (w.overlap) {
      state.save(pos, 0, m * slot_width);
      std::memcpy(state.kv.data(), state.kv.data() + m * slot_width, size_t(m * slot_width) * 4);
      std::memcpy(state.score.data(), state.score.data() + m * slot_width, size_t(m * slot_width) * 4);
    }

    kb.rms_norm(pooled.data(), 1, width, width, w.norm.data(), c.norm_eps);
    const int64_t row_pos = pos + 1 - m;  // a row sits at its first token's position
    kb.rope(pooled.data() + width - c.rope_dim, 1, width, &row_pos, 1, rope, false);
    if (indexer_keys) {
      kb.hadamard(pooled.data(), 1, width, width);
      kb.fp4_round(pooled.data(), 1, width, width, 32);
    } else {
      kb.fp8_round(pooled.data(), 1, width - c.rope_dim, width, 64);
    }
    if (indexer_keys)
      layer.index_keys.append(pooled.data());
    else
      layer.compressed.append(pooled.data());
  }
}

}  // namespace dsv4
