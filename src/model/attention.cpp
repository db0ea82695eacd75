// DeepSeek-V4 attention (docs/architecture.md): low-rank query with per-head
// norm, one shared 512-wide K=V latent per position, a 128-token raw window,
// compressed rows (all of them for HCA, the indexer's top-k for CSA), a
// per-head sink in the softmax denominator, inverse RoPE on the output and a
// grouped low-rank output projection. This file gathers which keys each row
// sees; the backend computes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/layers.h"

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

// Lightning indexer: for every row, the compressed rows its query attends
// to (ascending ids). Projections run over the whole batch; scoring per
// sequence against that sequence's index keys.
std::vector<std::vector<int32_t>> indexer_select(const KernelBackend& kb, const ModelConfig& c,
                                                 const IndexerWeights& w, const RopeTable& rope,
                                                 const LayerLayout& layout, const std::vector<Segment>& segments,
                                                 const RowMap& rows, const float* x, const float* qr,
                                                 int64_t n_rows) {
  const int64_t heads = c.index_n_heads, hd = c.index_head_dim;
  Buffer q = kb.buffer(n_rows * heads * hd), head_weights = kb.buffer(n_rows * heads);
  kb.linear(w.wq_b, qr, n_rows, q.data());
  kb.linear(w.weights_proj, x, n_rows, head_weights.data());
  kb.rope(q.data() + hd - c.rope_dim, n_rows * heads, hd, rows.position.data(), heads, rope, false);
  kb.hadamard(q.data(), n_rows * heads, hd, hd);
  kb.fp4_round(q.data(), n_rows * heads, hd, hd, 32);
  kb.scale(head_weights.data(), n_rows * heads, 1.0f / std::sqrt(float(hd)) * (1.0f / std::sqrt(float(heads))));
  CompressorProjections proj = compressor_project(kb, w.compressor, x, n_rows);
  for (const Segment& s : segments)
    compressor_push(kb, c, w.compressor, rope, true, s.state->index_compressor, proj, s.row0, s.start, s.n,
                    s.state->index_keys);

  std::vector<const float*> keys(static_cast<size_t>(n_rows));
  std::vector<int64_t> visible(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    keys[size_t(r)] = rows.owner[size_t(r)]->state->index_keys.data();
    visible[size_t(r)] = layout.visible_rows(rows.position[size_t(r)]);
  }
  std::vector<std::vector<int32_t>> selected;
  kb.indexer_select({q.data(), head_weights.data(), n_rows, heads, hd, keys.data(), visible.data(), c.index_topk,
                     &selected});
  return selected;
}

}  // namespace

void attention_forward(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                       const RopeTable& rope, const LayerLayout& layout, const std::vector<Segment>& segments,
                       const float* x, int64_t n_rows, float* out) {
  const int64_t H = c.n_heads, hd = c.head_dim, rd = c.rope_dim, nope = hd - rd;
  const int64_t win = c.window, n = n_rows;
  const RowMap rows(segments, n);
  const std::vector<int64_t>& position = rows.position;

  // Query path; qr is shared with the indexer.
  Buffer qr = kb.buffer(n * c.q_lora_rank), q = kb.buffer(n * H * hd);
  kb.linear(w.wq_a, x, n, qr.data());
  kb.rms_norm(qr.data(), n, c.q_lora_rank, c.q_lora_rank, w.q_norm.data(), c.norm_eps);
  kb.linear(w.wq_b, qr.data(), n, q.data());
  kb.rms_norm(q.data(), n * H, hd, hd, nullptr, c.norm_eps);
  kb.rope(q.data() + nope, n * H, hd, position.data(), H, rope, false);
  // Window rows of this batch, rounded as the reference caches them.
  Buffer kv = kb.buffer(n * hd);
  kb.linear(w.wkv, x, n, kv.data());
  kb.rms_norm(kv.data(), n, hd, hd, w.kv_norm.data(), c.norm_eps);
  kb.rope(kv.data() + nope, n, hd, position.data(), 1, rope, false);
  kb.fp8_round(kv.data(), n, nope, hd, 64);

  std::vector<std::vector<int32_t>> selected;
  if (layout.has_indexer())
    selected = indexer_select(kb, c, w.indexer, rope, layout, segments, rows, x, qr.data(), n);
  if (layout.compresses()) {
    CompressorProjections proj = compressor_project(kb, w.compressor, x, n);
    for (const Segment& s : segments)
      compressor_push(kb, c, w.compressor, rope, false, s.state->compressor, proj, s.row0, s.start, s.n,
                      s.state->compressed);
  }

  // Keys of every row, in a fixed order (compressed rows by id, then window
  // rows by position), so that the result is independent of chunking and
  // batching.
  std::vector<const float*> keys;
  std::vector<int64_t> key_begin(static_cast<size_t>(n + 1));
  for (int64_t t = 0; t < n; ++t) {
    key_begin[size_t(t)] = int64_t(keys.size());
    const int64_t pos = position[size_t(t)];
    const Segment& seg = *rows.owner[size_t(t)];
    const LayerState& state = *seg.state;
    if (layout.has_indexer()) {
      for (int32_t i : selected[size_t(t)]) keys.push_back(state.compressed.data() + int64_t(i) * hd);
    } else {
      for (int64_t i = 0; i < layout.visible_rows(pos); ++i) keys.push_back(state.compressed.data() + i * hd);
    }
    for (int64_t p = std::max<int64_t>(0, pos - win + 1); p <= pos; ++p)
      keys.push_back(p >= seg.start ? kv.data() + (seg.row0 + p - seg.start) * hd
                                    : state.window.data() + (p % win) * hd);
  }
  key_begin[size_t(n)] = int64_t(keys.size());
  Buffer o = kb.buffer(n * H * hd);
  kb.sink_attention({q.data(), n, H, hd, keys.data(), key_begin.data(), w.sink.data(),
                     1.0f / std::sqrt(float(hd)), o.data()});
  kb.rope(o.data() + nope, n * H, hd, position.data(), H, rope, /*inverse=*/true);

  // The ring keeps the last `win` window rows of each sequence.
  for (const Segment& s : segments)
    for (int64_t t = std::max<int64_t>(0, s.n - win); t < s.n; ++t)
      std::memcpy(s.state->window.data() + ((s.start + t) % win) * hd, kv.data() + (s.row0 + t) * hd,
                  size_t(hd) * 4);

  // Grouped low-rank output: group g of heads goes through rows
  // [g*R, (g+1)*R) of wo_a; the concatenation goes through wo_b.
  const int64_t G = c.o_groups, R = c.o_lora_rank, group_width = H * hd / G;
  Buffer z = kb.buffer(n * G * R), group_in = kb.buffer(n * group_width);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(group_in.data() + t * group_width, o.data() + t * H * hd + g * group_width,
                  size_t(group_width) * 4);
    kb.linear(w.wo_a, group_in.data(), n, z.data() + g * R, g * R, (g + 1) * R, G * R);
  }
  kb.linear(w.wo_b, z.data(), n, out);
}

}  // namespace dsv4
