#include "model/layer_kind.h"

#include <string>

#include "core/error.h"

namespace dsv4 {

const char* LayerLayout::name() const {
  switch (kind) {
    case LayerKind::Window: return "window";
    case LayerKind::CompressedIndexed: return "csa";
    case LayerKind::Compressed: return "hca";
    case LayerKind::Grouped: return "grouped";
  }
  return "?";
}

LayerLayout layer_layout(const ModelConfig& config, int64_t layer) {
  const int64_t ratio = config.ratio(layer);
  if (ratio == 0) return {LayerKind::Window, 0};
  if (config.v41) {
    // parse_config checked that every compressed main layer has a KV source
    // and an index source of its ratio at or before it.
    LayerLayout layout{LayerKind::Grouped, ratio};
    for (int64_t l : config.kv_source_layer_ids)
      if (l <= layer) layout.kv_group = l;
    for (int64_t l : config.index_source_layer_ids)
      if (l <= layer) layout.index_group = l;
    layout.index_source = layout.index_group == layer;
    layout.candidate_source = layer == config.candidate_source_layer_id;
    layout.uses_candidates = layout.index_group == layer && config.candidate_source_layer_id >= 0 &&
                             config.candidate_source_layer_id < layer;
    if (layer >= config.n_layers || layout.kv_group < 0 || layout.index_group < 0)
      throw Error("layer " + std::to_string(layer) + ": compress ratio " + std::to_string(ratio) +
                  " without a KV and an index source");
    return layout;
  }
  if (ratio == 4) return {LayerKind::CompressedIndexed, 4};
  if (ratio > 4 && (ratio & (ratio - 1)) == 0) return {LayerKind::Compressed, ratio};
  throw Error("layer " + std::to_string(layer) + ": compress ratio " + std::to_string(ratio) +
              " has no layer kind (0, 4 with an indexer, or a power of two above 4)");
}

int64_t default_ratio(LayerKind kind) {
  switch (kind) {
    case LayerKind::Window: return 0;
    case LayerKind::CompressedIndexed: return 4;
    case LayerKind::Compressed: return 128;
    case LayerKind::Grouped: return 2;
  }
  return 0;
}

}  // namespace dsv4
