// What kind of attention each layer has, decided once from the config at
// load, so that binding, attention, state layout, synthetic checkpoints and
// the cost model ask a layer what it is instead of testing its ratio.
#pragma once
#include <cstdint>

#include "io/config.h"

namespace dsv4 {

enum class LayerKind {
  // Sliding window only (compress ratio 0: the first layers, the MTP block).
  Window,
  // CSA: an overlapping ratio-4 compressor (each token feeds two rows) and a
  // lightning indexer that picks the top-k compressed rows per query.
  CompressedIndexed,
  // HCA: a non-overlapping compressor of a larger power-of-two ratio (128 in
  // the official schedules); every compressed row is attended.
  Compressed,
  // V4.1: a layer of a compressed-KV group. The group's KV source compresses
  // (ratio 2: gated pooling of 2 tokens, ratio 1: one row per token) and
  // publishes index keys; an index source scores them with its own queries;
  // the other layers of the group reuse both (docs/v41.md).
  Grouped,
};

struct LayerLayout {
  LayerKind kind = LayerKind::Window;
  int64_t ratio = 0;  // tokens per compressed row (0: none)
  // Grouped layers: the layer whose compressed rows and index keys this
  // layer reads (itself when it is the KV source), and the layer whose
  // selection it attends (itself when it is an index source).
  int64_t kv_group = -1, index_group = -1;
  bool index_source = false;      // index_group is this layer (it scores the keys itself)
  bool candidate_source = false;  // its block scores restrict later index sources
  bool uses_candidates = false;   // an index source after the candidate source

  bool compresses() const { return kind != LayerKind::Window; }
  // Grouped layers compress only as their group's KV source.
  bool owns_compressor(int64_t layer) const { return kind != LayerKind::Grouped ? compresses() : kv_group == layer; }
  bool has_indexer() const { return kind == LayerKind::CompressedIndexed; }
  bool runs_indexer(int64_t layer) const {
    return kind == LayerKind::CompressedIndexed || (kind == LayerKind::Grouped && index_group == layer);
  }
  // Overlapping compressors keep the previous window's slots too.
  bool overlapping() const { return kind == LayerKind::CompressedIndexed; }
  // Compressed rows visible to the token at `position` (rows complete after
  // every `ratio` tokens).
  int64_t visible_rows(int64_t position) const { return compresses() ? (position + 1) / ratio : 0; }
  const char* name() const;
};

// Layer `layer` of the config (main layers, then the MTP layers). Throws
// Error for a ratio no kind implements.
LayerLayout layer_layout(const ModelConfig& config, int64_t layer);
// The ratio a kind has in the official configs, for synthetic checkpoints.
int64_t default_ratio(LayerKind kind);

}  // namespace dsv4
