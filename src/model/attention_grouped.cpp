// DeepSeek-V4.1 compressed attention (docs/v41.md). Layers of one ratio form
// a group: its KV source compresses (ratio 2: gated pooling of two tokens,
// ratio 1: one row per token), rounds each row to FP4 with E4M3 scales and
// derives the index keys from the unrotated row; index sources score those
// keys with their own queries (after the candidate source, only inside its
// candidate blocks) and pick the top-k; every layer of the group attends the
// latest selection over the source's rows, plus its own window. This file
// decides what each row sees; the backend computes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/layers.h"

namespace dsv4 {

namespace {

// The KV source compressor's projections of the layer's input: appended to
// `products`, which the caller runs (in one batch with the layer's other
// products of x, attention_grouped); the gate only where groups pool more
// than one token.
struct SourceProjections {
  Buffer kv, score;  // [n_rows, head_dim]
};
SourceProjections source_products(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                                  const LayerLayout& layout, const float* x, int64_t n_rows,
                                  std::vector<LinearProduct>& products) {
  const int64_t width = c.head_dim;
  SourceProjections p{kb.buffer(n_rows * width), kb.buffer(layout.ratio > 1 ? n_rows * width : 0)};
  products.push_back({&w.compressor.wkv, x, n_rows, p.kv.data()});
  if (layout.ratio > 1) products.push_back({&w.compressor.wgate, x, n_rows, p.score.data()});
  return p;
}

// The KV source's compressor, from its projections: every token of each
// segment goes through the partial group in order (prefill chunks and
// decode alike); each completed row is normed, turned into its index key,
// rotated at its group's first position and rounded into the layer's
// compressed rows.
void compress_rows(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                   const LayerLayout& layout, const std::vector<Segment>& segments, const SourceProjections& proj) {
  const int64_t m = layout.ratio, width = c.head_dim, key_width = c.index_head_dim, rd = c.rope_dim;
  const Buffer& kv = proj.kv;
  const Buffer& score = proj.score;

  std::vector<float> latents;
  std::vector<int64_t> row_position;
  std::vector<LayerState*> owner;
  std::vector<const float*> kv_of(static_cast<size_t>(m)), score_of(static_cast<size_t>(m));
  std::vector<float> pooled(static_cast<size_t>(width));
  for (const Segment& s : segments) {
    CompressorState& state = s.state->compressor;
    for (int64_t t = 0; t < s.n; ++t) {
      const int64_t pos = s.start + t;
      const float* kv_t = kv.data() + (s.row0 + t) * width;
      if (m == 1) {
        latents.insert(latents.end(), kv_t, kv_t + width);
      } else {
        const int64_t slot = pos % m;
        state.save(pos, slot * width, width);
        std::memcpy(state.kv.data() + slot * width, kv_t, size_t(width) * 4);
        std::memcpy(state.score.data() + slot * width, score.data() + (s.row0 + t) * width, size_t(width) * 4);
        if ((pos + 1) % m != 0) continue;
        for (int64_t k = 0; k < m; ++k) {
          kv_of[size_t(k)] = state.kv.data() + k * width;
          score_of[size_t(k)] = state.score.data() + k * width;
        }
        kb.softmax_pool(kv_of.data(), score_of.data(), m, width, pooled.data());
        latents.insert(latents.end(), pooled.begin(), pooled.end());
      }
      row_position.push_back(pos + 1 - m);  // a row sits at its group's first token
      owner.push_back(s.state);
    }
  }
  const int64_t rows = int64_t(owner.size());
  if (rows == 0) return;
  kb.rms_norm(latents.data(), rows, width, width, w.compressor.norm.data(), c.norm_eps);
  // Index keys come from the row before its rotation.
  Buffer keys = kb.buffer(rows * key_width);
  kb.linear(w.indexer.wk, latents.data(), rows, keys.data());
  kb.rms_norm(keys.data(), rows, key_width, key_width, w.indexer.k_norm.data(), c.norm_eps);
  kb.rope(keys.data() + key_width - rd, rows, key_width, row_position.data(), 1, rope, false);
  kb.fp4_round(keys.data(), rows, key_width, key_width, 32);
  kb.rope(latents.data() + width - rd, rows, width, row_position.data(), 1, rope, false);
  for (int64_t i = 0; i < rows; ++i) {
    owner[size_t(i)]->index_keys.append(keys.data() + i * key_width);
    owner[size_t(i)]->compressed_fp4.append_rounding(latents.data() + i * width);
  }
}

// An index source's selection for every row: its own FP4 queries against
// the group's index keys (no Hadamard in V4.1). q: the indexer's wq_b of the
// normed qr, rotated and rounded here in place.
void select_rows(const KernelBackend& kb, const ModelConfig& c, const LayerLayout& layout,
                 const std::vector<Segment>& segments, const RowMap& rows, const RopeTable& rope, GroupedShared& shared,
                 float* head_weights, float* q, int64_t n_rows) {
  const int64_t heads = c.index_n_heads, hd = c.index_head_dim;
  kb.rope(q + hd - c.rope_dim, n_rows * heads, hd, rows.position.data(), heads, rope, false);
  kb.fp4_round(q, n_rows * heads, hd, hd, 32);
  kb.scale(head_weights, n_rows * heads, 1.0f / std::sqrt(float(hd)) * (1.0f / std::sqrt(float(heads))));

  // Each row reads its sequence's keys as stored (FP4); the backend decodes.
  std::vector<Fp4RowsView> keys(static_cast<size_t>(n_rows));
  std::vector<int64_t> visible(static_cast<size_t>(n_rows));
  std::vector<const uint8_t*> allowed(static_cast<size_t>(n_rows), nullptr);
  for (int64_t r = 0; r < n_rows; ++r) {
    keys[size_t(r)] = rows.owner[size_t(r)]->sequence->layers[size_t(layout.kv_group)].index_keys.view();
    visible[size_t(r)] = layout.visible_rows(rows.position[size_t(r)]);
    if (layout.uses_candidates) allowed[size_t(r)] = shared.candidates[size_t(r)].data();
  }
  IndexerSelect problem{q,           head_weights,   n_rows,       heads,           hd,
                        keys.data(), visible.data(), c.index_topk, &shared.selected};
  if (layout.candidate_source) {
    problem.candidate_blocks = c.candidate_topk_blocks;
    problem.candidate_block_size = c.candidate_block_size;
    problem.candidates = &shared.candidates;
  }
  if (layout.uses_candidates) problem.allowed = allowed.data();
  kb.indexer_select(problem);
}

}  // namespace

void attention_grouped(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       const LayerLayout& layout, int64_t layer, const std::vector<Segment>& segments,
                       GroupedShared& shared, const float* x, int64_t n_rows, float* out) {
  const int64_t n = n_rows;
  const RowMap rows(segments, n);
  // Every product of the layer's input in one batch, as attention_forward
  // (docs/kernels.md, "Grouped products in one call"): wq_a, wkv, the KV
  // source's compressor, the index source's head weights.
  const bool source = layout.kv_group == layer, index_source = layout.index_group == layer;
  std::vector<LinearProduct> products;
  AttentionInputs in = attention_input_products(kb, c, w, x, n, products);
  Buffer head_weights = kb.buffer(index_source ? n * c.index_n_heads : 0);
  Buffer index_q = kb.buffer(index_source ? n * c.index_n_heads * c.index_head_dim : 0);
  SourceProjections proj;
  if (source) proj = source_products(kb, c, w, layout, x, n, products);
  if (index_source) products.push_back({&w.indexer.weights_proj, x, n, head_weights.data()});
  kb.linear_many(products.data(), products.size());
  finish_attention_inputs(kb, c, w, rope, rows.position.data(), n, false, in, index_source ? index_q.data() : nullptr);
  // The source writes its rows (and keys) before anyone selects or reads.
  if (source) compress_rows(kb, c, w, rope, layout, segments, proj);
  if (index_source) select_rows(kb, c, layout, segments, rows, rope, shared, head_weights.data(), index_q.data(), n);
  // Every layer of the group attends the latest selection over its KV
  // source's rows.
  attend_rows(kb, c, w, rope, layout, segments, rows, &shared.selected,
              {[&](const Segment& s, const int64_t* ids, int64_t count, float* dst) {
                 const auto& rows = s.sequence->layers[size_t(layout.kv_group)].compressed_fp4;
                 for (int64_t k = 0; k < count; ++k) rows.decode(ids[k], dst + k * c.head_dim);
               },
               nullptr},
              in.queries.q.data(), in.kv.data(), out);
}

void grouped_compress(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                      const LayerLayout& layout, const std::vector<Segment>& segments, const float* x, int64_t n_rows) {
  std::vector<LinearProduct> products;
  const SourceProjections proj = source_products(kb, c, w, layout, x, n_rows, products);
  kb.linear_many(products.data(), products.size());
  compress_rows(kb, c, w, rope, layout, segments, proj);
}

}  // namespace dsv4
