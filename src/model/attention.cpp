// DeepSeek-V4 attention (architecture.md §4.3): low-rank query with per-head
// norm, one shared 512-wide K=V latent per position, a 128-token raw window,
// compressed rows (all of them for HCA, the indexer's top-k for CSA), a
// per-head sink in the softmax denominator, inverse RoPE on the output and a
// grouped low-rank output projection.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "core/scratch.h"
#include "core/threads.h"
#include "kernels/cpu/linear.h"
#include "model/layers.h"
#include "model/model.h"

namespace dsv4 {

namespace {

// Which sequence and position each row of a batch belongs to.
struct RowMap {
  std::vector<int64_t> position;
  std::vector<const Segment*> owner;
  RowMap(const std::vector<Segment>& segments, int64_t n_rows)
      : position(static_cast<size_t>(n_rows)), owner(static_cast<size_t>(n_rows)) {
    for (const Segment& s : segments)
      for (int64_t t = 0; t < s.n; ++t) {
        position[size_t(s.row0 + t)] = s.start + t;
        owner[size_t(s.row0 + t)] = &s;
      }
  }
};

// Multiply-adds of the indexer's scoring: every row scores the compressed
// rows its position can see, with all heads.
int64_t indexer_scoring_work(const RowMap& rows, int64_t head_widths) {
  int64_t visible = 0;
  for (int64_t p : rows.position) visible += (p + 1) / 4;
  return visible * head_widths;
}

// Multiply-adds of the rows' attention (the count `dsv4 bench` uses).
int64_t attention_work(const RowMap& rows, int64_t ratio, const ModelConfig& c) {
  int64_t macs = 0;
  for (int64_t p : rows.position) macs += Model::attention_macs(c, ratio, p);
  return macs;
}

// Lightning indexer: for every row, the compressed rows its query attends
// to (ascending ids). Projections run over the whole batch; scoring per
// sequence against that sequence's index keys.
std::vector<std::vector<int32_t>> indexer_select(const ModelConfig& c, const IndexerWeights& w,
                                                 const RopeTable& rope,
                                                 const std::vector<Segment>& segments, const RowMap& rows,
                                                 const float* x, const float* qr, int64_t n_rows) {
  const int64_t heads = c.index_n_heads, hd = c.index_head_dim;
  ScratchArray<float> q(n_rows * heads * hd), head_weights(n_rows * heads);
  linear_forward(w.wq_b, qr, n_rows, q.data());
  linear_forward(w.weights_proj, x, n_rows, head_weights.data());
  const std::vector<int64_t>& position = rows.position;
  const std::vector<const Segment*>& owner = rows.owner;
  const float weight_scale = 1.0f / std::sqrt(float(hd)) * (1.0f / std::sqrt(float(heads)));
#pragma omp parallel for schedule(static) num_threads(threads_for(n_rows * heads * hd * 8))
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      float* qh = q.data() + (r * heads + h) * hd;
      rope.apply(qh + hd - c.rope_dim, position[size_t(r)]);
      hadamard_transform(qh, hd);
      fp4_round_trip(qh, hd, 32);
    }
    for (int64_t h = 0; h < heads; ++h) head_weights[r * heads + h] *= weight_scale;
  }
  CompressorProjections proj = compressor_project(w.compressor, x, n_rows);
  for (const Segment& s : segments)
    compressor_push(c, w.compressor, rope, true, s.state->index_compressor, proj, s.row0, s.start,
                    s.n, s.state->index_keys);

  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(n_rows));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(indexer_scoring_work(rows, heads * hd)))
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t visible = (position[size_t(r)] + 1) / 4;
    const float* keys = owner[size_t(r)]->state->index_keys.data();
    std::vector<const float*> rows_of_keys(static_cast<size_t>(visible));
    for (int64_t i = 0; i < visible; ++i) rows_of_keys[size_t(i)] = keys + i * hd;
    std::vector<float> dots(size_t(heads * visible)), scores(static_cast<size_t>(visible));
    dot_fixed_rows(q.data() + r * heads * hd, heads, rows_of_keys.data(), visible, hd, dots.data());
    for (int64_t i = 0; i < visible; ++i) {
      float s = 0.0f;
      for (int64_t h = 0; h < heads; ++h)
        s += std::max(dots[size_t(h * visible + i)], 0.0f) * head_weights[size_t(r * heads + h)];
      scores[size_t(i)] = s;
    }
    selected[size_t(r)] = top_k_indices(scores.data(), visible, c.index_topk);
  }
  return selected;
}

}  // namespace

