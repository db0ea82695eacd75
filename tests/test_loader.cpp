// Bad checkpoints must stop the load with one clear message naming the
// tensor, file or field, never a crash; the CLI exits non-zero.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "editable_checkpoint.h"
#include "golden_util.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace dsv4::test {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The same tiny-flash-fp8 weights loaded another way (sharded, copied) must
// give the bits of the checkpoint as shipped.
void expect_same_bits_as_golden_checkpoint(const Model& model) {
  auto reference = Model::load(model_dir("tiny-flash-fp8"));
  std::vector<int32_t> tokens = {0, 17, 99, 3, 250, 511, 42, 7, 8, 9};
  RunResult a = run_schedule(model, tokens, 10, 10, true);
  RunResult b = run_schedule(*reference, tokens, 10, 10, true);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.mtp_logits, b.mtp_logits);
}

// A scratch copy of tiny-flash-fp8 whose header or config can be edited.
class BrokenCheckpoint : public EditableCheckpoint {
 protected:
  void SetUp() override { open_copy("tiny-flash-fp8"); }
};

TEST_F(BrokenCheckpoint, UnchangedCopyLoads) {
  write_checkpoint();
  EXPECT_EQ(load_error(), "");
}

TEST_F(BrokenCheckpoint, MissingTensorIsNamed) {
  header_["layers.2.attn.wq_b.weight_renamed"] = header_["layers.2.attn.wq_b.weight"];
  header_.erase("layers.2.attn.wq_b.weight");
  write_checkpoint();
  std::string e = load_error();
  EXPECT_NE(e.find("missing tensor layers.2.attn.wq_b.weight"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, WrongShapeIsNamed) {
  // Same byte count, transposed shape.
  header_["layers.0.attn.wkv.weight"]["shape"] = {256, 512};
  write_checkpoint();
  std::string e = load_error();
  EXPECT_NE(e.find("layers.0.attn.wkv.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [512, 256]"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, WrongDtypeIsNamed) {
  header_["layers.1.attn.wq_a.scale"]["dtype"] = "U8";
  write_checkpoint();
  std::string e = load_error();
  EXPECT_NE(e.find("layers.1.attn.wq_a.scale"), std::string::npos) << e;
  EXPECT_NE(e.find("F8_E8M0"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, UnknownDtypeIsNamed) {
  header_["norm.weight"]["dtype"] = "F4_WHATEVER";
  write_checkpoint();
  std::string e = load_error();
  EXPECT_NE(e.find("norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("unsupported dtype F4_WHATEVER"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, TruncatedFileIsReported) {
  data_.resize(data_.size() / 2);
  write_checkpoint();
  std::string e = load_error();
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, TruncatedFileIsReportedWhenCopied) {
  data_.resize(data_.size() / 2);
  write_checkpoint();
  std::string e = load_error(LoadMode::Copy);
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

// --load-mode none (--no-mmap) copies the files into anonymous (huge-page)
// memory: same logits. Auto copies a checkpoint this small.
TEST(Residency, CopiedWeightsGiveTheMappedBits) {
  LoadOptions copied;
  copied.load_mode = LoadMode::Copy;
  auto model = Model::load(model_dir("tiny-flash-fp8"), copied);
  EXPECT_EQ(model->residency().residency, FileResidency::Copied);
  expect_same_bits_as_golden_checkpoint(*model);
  LoadOptions automatic;
  automatic.load_mode = LoadMode::Auto;
  model = Model::load(model_dir("tiny-flash-fp8"), automatic);
  EXPECT_EQ(model->residency().residency, FileResidency::Copied) << model->residency().why;
  EXPECT_NE(model->residency().why.find("--load-mode auto"), std::string::npos) << model->residency().why;
}

// A copy puts every tensor on a cache-line boundary, whatever its offset in
// the file (the tiny checkpoint's tensors follow each other unpadded, as
// in the official files), with the file's bytes.
TEST(Residency, CopiedTensorsStartOnCacheLines) {
  const std::string dir = model_dir("tiny-flash-fp8");
  const TensorStore mapped = TensorStore::open(dir, FileResidency::Mapped);
  const TensorStore copied = TensorStore::open(dir, FileResidency::Copied);
  ASSERT_EQ(mapped.tensors().size(), copied.tensors().size());
  int unaligned_in_file = 0;
  for (const auto& [name, in_file] : mapped.tensors()) {
    const TensorInfo& copy = copied.get(name);
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(copy.data) % kCopiedTensorAlignment) << name;
    ASSERT_EQ(in_file.nbytes, copy.nbytes) << name;
    EXPECT_EQ(0, std::memcmp(in_file.data, copy.data, size_t(copy.nbytes))) << name;
    unaligned_in_file += reinterpret_cast<uintptr_t>(in_file.data) % kCopiedTensorAlignment != 0;
  }
  EXPECT_GT(unaligned_in_file, 0) << "the test needs a file whose tensors are not aligned";
}

// Auto copies while the checkpoint and the caches fit in 90% of the memory
// available, maps beyond that or when the memory available is unknown; the
// explicit modes do what they say whatever the memory. Each gives a reason.
TEST(Residency, AutoCopiesWhatFitsAndMapsTheRest) {
  const int64_t gb = 1000000000;
  EXPECT_EQ(choose_residency(LoadMode::Auto, 12 * gb, 1 * gb, 20 * gb).residency, FileResidency::Copied);
  EXPECT_EQ(choose_residency(LoadMode::Auto, 17 * gb, 1 * gb, 20 * gb).residency, FileResidency::Copied);
  EXPECT_EQ(choose_residency(LoadMode::Auto, 18 * gb, 1 * gb, 20 * gb).residency, FileResidency::Mapped);
  EXPECT_EQ(choose_residency(LoadMode::Auto, 150 * gb, 0, 120 * gb).residency, FileResidency::Mapped);
  EXPECT_EQ(choose_residency(LoadMode::Auto, 1 * gb, 0, -1).residency, FileResidency::Mapped);
  EXPECT_EQ(choose_residency(LoadMode::Copy, 150 * gb, 0, 1 * gb).residency, FileResidency::Copied);
  EXPECT_EQ(choose_residency(LoadMode::Mmap, 1 * gb, 0, 150 * gb).residency, FileResidency::Mapped);
  const ResidencyChoice mapped = choose_residency(LoadMode::Auto, 150 * gb, 2 * gb, 120 * gb);
  EXPECT_NE(mapped.why.find("150.0 GB checkpoint and 2.0 GB of caches do not fit"), std::string::npos) << mapped.why;
  LoadMode mode = LoadMode::Auto;
  EXPECT_TRUE(parse_load_mode("none", &mode));
  EXPECT_EQ(mode, LoadMode::Copy);
  EXPECT_TRUE(parse_load_mode("mmap", &mode));
  EXPECT_EQ(mode, LoadMode::Mmap);
  EXPECT_FALSE(parse_load_mode("mlock", &mode));
  EXPECT_EQ(checkpoint_file_bytes(model_dir("tiny-flash-fp8")),
            int64_t(std::filesystem::file_size(model_dir("tiny-flash-fp8") + "/model.safetensors")));
  EXPECT_TRUE(is_weight_file("model-00001-of-00004.safetensors"));
  EXPECT_FALSE(is_weight_file("golden.safetensors"));
  EXPECT_FALSE(is_weight_file("model.safetensors.index.json"));
}

TEST_F(BrokenCheckpoint, TruncatedHeaderIsReported) {
  write_checkpoint();
  std::string bytes = read_file(dir_ / "model.safetensors");
  write_file(dir_ / "model.safetensors", bytes.substr(0, 100));
  std::string e = load_error();
  EXPECT_NE(e.find("truncated or corrupt"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, CorruptHeaderJsonIsReported) {
  write_checkpoint();
  std::string bytes = read_file(dir_ / "model.safetensors");
  bytes[8] = '#';  // the opening brace of the JSON header
  write_file(dir_ / "model.safetensors", bytes);
  std::string e = load_error();
  EXPECT_NE(e.find("corrupt safetensors header"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, DuplicateHashExpertIsRejected) {
  // tid2eid row 0 of layer 0 gets the same expert twice.
  auto& entry = header_["layers.0.ffn.gate.tid2eid"];
  int64_t begin = entry["data_offsets"][0];
  int64_t first;
  std::memcpy(&first, data_.data() + begin, 8);
  std::memcpy(data_.data() + begin + 8, &first, 8);
  write_checkpoint();
  std::string e = load_error();
  EXPECT_NE(e.find("layers.0.ffn.gate.tid2eid row 0 repeats an expert id"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, UnsupportedModelTypeIsNamed) {
  write_checkpoint();
  edit_config([](json& c) { c["model_type"] = "deepseek_v3"; });
  EXPECT_NE(load_error().find("unsupported model_type \"deepseek_v3\""), std::string::npos);
}

TEST_F(BrokenCheckpoint, UnsupportedFeatureIsNamed) {
  write_checkpoint();
  edit_config([](json& c) { c["engram_layer_ids"] = {1}; });
  EXPECT_NE(load_error().find("engram_layer_ids"), std::string::npos);
  edit_config([](json& c) {
    c.erase("engram_layer_ids");
    c["scoring_func"] = "softmax";
  });
  EXPECT_NE(load_error().find("scoring_func \"softmax\""), std::string::npos);
}

TEST_F(BrokenCheckpoint, MissingConfigFieldIsNamed) {
  write_checkpoint();
  edit_config([](json& c) { c.erase("o_lora_rank"); });
  EXPECT_NE(load_error().find("missing field \"o_lora_rank\""), std::string::npos);
}

TEST_F(BrokenCheckpoint, ConfigThatDisagreesWithTensorsIsCaught) {
  write_checkpoint();
  edit_config([](json& c) { c["q_lora_rank"] = 256; });
  std::string e = load_error();
  EXPECT_NE(e.find("layers.0.attn.wq_a.weight has shape [128, 256], expected [256, 256]"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, Fp8TensorInUnquantizedConfigIsRefused) {
  write_checkpoint();
  edit_config([](json& c) { c.erase("quantization_config"); });
  std::string e = load_error();
  EXPECT_NE(e.find("has dtype F8_E4M3"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, ShardedIndexWithMissingShardIsNamed) {
  write_checkpoint();
  fs::rename(dir_ / "model.safetensors", dir_ / "model-00001-of-00002.safetensors");
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (auto& [name, _] : header_.items())
    if (name != "__metadata__")
      index["weight_map"][name] =
          name.rfind("mtp.", 0) == 0 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  write_file(dir_ / "model.safetensors.index.json", index.dump());
  std::string e = load_error();
  EXPECT_NE(e.find("missing shard"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, ShardedCheckpointLoadsAndMatches) {
  // Split the tensors over two shards: the forward pass must not notice.
  json h1 = json::object(), h2 = json::object();
  std::string d1, d2;
  for (auto& [name, entry] : header_.items()) {
    if (name == "__metadata__") continue;
    bool second = name.rfind("layers.3", 0) == 0 || name.rfind("mtp.", 0) == 0;
    std::string& d = second ? d2 : d1;
    json& h = second ? h2 : h1;
    int64_t b = entry["data_offsets"][0], e = entry["data_offsets"][1];
    while (d.size() % 8) d.push_back('\0');
    json copy = entry;
    copy["data_offsets"] = {int64_t(d.size()), int64_t(d.size()) + (e - b)};
    d += data_.substr(size_t(b), size_t(e - b));
    h[name] = copy;
  }
  auto write_shard = [&](const std::string& file, const json& h, const std::string& d) {
    std::string text = h.dump();
    while (text.size() % 8) text.push_back(' ');
    uint64_t n = text.size();
    write_file(dir_ / file, std::string(reinterpret_cast<const char*>(&n), 8) + text + d);
  };
  write_shard("model-00001-of-00002.safetensors", h1, d1);
  write_shard("model-00002-of-00002.safetensors", h2, d2);
  json index = {{"weight_map", json::object()}};
  for (auto& [name, _] : h1.items()) index["weight_map"][name] = "model-00001-of-00002.safetensors";
  for (auto& [name, _] : h2.items()) index["weight_map"][name] = "model-00002-of-00002.safetensors";
  write_file(dir_ / "model.safetensors.index.json", index.dump());

  expect_same_bits_as_golden_checkpoint(*Model::load(dir_.string()));
}

TEST(Config, ParsesFlashShapes) {
  ModelConfig c = load_config(model_dir("tiny-pro-fp8"));
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{128, 128, 4, 128, 4, 0}));
  EXPECT_TRUE(c.fp8_weights);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_DOUBLE_EQ(c.route_scale, 2.5);
}

TEST(Config, MalformedJsonIsReported) {
  EXPECT_THROW(parse_config("{\"model_type\": ", "x/config.json"), Error);
  try {
    parse_config("[1,2]", "x/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/config.json"), std::string::npos);
  }
}

TEST(TokenIds, OutOfVocabularyIsAnError) {
  auto model = Model::load(model_dir("tiny-flash-bf16"));
  SequenceState s = model->new_state();
  std::vector<int32_t> bad = {0, 512};
  std::vector<float> logits(2 * 512);
  EXPECT_THROW(model->forward(s, bad.data(), 2, logits.data()), Error);
}

}  // namespace
}  // namespace dsv4::test
