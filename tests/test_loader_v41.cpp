// Bad DeepSeek-V4.1 checkpoints stop the load with one line naming the
// tensor or field (Engram tables, DSpark stages, layer roles), and the
// tensors of a vision tower are skipped, not refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "editable_checkpoint.h"
#include "golden_util.h"

namespace dsv4::test {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// A scratch copy of tiny-v41-flash whose header and config can be edited.
class BrokenV41 : public EditableCheckpoint {
 protected:
  void SetUp() override { open_copy("tiny-v41-flash", {"config.json", "engram_tokenizer.json"}); }
};

TEST_F(BrokenV41, LoadsAsShipped) {
  write_checkpoint();
  EXPECT_EQ(load_error(), "");
}

TEST_F(BrokenV41, MissingEngramTableIsNamed) {
  header_["layers.1.engram.embed.weight_renamed"] = header_["layers.1.engram.embed.weight"];
  header_.erase("layers.1.engram.embed.weight");
  write_checkpoint();
  const std::string e = load_error();
  EXPECT_NE(e.find("missing tensor layers.1.engram.embed.weight"), std::string::npos) << e;
}

TEST_F(BrokenV41, MisShapedDsparkTensorIsNamed) {
  header_["mtp.0.main_proj.weight"]["shape"] = {768, 256};
  write_checkpoint();
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor mtp.0.main_proj.weight has shape [768, 256]"), std::string::npos) << e;
}

TEST_F(BrokenV41, EngramRowsMustBeTheSumOfTheirPrimes) {
  write_checkpoint();
  edit_config([](json& c) { c["text_config"]["engram_num_embeddings"] = {2947, 6076}; });
  const std::string e = load_error();
  EXPECT_NE(e.find("layers.1.engram.embed.weight has shape [2946, 64], expected [2947, 64]"), std::string::npos) << e;
}

TEST_F(BrokenV41, RolesMustMatchTheTensors) {
  write_checkpoint();
  // Layer 4 keeps its compressor but is no longer declared a KV source.
  edit_config([](json& c) { c["text_config"]["kv_source_layer_ids"] = {2, 6}; });
  std::string e = load_error();
  EXPECT_NE(e.find("layers.4.attn.compressor.wkv.weight present but layer 4 is not a KV source"), std::string::npos)
      << e;
  // A ratio-1 layer whose group has no source of its ratio before it.
  edit_config([](json& c) { c["text_config"]["kv_source_layer_ids"] = {2, 4, 7}; });
  e = load_error();
  EXPECT_NE(e.find("compressed layer 6 (ratio 1) has no KV source of its ratio"), std::string::npos) << e;
}

TEST_F(BrokenV41, EngramNeedsItsTokenMap) {
  write_checkpoint();
  fs::remove(dir_ / "engram_tokenizer.json");
  const std::string e = load_error();
  EXPECT_NE(e.find("need the compressed token map"), std::string::npos) << e;
}

TEST_F(BrokenV41, VisionTensorsAreSkipped) {
  header_["vision.patch_embed.weight"] = header_["layers.0.attn_norm.weight"];
  header_["aligner.proj.weight"] = header_["layers.0.ffn_norm.weight"];
  write_checkpoint();
  edit_config([](json& c) { c["vision_config"] = {{"n_layers", 32}}; });
  auto model = Model::load(dir_.string());
  EXPECT_EQ(model->weights().skipped_vision_tensors, 2);
  EXPECT_TRUE(model->config().has_vision);
}

}  // namespace
}  // namespace dsv4::test
