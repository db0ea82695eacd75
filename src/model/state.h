// Per-sequence decode state of DeepSeek-V4 (architecture.md §7): everything a
// later token needs from the earlier ones. Chunked prefill, decode and prefix
// reuse all go through it, so a snapshot restores a sequence byte-exactly.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// Raw projections of the tokens of a compression window that is not complete
// yet. Overlapping compressors (ratio 4) keep the previous window too.
struct CompressorState {
  std::vector<float> kv;     // [slots, slot_width]
  std::vector<float> score;  // [slots, slot_width], -inf where empty
  void reset(int64_t slots, int64_t slot_width);
};

struct LayerState {
  std::vector<float> window;      // [window, head_dim]; position p in slot p % window
  std::vector<float> compressed;  // [rows, head_dim], grows by one row per `ratio` tokens
  std::vector<float> index_keys;  // [rows, index_head_dim] (ratio-4 layers)
  CompressorState compressor, index_compressor;
};

struct SequenceState {
  int64_t n_tokens = 0;  // positions already processed by the main model
  std::vector<LayerState> layers;
  int64_t mtp_tokens = 0;  // positions already processed by the MTP block
  std::vector<LayerState> mtp_layers;

  void reset(const ModelConfig& config);
  // Byte-exact serialization (the prefix cache stores these).
  std::vector<uint8_t> snapshot() const;
  void restore(const std::vector<uint8_t>& bytes);
  int64_t memory_bytes() const;
};

}  // namespace dsv4
