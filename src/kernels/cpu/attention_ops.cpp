// Attention cores on the CPU: sink attention over gathered keys, the
// lightning indexer's scoring and top-k, and the compressor's gated pooling.
// Work is split over (row, block of heads) or rows only; each output element
// has one fixed order of operations, so the split never changes a bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4::cpu {

void sink_attention(KernelIsa isa, const SinkAttention& a) {
  const int64_t H = a.heads, hd = a.dim;
  int64_t work = 0;
  for (int64_t r = 0; r < a.rows; ++r) work += 2 * H * hd * (a.key_begin[r + 1] - a.key_begin[r]);
  // Work items: a row and a block of heads, which share the row's keys (the
  // blocked kernels load each key once for up to 16 heads).
  const int64_t head_block = std::min<int64_t>(H, 16), blocks = (H + head_block - 1) / head_block;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(work))
  for (int64_t item = 0; item < a.rows * blocks; ++item) {
    const int64_t t = item / blocks, h0 = item % blocks * head_block, heads = std::min(head_block, H - h0);
    const float* const* keys = a.keys + a.key_begin[t];
    const int64_t n_keys = a.key_begin[t + 1] - a.key_begin[t];
    // Scores, then per head the softmax with the sink, as probabilities.
    std::vector<float> probs(size_t(heads * n_keys));
    dot_fixed_rows(a.q + (t * H + h0) * hd, heads, keys, n_keys, hd, probs.data(), isa);
    for (int64_t h = 0; h < heads; ++h) {
      float* logits = probs.data() + h * n_keys;
      const float sink = a.sink[h0 + h];
      float mx = sink;
      for (int64_t j = 0; j < n_keys; ++j) mx = std::max(mx, logits[j] *= a.scale);
      float denom = 0.0f;
      for (int64_t j = 0; j < n_keys; ++j) denom += (logits[j] = std::exp(logits[j] - mx));
      denom += std::exp(sink - mx);
      for (int64_t j = 0; j < n_keys; ++j) logits[j] /= denom;
    }
    float* oh = a.out + (t * H + h0) * hd;
    std::fill(oh, oh + heads * hd, 0.0f);
    add_scaled_rows(oh, heads, probs.data(), keys, n_keys, hd, isa);
  }
}

void indexer_select(KernelIsa isa, const IndexerSelect& p) {
  const int64_t heads = p.heads, hd = p.dim;
  int64_t work = 0;
  for (int64_t r = 0; r < p.rows; ++r) work += p.visible[r] * heads * hd;
  p.selected->assign(size_t(p.rows), {});
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(work))
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t visible = p.visible[r];
    const float* keys = p.keys[r];
    std::vector<const float*> rows_of_keys(static_cast<size_t>(visible));
    for (int64_t i = 0; i < visible; ++i) rows_of_keys[size_t(i)] = keys + i * hd;
    std::vector<float> dots(size_t(heads * visible)), scores(static_cast<size_t>(visible));
    dot_fixed_rows(p.q + r * heads * hd, heads, rows_of_keys.data(), visible, hd, dots.data(), isa);
    const float* weights = p.head_weights + r * heads;
    for (int64_t i = 0; i < visible; ++i) {
      float s = 0.0f;
      for (int64_t h = 0; h < heads; ++h) s += std::max(dots[size_t(h * visible + i)], 0.0f) * weights[h];
      scores[size_t(i)] = s;
    }
    (*p.selected)[size_t(r)] = top_k_indices(scores.data(), visible, p.top_k);
  }
}

void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width, float* out) {
  std::vector<float> weights(static_cast<size_t>(candidates));
  for (int64_t ch = 0; ch < width; ++ch) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < candidates; ++s) mx = std::max(mx, score[s][ch]);
    float sum = 0.0f;
    for (int64_t s = 0; s < candidates; ++s) sum += (weights[size_t(s)] = std::exp(score[s][ch] - mx));
    float acc = 0.0f;
    for (int64_t s = 0; s < candidates; ++s) acc += kv[s][ch] * (weights[size_t(s)] / sum);
    out[ch] = acc;
  }
}

}  // namespace dsv4::cpu
