// Sublayers of a DeepSeek-V4 block, written against the kernel backend
// (kernels/backend.h): they decide what to compute, the backend computes it.
// Internal to the model; each works on a batch of rows that belong to one or
// more sequences (see Segment).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "io/config.h"
#include "kernels/backend.h"
#include "model/state.h"
#include "model/weights.h"

namespace dsv4 {

// Hyper-connections (mHC): collapse the hc_mult residual copies into one
// sublayer input, and expand the sublayer output back.
inline HcShape hc_shape(const ModelConfig& c) { return {c.hc_mult, c.dim, c.hc_sinkhorn_iters, c.hc_eps, c.norm_eps}; }
inline HcSite hc_site(const HyperConnectionWeights& w) { return {&w.fn, w.base.data(), w.scale.data()}; }

// Rows of one sequence inside a batch of rows: rows [row0, row0+n) of every
// activation matrix belong to positions start .. start+n-1 of that sequence.
struct Segment {
  LayerState* state;
  int64_t start;
  int64_t row0;
  int64_t n;
  SequenceState* sequence = nullptr;  // V4.1: the group's source layers live here
};

// What V4.1's layers hand down the stack within one forward call (the
// reference's shared runtime): the latest index source's selection and the
// candidate source's masks, per row of the batch.
struct GroupedShared {
  std::vector<std::vector<int32_t>> selected;    // [rows]: compressed rows, ascending
  std::vector<std::vector<uint8_t>> candidates;  // [rows]: 1 = row in a candidate block
};

// V4.1's compressed attention (LayerKind::Grouped): the KV source compresses
// and publishes index keys, an index source selects, every layer of the
// group attends the selected rows of the source and its own window.
void attention_grouped(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       const LayerLayout& layout, int64_t layer, const std::vector<Segment>& segments,
                       GroupedShared& shared, const float* x, int64_t n_rows, float* out);
// The KV source's compression alone (its rows and index keys, nothing
// attended): what bounded replay keeps of the rows that skip the layer.
void grouped_compress(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                      const LayerLayout& layout, const std::vector<Segment>& segments, const float* x, int64_t n_rows);

// Gated pooling compressor, in two steps: the projections of all rows of a
// batch at once, then, per sequence, the tokens pushed in order through the
// partial-window state; every completed row (normed, rotated at its first
// position, rounded like the reference) is appended to the layer's
// compressed rows (or its index keys).
struct CompressorProjections {
  std::vector<float> kv, score;  // [n_rows, slot_width]
};
// Sizes `p` and appends the two projections to `products`, which the caller
// runs in one batch with its other products of the same input.
void compressor_products(const CompressorWeights& w, const float* x, int64_t n_rows, CompressorProjections& p,
                         std::vector<LinearProduct>& products);
void compressor_push(const KernelBackend& kb, const ModelConfig& c, const CompressorWeights& w, const RopeTable& rope,
                     bool indexer_keys, LayerState& layer, const CompressorProjections& proj, int64_t row0,
                     int64_t start, int64_t n);

// The pieces of attention that every variant shares: the queries (qr feeds
// the indexer; `head_norm`: the per-head RMS norm of V4's queries), the
// window KV rows of the batch rounded as the reference caches them, and the
// output of the attended values (inverse RoPE, grouped low-rank projection;
// `o` is rotated in place).
struct AttentionQueries {
  Buffer qr, q;  // [n, q_lora_rank], [n, heads, head_dim]
};
// The queries and window KV rows of a layer's input, in two steps: sized
// here, with wq_a and wkv appended to `products` for the caller to run in one
// batch with its other products of the same input (docs/kernels.md,
// "Grouped products in one call"); finish_attention_inputs completes them
// once that batch ran, with the indexer's wq_b of the same normed qr in
// wq_b's batch where `index_q` ([n, index_heads, index_head_dim]) is given.
// attention_inputs does both where the input has no other products.
struct AttentionInputs {
  AttentionQueries queries;
  Buffer kv;  // [n, head_dim]
};
AttentionInputs attention_input_products(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                                         const float* x, int64_t n, std::vector<LinearProduct>& products);
void finish_attention_inputs(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                             const RopeTable& rope, const int64_t* positions, int64_t n, bool head_norm,
                             AttentionInputs& in, float* index_q = nullptr);
AttentionInputs attention_inputs(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                                 const RopeTable& rope, const int64_t* positions, const float* x, int64_t n,
                                 bool head_norm);
Buffer attention_kv_rows(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w,
                         const RopeTable& rope, const int64_t* positions, const float* x, int64_t n);
// Rows of a batch to the position each holds and the segment it belongs to.
struct RowMap {
  std::vector<int64_t> position;
  std::vector<const Segment*> owner;
  RowMap(const std::vector<Segment>& segments, int64_t n_rows);
};
void attention_output(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                      const int64_t* positions, float* o, int64_t n, float* out);

// What every attention layer does once its keys are known: each row
// attends its compressed rows (`selected[row]`, ascending ids; null: every
// row it can see) and its window (the chunk's own `kv` rows, earlier ones
// from the ring), in that fixed order; the window rows of the chunk enter
// the ring; the output projection writes `out`.
//
// How the compressed rows are read: `decode(segment, ids, count, dst)`
// decodes rows ids[0..count) of a segment's sequence one after another
// (through the backend where it can); `fp8(segment)`, where set, gives them
// as the state stores them, which a decode or verify step hands to the
// backend undecoded when it attends every row (the backend decodes them a
// key tile at a time: docs/long_context.md, "Cached rows decoded per key
// tile").
struct CompressedRowSource {
  std::function<void(const Segment&, const int64_t*, int64_t, float*)> decode;
  std::function<Fp8RowsView(const Segment&)> fp8;
};
void attend_rows(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                 const LayerLayout& layout, const std::vector<Segment>& segments, const RowMap& rows,
                 const std::vector<std::vector<int32_t>>* selected, const CompressedRowSource& compressed,
                 const float* q, const float* kv, float* out);

// Attention over a batch of rows from one or more sequences.
void attention_forward(const KernelBackend& kb, const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       const LayerLayout& layout, const std::vector<Segment>& segments, const float* x, int64_t n_rows,
                       float* out);

void moe_forward(const KernelBackend& kb, const ModelConfig& c, const MoeWeights& w, const float* x,
                 const int32_t* tokens, int64_t n, float* out);

}  // namespace dsv4
