#include "model/layer_kind.h"

#include <string>

#include "core/error.h"

namespace dsv4 {

const char* LayerLayout::name() const {
  switch (kind) {
    case LayerKind::Window: return "window";
    case LayerKind::CompressedIndexed: return "csa";
    case LayerKind::Compressed: return "hca";
  }
  return "?";
}

LayerLayout layer_layout(const ModelConfig& config, int64_t layer) {
  const int64_t ratio = config.ratio(layer);
  if (ratio == 0) return {LayerKind::Window, 0};
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
  }
  return 0;
}

}  // namespace dsv4
