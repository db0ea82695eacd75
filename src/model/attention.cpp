// DeepSeek-V4 attention (docs/architecture.md): low-rank query with per-head
// norm, one shared 512-wide K=V latent per position, a 128-token raw window,
// compressed rows (all of them for HCA, the indexer's top-k for CSA), a
// per-head sink in the softmax denominator, inverse RoPE on the output and a
// grouped low-rank output projection. This file gathers which keys each row
// sees; the backend computes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/layers.h"

namespace dsv4 {

RowMap::RowMap(const std::vector<Segment>& segments, int64_t n_rows)
    : position(static_cast<size_t>(n_rows)), owner(static_cast<size_t>(n_rows)) {
  for (const Segment& s : segments)
    for (int64_t t = 0; t < s.n; ++t) {
      position[size_t(s.row0 + t)] = s.start + t;
      owner[size_t(s.row0 + t)] = &s;
    }
}

namespace {

// The most rows of one sequence in a step whose compressed rows go to the
// attention as stored (attend_rows): decode steps, and verify steps of up
// to 16 draft tokens. Each row decodes its keys twice (about an eighth of
// the attention's time at 1M tokens on AMD Zen 5); a longer chunk shares
// its keys between more rows and decodes them once.
constexpr int64_t kStoredRowsMaxChunk = 16;

// Lightning indexer: for every row, the compressed rows its query attends
// to (ascending ids). Projections run over the whole batch; scoring per
// sequence against that sequence's index keys.
// head_weights ([n_rows, heads]) and proj are the products of the layer's
// input, q ([n_rows, heads, head_dim], rotated and rounded in place) the
// product of the normed qr, each run in one batch by attention_forward.
std::vector<std::vector<int32_t>> indexer_select(const KernelBackend& kb, const ModelConfig& c, const IndexerWeights& w,
                                                 const RopeTable& rope, const LayerLayout& layout,
                                                 const std::vector<Segment>& segments, const RowMap& rows, float* q,
                                                 float* head_weights, const CompressorProjections& proj,
                                                 int64_t n_rows) {
  const int64_t heads = c.index_n_heads, hd = c.index_head_dim;
  kb.rope(q + hd - c.rope_dim, n_rows * heads, hd, rows.position.data(), heads, rope, false);
  kb.hadamard(q, n_rows * heads, hd, hd);
  kb.fp4_round(q, n_rows * heads, hd, hd, 32);
  kb.scale(head_weights, n_rows * heads, 1.0f / std::sqrt(float(hd)) * (1.0f / std::sqrt(float(heads))));
  for (const Segment& s : segments)
    compressor_push(kb, c, w.compressor, rope, true, *s.state, proj, s.row0, s.start, s.n);

  // Each row reads its sequence's keys as stored (FP4); the backend decodes.
  std::vector<Fp4RowsView> keys(static_cast<size_t>(n_rows));
  std::vector<int64_t> visible(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    keys[size_t(r)] = rows.owner[size_t(r)]->state->index_keys.view();
    visible[size_t(r)] = layout.visible_rows(rows.position[size_t(r)]);
  }
  std::vector<std::vector<int32_t>> selected;
  kb.indexer_select({q, head_weights, n_rows, heads, hd, keys.data(), visible.data(), c.index_topk, &selected});
  return selected;
}

}  // namespace

namespace {

// The window KV rows after wkv, rounded as the reference caches them.
void finish_kv_rows(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                    const int64_t* positions, float* kv, int64_t n) {
  const int64_t hd = c.head_dim, nope = hd - c.rope_dim;
  kb.rms_norm(kv, n, hd, hd, w.kv_norm.data(), c.norm_eps);
  kb.rope(kv + nope, n, hd, positions, 1, rope, false);
  // V4 keeps the rotated dims unrounded; V4.1 rounds the whole row.
  if (c.v41)
    kb.fp8_round(kv, n, hd, hd, 32);
  else
    kb.fp8_round(kv, n, nope, hd, 64);
}

}  // namespace

AttentionInputs attention_input_products(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                                         const float* x, int64_t n, std::vector<LinearProduct>& products) {
  AttentionInputs in{{kb.buffer(n * c.q_lora_rank), kb.buffer(n * c.n_heads * c.head_dim)}, kb.buffer(n * c.head_dim)};
  products.push_back({&w.wq_a, x, n, in.queries.qr.data()});
  products.push_back({&w.wkv, x, n, in.kv.data()});
  return in;
}

void finish_attention_inputs(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                             const RopeTable& rope, const int64_t* positions, int64_t n, bool head_norm,
                             AttentionInputs& in, float* index_q) {
  const int64_t H = c.n_heads, hd = c.head_dim, nope = hd - c.rope_dim;
  AttentionQueries& q = in.queries;
  kb.rms_norm(q.qr.data(), n, c.q_lora_rank, c.q_lora_rank, w.q_norm.data(), c.norm_eps);
  const LinearProduct products[] = {{&w.wq_b, q.qr.data(), n, q.q.data()}, {&w.indexer.wq_b, q.qr.data(), n, index_q}};
  kb.linear_many(products, index_q ? 2 : 1);
  if (head_norm) kb.rms_norm(q.q.data(), n * H, hd, hd, nullptr, c.norm_eps);
  kb.rope(q.q.data() + nope, n * H, hd, positions, H, rope, false);
  finish_kv_rows(kb, c, w, rope, positions, in.kv.data(), n);
}

AttentionInputs attention_inputs(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                                 const RopeTable& rope, const int64_t* positions, const float* x, int64_t n,
                                 bool head_norm) {
  std::vector<LinearProduct> products;
  AttentionInputs in = attention_input_products(kb, c, w, x, n, products);
  kb.linear_many(products.data(), products.size());
  finish_attention_inputs(kb, c, w, rope, positions, n, head_norm, in);
  return in;
}

Buffer attention_kv_rows(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                         const RopeTable& rope, const int64_t* positions, const float* x, int64_t n) {
  Buffer kv = kb.buffer(n * c.head_dim);
  kb.linear(w.wkv, x, n, kv.data());
  finish_kv_rows(kb, c, w, rope, positions, kv.data(), n);
  return kv;
}

void attention_output(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                      const int64_t* positions, float* o, int64_t n, float* out) {
  const int64_t H = c.n_heads, hd = c.head_dim, nope = hd - c.rope_dim;
  kb.rope(o + nope, n * H, hd, positions, H, rope, /*inverse=*/true);
  // Grouped low-rank output: group g of heads goes through rows
  // [g*R, (g+1)*R) of wo_a; the concatenation goes through wo_b. The G
  // slices go as one batch of products (on two cores, eight separate
  // 1024-row slices of V4-Flash's wo_a in a decode step took 14-27% longer
  // than the whole matrix in one call; docs/kernels.md, "Grouped products in
  // one call"), each reading its heads in place: token t's inputs of group g
  // are at o + t * H * hd + g * group_width (copying them out took 0.1 s of
  // a 4096-token prefill).
  const int64_t G = c.o_groups, R = c.o_lora_rank, group_width = H * hd / G;
  Buffer z = kb.buffer(n * G * R);
  std::vector<LinearProduct> slices;
  for (int64_t g = 0; g < G; ++g)
    slices.push_back({&w.wo_a, o + g * group_width, n, z.data() + g * R, g * R, (g + 1) * R, G * R, H * hd});
  kb.linear_many(slices.data(), slices.size());
  kb.linear(w.wo_b, z.data(), n, out);
}

void attention_forward(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       const LayerLayout& layout, const std::vector<Segment>& segments, const float* x, int64_t n_rows,
                       float* out) {
  const int64_t n = n_rows;
  const RowMap rows(segments, n);
  const std::vector<int64_t>& position = rows.position;

  // Every product of the layer's input goes in one batch: wq_a, wkv, the
  // indexer's head weights and compressor, the layer's compressor. On two
  // cores, a CSA layer's seven (V4-Flash shapes, one token) took 18-21%
  // longer as separate calls (docs/kernels.md, "Grouped products in one
  // call"). Likewise wq_b and the indexer's wq_b, both of the normed qr
  // (one token 3%, four tokens 11% faster per CSA layer).
  std::vector<LinearProduct> products;
  AttentionInputs in = attention_input_products(kb, c, w, x, n, products);
  Buffer head_weights = kb.buffer(layout.has_indexer() ? n * c.index_n_heads : 0);
  Buffer index_q = kb.buffer(layout.has_indexer() ? n * c.index_n_heads * c.index_head_dim : 0);
  CompressorProjections index_proj, proj;
  if (layout.has_indexer()) {
    products.push_back({&w.indexer.weights_proj, x, n, head_weights.data()});
    compressor_products(w.indexer.compressor, x, n, index_proj, products);
  }
  if (layout.compresses()) compressor_products(w.compressor, x, n, proj, products);
  kb.linear_many(products.data(), products.size());
  finish_attention_inputs(kb, c, w, rope, position.data(), n, !c.v41, in,
                          layout.has_indexer() ? index_q.data() : nullptr);

  std::vector<std::vector<int32_t>> selected;
  if (layout.has_indexer())
    selected = indexer_select(kb, c, w.indexer, rope, layout, segments, rows, index_q.data(), head_weights.data(),
                              index_proj, n);
  if (layout.compresses())
    for (const Segment& s : segments)
      compressor_push(kb, c, w.compressor, rope, false, *s.state, proj, s.row0, s.start, s.n);

  attend_rows(kb, c, w, rope, layout, segments, rows, layout.has_indexer() ? &selected : nullptr,
              {[&](const Segment& s, const int64_t* ids, int64_t count, float* dst) {
                 kb.decode_fp8_rows(s.state->compressed.view(), ids, count, dst);
               },
               [](const Segment& s) { return s.state->compressed.view(); }},
              in.queries.q.data(), in.kv.data(), out);
}

void attend_rows(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                 const LayerLayout& layout, const std::vector<Segment>& segments, const RowMap& rows,
                 const std::vector<std::vector<int32_t>>* selected, const CompressedRowSource& compressed,
                 const float* q, const float* kv, float* out) {
  const int64_t H = c.n_heads, hd = c.head_dim, win = c.window, n = int64_t(rows.position.size());
  // The cached keys the rows see, decoded once per sequence: window rows
  // before the chunk, and the compressed rows (all visible ones, or those
  // some row selected). row_of maps a compressed row id to its decoded copy.
  // Buffers, not vectors: 64-byte aligned, so that the attention's 512-bit
  // loads of a key never straddle two cache lines, and taken from the
  // thread's pool, so that a long context's rows (16 MB per sequence at 1M
  // tokens) are not a fresh mapping, page-faulted and zeroed, every step.
  //
  // A segment of a few rows (a decode or verify step) that attends all its
  // compressed rows hands them to the backend as stored instead, which
  // decodes them a key tile at a time where it reads them; a prefill chunk's
  // rows share their keys, and decoding them once for all the rows costs
  // less there.
  struct Decoded {
    Buffer window, rows;
    std::vector<int64_t> row_of;
    Fp8RowsView stored;  // codes set: the compressed rows as stored (`rows` left empty)
  };
  std::vector<Decoded> cache(segments.size());
  bool any_stored = false;
  for (size_t k = 0; k < segments.size(); ++k) {
    const Segment& s = segments[k];
    Decoded& d = cache[k];
    const int64_t first = std::max<int64_t>(0, s.start - win + 1);
    d.window = kb.buffer((s.start - first) * hd);
    std::vector<int64_t> ids;
    for (int64_t p = first; p < s.start; ++p) ids.push_back(p % win);
    kb.decode_fp8_rows(s.state->window.view(), ids.data(), int64_t(ids.size()), d.window.data());
    const int64_t count = layout.visible_rows(s.start + s.n - 1);
    if (!selected && compressed.fp8 && s.n <= kStoredRowsMaxChunk && count > 0) {
      d.stored = compressed.fp8(s);
      any_stored = true;
      continue;
    }
    d.row_of.assign(size_t(count), selected ? -1 : 0);
    if (selected)
      for (int64_t t = s.row0; t < s.row0 + s.n; ++t)
        for (int32_t i : (*selected)[size_t(t)]) d.row_of[size_t(i)] = 0;
    int64_t used = 0;
    for (int64_t& slot : d.row_of)
      if (slot == 0) slot = used++;
    d.rows = kb.buffer(used * hd);
    ids.clear();  // the used rows by id: their slots are 0, 1, ... in that order
    for (int64_t i = 0; i < count; ++i)
      if (d.row_of[size_t(i)] >= 0) ids.push_back(i);
    compressed.decode(s, ids.data(), used, d.rows.data());
  }

  // Keys of every row, in a fixed order (compressed rows by id, then window
  // rows by position), so that the result is independent of chunking and
  // batching. A stored row's key is null, and its row in fp8 names it.
  std::vector<const float*> keys;
  std::vector<Fp8Key> fp8;
  std::vector<int64_t> key_begin(static_cast<size_t>(n + 1));
  for (int64_t t = 0; t < n; ++t) {
    key_begin[size_t(t)] = int64_t(keys.size());
    const int64_t pos = rows.position[size_t(t)];
    const Segment& seg = *rows.owner[size_t(t)];
    const Decoded& d = cache[size_t(&seg - segments.data())];
    auto compressed_row = [&](int64_t i) { return d.rows.data() + d.row_of[size_t(i)] * hd; };
    if (d.stored.codes) {
      for (int64_t i = 0; i < layout.visible_rows(pos); ++i) {
        keys.push_back(nullptr);
        fp8.push_back({&d.stored, i});
      }
    } else if (selected) {
      for (int32_t i : (*selected)[size_t(t)]) keys.push_back(compressed_row(i));
    } else {
      for (int64_t i = 0; i < layout.visible_rows(pos); ++i) keys.push_back(compressed_row(i));
    }
    const int64_t window_first = std::max<int64_t>(0, seg.start - win + 1);
    for (int64_t p = std::max<int64_t>(0, pos - win + 1); p <= pos; ++p)
      keys.push_back(p >= seg.start ? kv + (seg.row0 + p - seg.start) * hd : d.window.data() + (p - window_first) * hd);
    if (any_stored) fp8.resize(keys.size());
  }
  key_begin[size_t(n)] = int64_t(keys.size());
  Buffer o = kb.buffer(n * H * hd);
  kb.sink_attention({q, n, H, hd, keys.data(), key_begin.data(), w.sink.data(), 1.0f / std::sqrt(float(hd)), o.data(),
                     any_stored ? fp8.data() : nullptr});
  // The ring keeps the last `win` window rows of each sequence. Every row
  // goes through it in order (not only a chunk's last `win`), so that a
  // rollback into the chunk finds the ring a shorter run would have left.
  for (const Segment& s : segments)
    for (int64_t t = 0; t < s.n; ++t) s.state->write_window(s.start + t, kv + (s.row0 + t) * hd);

  attention_output(kb, c, w, rope, rows.position.data(), o.data(), n, out);
}

}  // namespace dsv4
