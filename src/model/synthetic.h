// Synthetic DeepSeek-V4 checkpoints in the official format (config.json +
// safetensors with FP8 128x128 / FP4 1x32 weights): the embedded smoke-test
// model of `dsv4 serve`, and real-shaped layer slices for benchmarks.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace dsv4 {

struct SyntheticSpec {
  std::string preset = "smoke";  // smoke | flash | pro | ... (see synthetic_config)
  int64_t layers = -1;           // main layers; -1 = the preset's default
  bool fp8 = true;               // FP8 weights + FP4 experts, else all BF16
  uint64_t seed = 1234;
};

// The text-model fields every preset shares (V4 and V4.1), without the
// rope_scaling type key (V4 spells it "type", V4.1's text_config
// "rope_type").
nlohmann::json synthetic_text_fields();
// The config.json of a preset (HF root-style keys, as the official files).
nlohmann::json synthetic_config(const SyntheticSpec& spec);
// V4.1 presets (model/synthetic_v41.cpp): v41 has the released V4.1-Flash
// dimensions, smoke-v41 small ones; both with text_config, layer roles,
// Engram layers and a DSpark head.
nlohmann::json synthetic_config_v41(const SyntheticSpec& spec);
// The V4 tokenizer with the two special tokens V4.1 renamed.
void write_v41_tokenizer(const std::string& v4_tokenizer_json, const std::string& out_path);

// Writes config.json, the safetensors shard(s) (+ index when sharded) and,
// when `tokenizer_dir` is given, tokenizer.json / tokenizer_config.json into
// `dir`. Weights are random but deterministic for a seed, scaled so that
// activations keep unit size through the layers.
void write_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& dir, const std::string& tokenizer_dir,
                                const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace dsv4
