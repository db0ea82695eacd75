// KV compressor of CSA (ratio 4, overlapping windows) and HCA (ratio 128)
// layers, and the indexer's own compressor (architecture.md §4.3.3, §7.2).
//
// Tokens are pushed one at a time through the partial-window state, whether
// they arrive in a prefill chunk or in decode, so both paths are the same code.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "kernels/cpu/linear.h"
#include "model/layers.h"

namespace dsv4 {

CompressorProjections compressor_project(const CompressorWeights& w, const float* x, int64_t n_rows) {
  // Projections in fp32 on the unrounded input.
  const int64_t slot_width = (w.overlap ? 2 : 1) * w.width;
  CompressorProjections p;
  p.kv.resize(size_t(n_rows * slot_width));
  p.score.resize(size_t(n_rows * slot_width));
  linear_forward(w.wkv, x, n_rows, p.kv.data());
  linear_forward(w.wgate, x, n_rows, p.score.data());
  return p;
}

void compressor_push(const ModelConfig& c, const CompressorWeights& w, const RopeTable& rope,
                     bool indexer_keys, CompressorState& state, const CompressorProjections& proj,
                     int64_t row0, int64_t start, int64_t n, std::vector<float>& rows) {
  const int64_t m = w.ratio, width = w.width;
  const int64_t slot_width = (w.overlap ? 2 : 1) * width;
  const std::vector<float>& kv = proj.kv;
  const std::vector<float>& score = proj.score;
  std::vector<float> pooled(static_cast<size_t>(width));
  const int64_t candidates = w.overlap ? 2 * m : m;
  std::vector<float> weights(static_cast<size_t>(candidates));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = start + t, r = pos % m;
    const int64_t slot = w.overlap ? m + r : r;
    float* kv_slot = state.kv.data() + slot * slot_width;
    float* score_slot = state.score.data() + slot * slot_width;
    std::memcpy(kv_slot, kv.data() + (row0 + t) * slot_width, size_t(slot_width) * 4);
    const float* ape = w.ape.data() + r * slot_width;
    for (int64_t i = 0; i < slot_width; ++i) score_slot[i] = score[size_t((row0 + t) * slot_width + i)] + ape[i];
    if ((pos + 1) % m != 0) continue;

    // Window complete: softmax-pool each channel over its candidates. With
    // overlap, slots 0..m-1 hold the previous window (their first half feeds
    // this row) and slots m..2m-1 the current one (second half).
    for (int64_t ch = 0; ch < width; ++ch) {
      auto candidate = [&](int64_t s, const std::vector<float>& buf) {
        int64_t offset = (w.overlap && s >= m) ? width : 0;
        return buf[size_t(s * slot_width + offset + ch)];
      };
      float mx = -INFINITY;
      for (int64_t s = 0; s < candidates; ++s) mx = std::max(mx, candidate(s, state.score));
      float sum = 0.0f;
      for (int64_t s = 0; s < candidates; ++s)
        sum += (weights[size_t(s)] = std::exp(candidate(s, state.score) - mx));
      float acc = 0.0f;
      for (int64_t s = 0; s < candidates; ++s)
        acc += candidate(s, state.kv) * (weights[size_t(s)] / sum);
      pooled[size_t(ch)] = acc;
    }
    if (w.overlap) {
      std::memcpy(state.kv.data(), state.kv.data() + m * slot_width, size_t(m * slot_width) * 4);
      std::memcpy(state.score.data(), state.score.data() + m * slot_width, size_t(m * slot_width) * 4);
    }

    rms_norm(pooled.data(), w.norm.data(), width, c.norm_eps);
    const int64_t row_pos = pos + 1 - m;  // a row sits at its first token's position
    rope.apply(pooled.data() + width - c.rope_dim, row_pos);
    if (indexer_keys) {
      hadamard_transform(pooled.data(), width);
      fp4_round_trip(pooled.data(), width, 32);
    } else {
      fp8_round_trip(pooled.data(), width - c.rope_dim, 64);
    }
    rows.insert(rows.end(), pooled.begin(), pooled.end());
  }
}

}  // namespace dsv4