void attention_forward(const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       int64_t ratio, const std::vector<Segment>& segments, const float* x,
                       int64_t n_rows, float* out) {
  const int64_t H = c.n_heads, hd = c.head_dim, rd = c.rope_dim, nope = hd - rd;
  const int64_t win = c.window, n = n_rows;
  const RowMap rows(segments, n);
  const std::vector<int64_t>& position = rows.position;
  const std::vector<const Segment*>& owner = rows.owner;

  // Query path; qr is shared with the indexer.
  ScratchArray<float> qr(n * c.q_lora_rank), q(n * H * hd);
  linear_forward(w.wq_a, x, n, qr.data());
  for (int64_t t = 0; t < n; ++t) rms_norm(qr.data() + t * c.q_lora_rank, w.q_norm.data(), c.q_lora_rank, c.norm_eps);
  linear_forward(w.wq_b, qr.data(), n, q.data());
  // Window rows of this batch.
  ScratchArray<float> kv(n * hd);
  linear_forward(w.wkv, x, n, kv.data());
#pragma omp parallel for schedule(static) num_threads(threads_for(n * (H + 1) * hd * 4))
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q.data() + (t * H + h) * hd;
      rms_norm(qh, nullptr, hd, c.norm_eps);
      rope.apply(qh + nope, position[size_t(t)]);
    }
    float* row = kv.data() + t * hd;
    rms_norm(row, w.kv_norm.data(), hd, c.norm_eps);
    rope.apply(row + nope, position[size_t(t)]);
    fp8_round_trip(row, nope, 64);
  }

  std::vector<std::vector<int32_t>> selected;
  if (w.has_indexer) selected = indexer_select(c, w.indexer, rope, segments, rows, x, qr.data(), n);
  if (w.has_compressor) {
    CompressorProjections proj = compressor_project(w.compressor, x, n);
    for (const Segment& s : segments)
      compressor_push(c, w.compressor, rope, false, s.state->compressor, proj, s.row0, s.start, s.n,
                      s.state->compressed);
  }

  // Sink attention. Keys are visited in a fixed order (compressed rows by id,
  // then window rows by position) so the result is independent of chunking
  // and batching.
  ScratchArray<float> o(n * H * hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  // Work items: a token and a block of heads, which share the token's keys.
  const int64_t head_block = std::min<int64_t>(H, 16), blocks = (H + head_block - 1) / head_block;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(attention_work(rows, ratio, c)))
  for (int64_t item = 0; item < n * blocks; ++item) {
    const int64_t t = item / blocks, h0 = item % blocks * head_block, heads = std::min(head_block, H - h0);
    const int64_t pos = position[size_t(t)];
    const Segment& seg = *owner[size_t(t)];
    const LayerState& state = *seg.state;
    std::vector<const float*> keys;
    if (ratio > 0) {
      const int64_t visible = (pos + 1) / ratio;
      if (w.has_indexer) {
        for (int32_t i : selected[size_t(t)]) keys.push_back(state.compressed.data() + int64_t(i) * hd);
      } else {
        for (int64_t i = 0; i < visible; ++i) keys.push_back(state.compressed.data() + i * hd);
      }
    }
    for (int64_t p = std::max<int64_t>(0, pos - win + 1); p <= pos; ++p)
      keys.push_back(p >= seg.start ? kv.data() + (seg.row0 + p - seg.start) * hd
                                    : state.window.data() + (p % win) * hd);
    const int64_t n_keys = int64_t(keys.size());

    // Scores, then per head the softmax with the sink, as probabilities.
    std::vector<float> probs(size_t(heads * n_keys));
    dot_fixed_rows(q.data() + (t * H + h0) * hd, heads, keys.data(), n_keys, hd, probs.data());
    for (int64_t h = 0; h < heads; ++h) {
      float* logits = probs.data() + h * n_keys;
      const float sink = w.sink[size_t(h0 + h)];
      float mx = sink;
      for (int64_t j = 0; j < n_keys; ++j) mx = std::max(mx, logits[j] *= scale);
      float denom = 0.0f;
      for (int64_t j = 0; j < n_keys; ++j) denom += (logits[j] = std::exp(logits[j] - mx));
      denom += std::exp(sink - mx);
      for (int64_t j = 0; j < n_keys; ++j) logits[j] /= denom;
    }
    float* oh = o.data() + (t * H + h0) * hd;
    std::fill(oh, oh + heads * hd, 0.0f);
    add_scaled_rows(oh, heads, probs.data(), keys.data(), n_keys, hd);
    for (int64_t h = 0; h < heads; ++h) rope.apply(oh + h * hd + nope, pos, /*inverse=*/true);
  }

  // The ring keeps the last `win` window rows of each sequence.
  for (const Segment& s : segments)
    for (int64_t t = std::max<int64_t>(0, s.n - win); t < s.n; ++t)
      std::memcpy(s.state->window.data() + ((s.start + t) % win) * hd, kv.data() + (s.row0 + t) * hd,
                  size_t(hd) * 4);

  // Grouped low-rank output: group g of heads goes through rows
  // [g*R, (g+1)*R) of wo_a; the concatenation goes through wo_b.
  const int64_t G = c.o_groups, R = c.o_lora_rank, group_width = H * hd / G;
  ScratchArray<float> z(n * G * R), group_in(n * group_width);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(group_in.data() + t * group_width, o.data() + t * H * hd + g * group_width,
                  size_t(group_width) * 4);
    linear_forward(w.wo_a, group_in.data(), n, z.data() + g * R, g * R, (g + 1) * R, G * R);
  }
  linear_forward(w.wo_b, z.data(), n, out);
}

}  // namespace dsv4
