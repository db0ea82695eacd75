// The Engram token map a V4.1 checkpoint needs at load: derived from its
// tokenizer.json (a real checkpoint ships no map), unless the checkpoint
// directory carries an engram_tokenizer.json (the tiny test checkpoints).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::tools {

// Empty when the model has no Engram layers or ships its own map; logs one
// line when it derives one. tokenizer_path: a tokenizer.json, a directory
// holding one, or "" for the model directory's.
std::vector<int32_t> engram_token_map_for(const std::string& model_dir, const std::string& tokenizer_path = "");

}  // namespace dsv4::tools
