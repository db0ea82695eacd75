#include "model/synthetic.h"

#include "model/layer_kind.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace dsv4 {
namespace fs = std::filesystem;
using nlohmann::json;

json synthetic_text_fields() {
  return {{"attention_bias", false},
          {"hc_eps", 1e-6},
          {"hc_mult", 4},
          {"hc_sinkhorn_iters", 20},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 1048576},
          {"num_key_value_heads", 1},
          {"n_shared_experts", 1},
          {"norm_topk_prob", true},
          {"qk_rope_head_dim", 64},
          {"rope_theta", 10000},
          {"compress_rope_theta", 160000},
          {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 16}, {"original_max_position_embeddings", 65536}}},
          {"scoring_func", "sqrtsoftplus"},
          {"sliding_window", 128},
          {"swiglu_limit", 10.0},
          {"tie_word_embeddings", false},
          {"topk_method", "noaux_tc"},
          {"vocab_size", 129280}};
}

json synthetic_config(const SyntheticSpec& s) {
  if (s.preset == "v41" || s.preset == "smoke-v41") return synthetic_config_v41(s);
  json c = synthetic_text_fields();
  c.update({{"architectures", {"DeepseekV4ForCausalLM"}},
            {"model_type", "deepseek_v4"},
            {"bos_token_id", 0},
            {"eos_token_id", 1},
            {"rms_norm_eps", 1e-6},
            {"torch_dtype", "bfloat16"},
            {"num_nextn_predict_layers", 1}});
  c["rope_scaling"]["type"] = "yarn";
  // The refreshed checkpoints with a DSpark head: the base preset's shapes.
  std::string base = s.preset;
  // (smoke-0731: the smoke shapes with a DSpark head, for tests.)
  const bool dspark = base == "flash-0731" || base == "pro-0813" || base == "smoke-0731";
  if (dspark) base = base.substr(0, base.find('-'));
  int64_t layers;
  if (base == "smoke") {
    layers = s.layers > 0 ? s.layers : 2;
    c.update({{"hidden_size", 256},
              {"num_attention_heads", 4},
              {"head_dim", 128},
              {"q_lora_rank", 128},
              {"o_groups", 2},
              {"o_lora_rank", 64},
              {"index_n_heads", 4},
              {"index_head_dim", 64},
              {"index_topk", 64},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 256},
              {"routed_scaling_factor", 1.5},
              {"num_hash_layers", 1}});
  } else if (base == "flash") {
    layers = s.layers > 0 ? s.layers : 2;
    c.update({{"hidden_size", 4096},
              {"num_attention_heads", 64},
              {"head_dim", 512},
              {"q_lora_rank", 1024},
              {"o_groups", 8},
              {"o_lora_rank", 1024},
              {"index_n_heads", 64},
              {"index_head_dim", 128},
              {"index_topk", 512},
              {"n_routed_experts", 256},
              {"num_experts_per_tok", 6},
              {"moe_intermediate_size", 2048},
              {"routed_scaling_factor", 1.5},
              {"num_hash_layers", 0}});
  } else if (base == "pro") {
    layers = s.layers > 0 ? s.layers : 2;
    c.update({{"hidden_size", 7168},
              {"num_attention_heads", 128},
              {"head_dim", 512},
              {"q_lora_rank", 1536},
              {"o_groups", 16},
              {"o_lora_rank", 1024},
              {"index_n_heads", 64},
              {"index_head_dim", 128},
              {"index_topk", 1024},
              {"n_routed_experts", 384},
              {"num_experts_per_tok", 6},
              {"moe_intermediate_size", 3072},
              {"routed_scaling_factor", 2.5},
              {"num_hash_layers", 0}});
  } else {
    throw Error("unknown preset \"" + s.preset +
                "\" (smoke, flash, pro, flash-0731, pro-0813, smoke-0731, v41 or smoke-v41)");
  }
  // Real-shaped slices alternate CSA (ratio 4) and HCA (ratio 128) layers,
  // like the bulk of the official schedules; the MTP block is window-only.
  std::vector<int64_t> ratios;
  for (int64_t l = 0; l < layers; ++l)
    ratios.push_back(default_ratio(l % 2 == 0 ? LayerKind::CompressedIndexed : LayerKind::Compressed));
  ratios.push_back(default_ratio(LayerKind::Window));
  if (dspark) {
    // 0731 / 0813: the MTP entry becomes the first of three window-only
    // DSpark stages (num_nextn_predict_layers stays 1, ignored, as in the
    // official files). The stages read the last three main layers (a slice
    // with fewer repeats its first).
    ratios.push_back(default_ratio(LayerKind::Window));
    ratios.push_back(default_ratio(LayerKind::Window));
    std::vector<int64_t> targets;
    for (int64_t i = 0; i < 3; ++i) targets.push_back(std::max<int64_t>(0, layers - 3 + i));
    c.update({{"dspark_block_size", 5},
              {"dspark_noise_token_id", 128799},
              {"dspark_target_layer_ids", targets},
              {"dspark_markov_rank", base == "pro"     ? 512
                                     : base == "flash" ? 256
                                                       : 32}});
  }
  c["num_hidden_layers"] = layers;
  c["compress_ratios"] = ratios;
  if (s.fp8) {
    c["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
    c["expert_dtype"] = "fp4";
  }
  return c;
}

namespace {

// How a tensor's values are generated.
enum class Fill { Gaussian, Ones, Zeros, HashTable };
// FP8_ROWS: e4m3 values with one ue8m0 scale per 32 values of a row (the
// V4.1 Engram tables).
enum class Storage { BF16, F32, FP8, FP4, I64, FP8_ROWS };

struct PlannedTensor {
  std::string name;
  Storage storage;
  int64_t rows, cols;  // logical [rows, cols]; cols = 1 for vectors
  bool vector = false;
  Fill fill = Fill::Gaussian;
  float stddev = 0;
  int64_t experts_per_token = 0;  // HashTable
};

struct StoredPiece {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t bytes;
  const PlannedTensor* source;
  bool is_scale;
};

uint64_t name_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

uint16_t to_bf16(float v) {
  uint32_t b = float_to_bits(v);
  b += 0x7fff + ((b >> 16) & 1);  // round to nearest even
  return uint16_t(b >> 16);
}

// Code of a value already on the e4m3 grid (|v| <= 448).
uint8_t e4m3_code(float v) {
  float a = std::fabs(v);
  uint8_t code = 0;
  if (a >= std::ldexp(1.0f, -6)) {
    int e;
    float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int mantissa = int((m * 2.0f - 1.0f) * 8.0f + 0.5f);
    code = uint8_t(((e - 1 + 7) << 3) | mantissa);
  } else {
    code = uint8_t(a / std::ldexp(1.0f, -9) + 0.5f);
  }
  return v < 0 ? uint8_t(code | 0x80) : code;
}

uint8_t e2m1_code(float v) {
  static const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  float a = std::fabs(v);
  uint8_t c = 0;
  for (uint8_t i = 0; i < 8; ++i)
    if (mags[i] == a) c = i;
  return v < 0 ? uint8_t(c | 8) : c;
}

uint8_t e8m0_code(float pow2) {
  int e;
  std::frexp(pow2, &e);
  return uint8_t(e - 1 + 127);
}

// Generates rows [r0, r1) of the tensor as floats (deterministic per row).
void gaussian_rows(const PlannedTensor& t, uint64_t seed, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    std::mt19937_64 rng(name_seed(t.name, seed) + uint64_t(r) * 0x9E3779B97F4A7C15ull);
    std::normal_distribution<float> n(0.0f, t.stddev);
    for (int64_t c = 0; c < t.cols; ++c) out[(r - r0) * t.cols + c] = n(rng);
  }
}

class CheckpointWriter {
 public:
  CheckpointWriter(const SyntheticSpec& spec, const ModelConfig& c) : spec_(spec), c_(c) { plan(); }

  void write(const std::string& dir, const std::function<void(int64_t, int64_t)>& progress) {
    // Shards of at most ~4 GB, like the official checkpoints.
    const int64_t shard_limit = int64_t(4) << 30;
    std::vector<std::vector<StoredPiece>> shards(1);
    int64_t size = 0;
    for (const StoredPiece& p : pieces_) {
      if (size + p.bytes > shard_limit && !shards.back().empty()) {
        shards.emplace_back();
        size = 0;
      }
      shards.back().push_back(p);
      size += p.bytes;
    }
    int64_t total = int64_t(pieces_.size()), done = 0;
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    int64_t total_size = 0;
    for (size_t s = 0; s < shards.size(); ++s) {
      std::string file = shards.size() == 1 ? "model.safetensors"
                                            : "model-" + pad(s + 1) + "-of-" + pad(shards.size()) + ".safetensors";
      json header = json::object();
      header["__metadata__"] = {{"format", "pt"}, {"generator", "dsv4 make-model"}};
      int64_t offset = 0;
      for (const StoredPiece& p : shards[s]) {
        header[p.name] = {
            {"dtype", dtype_name(p.dtype)}, {"shape", p.shape}, {"data_offsets", {offset, offset + p.bytes}}};
        offset += p.bytes;
        index["weight_map"][p.name] = file;
        total_size += p.bytes;
      }
      std::string text = header.dump();
      while (text.size() % 8) text.push_back(' ');
      fs::path path = fs::path(dir) / file;
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      if (!out) throw Error("cannot write " + path.string());
      uint64_t len = text.size();
      out.write(reinterpret_cast<const char*>(&len), 8);
      out.write(text.data(), std::streamsize(text.size()));
      for (const StoredPiece& p : shards[s]) {
        std::vector<uint8_t> bytes = generate(p);
        out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        if (!out) throw Error("failed writing " + path.string() + " (disk full?)");
        if (progress) progress(++done, total);
      }
    }
    if (shards.size() > 1) {
      index["metadata"]["total_size"] = total_size;
      std::ofstream(fs::path(dir) / "model.safetensors.index.json") << index.dump(2);
    }
  }

 private:
  static std::string pad(size_t v) {
    std::string s = std::to_string(v);
    return std::string(5 - std::min<size_t>(5, s.size()), '0') + s;
  }

  void add(const std::string& name, Storage st, int64_t rows, int64_t cols, float stddev, Fill fill = Fill::Gaussian) {
    planned_.push_back(std::make_unique<PlannedTensor>());
    PlannedTensor& t = *planned_.back();
    t = {name, st, rows, cols, cols == 0, fill, stddev, c_.n_activated_experts};
    if (t.vector) t.cols = 1;
    const PlannedTensor* src = &t;
    std::vector<int64_t> shape = t.vector ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols};
    const std::string base =
        name.size() > 7 && name.substr(name.size() - 7) == ".weight" ? name.substr(0, name.size() - 7) : name;
    switch (st) {
      case Storage::BF16: pieces_.push_back({name, DType::BF16, shape, t.rows * t.cols * 2, src, false}); break;
      case Storage::F32: pieces_.push_back({name, DType::F32, shape, t.rows * t.cols * 4, src, false}); break;
      case Storage::I64: pieces_.push_back({name, DType::I64, shape, t.rows * t.cols * 8, src, false}); break;
      case Storage::FP8: {
        const int64_t block = c_.weight_block;
        int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
        pieces_.push_back({name, DType::F8_E4M3, shape, rows * cols, src, false});
        pieces_.push_back({base + ".scale", DType::F8_E8M0, {sr, sc}, sr * sc, src, true});
        break;
      }
      case Storage::FP8_ROWS:
        pieces_.push_back({name, DType::F8_E4M3, shape, rows * cols, src, false});
        pieces_.push_back({base + ".scale", DType::F8_E8M0, {rows, cols / 32}, rows * cols / 32, src, true});
        break;
      case Storage::FP4:
        pieces_.push_back({name, DType::I8, {rows, cols / 2}, rows * cols / 2, src, false});
        pieces_.push_back({base + ".scale", DType::F8_E8M0, {rows, cols / 32}, rows * cols / 32, src, true});
        break;
    }
  }

  // Linear weights: FP8 in FP8 checkpoints, else BF16.
  void linear(const std::string& name, int64_t out, int64_t in, bool expert = false) {
    Storage st = !spec_.fp8 ? Storage::BF16 : (expert ? Storage::FP4 : Storage::FP8);
    add(name + ".weight", st, out, in, 1.0f / std::sqrt(float(in)));
  }

  void block(const std::string& p, int64_t layer) {
    const ModelConfig& c = c_;
    const int64_t D = c.dim, mix = c.hc_mix();
    const LayerLayout layout = layer_layout(c, layer);
    add(p + ".attn_norm.weight", Storage::BF16, D, 0, 0, Fill::Ones);
    add(p + ".ffn_norm.weight", Storage::BF16, D, 0, 0, Fill::Ones);
    for (const char* hc : {".hc_attn", ".hc_ffn"}) {
      add(p + hc + "_fn", Storage::F32, mix, c.hc_mult * D, 0.01f / std::sqrt(float(c.hc_mult * D)));
      add(p + hc + "_base", Storage::F32, mix, 0, 0, Fill::Zeros);
      add(p + hc + "_scale", Storage::F32, 3, 0, 0, Fill::Ones);
    }
    const std::string a = p + ".attn";
    add(a + ".attn_sink", Storage::F32, c.n_heads, 0, 0, Fill::Zeros);
    linear(a + ".wq_a", c.q_lora_rank, D);
    add(a + ".q_norm.weight", Storage::BF16, c.q_lora_rank, 0, 0, Fill::Ones);
    linear(a + ".wq_b", c.n_heads * c.head_dim, c.q_lora_rank);
    linear(a + ".wkv", c.head_dim, D);
    add(a + ".kv_norm.weight", Storage::BF16, c.head_dim, 0, 0, Fill::Ones);
    linear(a + ".wo_a", c.o_groups * c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups);
    linear(a + ".wo_b", D, c.o_groups * c.o_lora_rank);
    auto compressor = [&](const std::string& cp, int64_t r, int64_t width) {
      int64_t w2 = (layout.overlapping() ? 2 : 1) * width;
      add(cp + ".wkv.weight", Storage::BF16, w2, D, 1.0f / std::sqrt(float(D)));
      add(cp + ".wgate.weight", Storage::BF16, w2, D, 1.0f / std::sqrt(float(D)));
      add(cp + ".ape", Storage::F32, r, w2, 0.1f);
      add(cp + ".norm.weight", Storage::BF16, width, 0, 0, Fill::Ones);
    };
    if (layout.kind == LayerKind::Grouped) {
      grouped_attention(a, layout, layer);
    } else if (layout.compresses()) {
      compressor(a + ".compressor", layout.ratio, c.head_dim);
    }
    if (layout.has_indexer()) {
      linear(a + ".indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      add(a + ".indexer.weights_proj.weight", Storage::BF16, c.index_n_heads, D, 1.0f / std::sqrt(float(D)));
      compressor(a + ".indexer.compressor", layout.ratio, c.index_head_dim);
    }
    if (std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), layer) != c.engram_layer_ids.end())
      engram(p + ".engram", layer);
    const std::string f = p + ".ffn";
    const int64_t experts = c.routed_experts(layer);
    add(f + ".gate.weight", Storage::BF16, experts, D, 1.0f / std::sqrt(float(D)));
    if (layer < c.n_hash_layers)
      add(f + ".gate.tid2eid", Storage::I64, c.vocab_size, c.n_activated_experts, 0, Fill::HashTable);
    else
      add(f + ".gate.bias", Storage::F32, experts, 0, 0, Fill::Zeros);
    for (int64_t e = 0; e < experts; ++e) {
      std::string ep = f + ".experts." + std::to_string(e);
      linear(ep + ".w1", c.moe_inter_dim, D, true);
      linear(ep + ".w2", D, c.moe_inter_dim, true);
      linear(ep + ".w3", c.moe_inter_dim, D, true);
    }
    linear(f + ".shared_experts.w1", c.moe_inter_dim, D);
    linear(f + ".shared_experts.w2", D, c.moe_inter_dim);
    linear(f + ".shared_experts.w3", c.moe_inter_dim, D);
  }

  // V4.1: a KV source's compressor (gated for ratios above 1) and index
  // keys' projection; an index source's queries.
  void grouped_attention(const std::string& a, const LayerLayout& layout, int64_t layer) {
    const ModelConfig& c = c_;
    const int64_t D = c.dim;
    if (layout.kv_group == layer) {
      add(a + ".compressor.wkv.weight", Storage::BF16, c.head_dim, D, 1.0f / std::sqrt(float(D)));
      if (layout.ratio > 1)
        add(a + ".compressor.wgate.weight", Storage::BF16, c.head_dim, D, 1.0f / std::sqrt(float(D)));
      add(a + ".compressor.norm.weight", Storage::BF16, c.head_dim, 0, 0, Fill::Ones);
      add(a + ".indexer.wk.weight", Storage::BF16, c.index_head_dim, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)));
      add(a + ".indexer.k_norm.weight", Storage::BF16, c.index_head_dim, 0, 0, Fill::Ones);
    }
    if (layout.index_group == layer) {
      linear(a + ".indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      add(a + ".indexer.weights_proj.weight", Storage::BF16, c.index_n_heads, D, 1.0f / std::sqrt(float(D)));
    }
  }

  // V4.1 Engram: the hashed rows' FP8 table, their projection and the gate.
  void engram(const std::string& p, int64_t layer) {
    const ModelConfig& c = c_;
    const size_t slot = size_t(std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), layer) -
                               c.engram_layer_ids.begin());
    const int64_t columns = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    add(p + ".embed.weight", Storage::FP8_ROWS, c.engram_num_embeddings[slot], c.engram_head_dim, 1.0f);
    linear(p + ".wkv", (c.hc_mult + 1) * c.dim, columns * c.engram_head_dim);
    add(p + ".q_weight", Storage::BF16, c.hc_mult, c.dim, 0, Fill::Ones);
    add(p + ".k_weight", Storage::BF16, c.hc_mult, c.dim, 0, Fill::Ones);
  }

  void plan() {
    const ModelConfig& c = c_;
    add("embed.weight", Storage::BF16, c.vocab_size, c.dim, 1.0f);
    for (int64_t l = 0; l < c.n_layers; ++l) block("layers." + std::to_string(l), l);
    add("norm.weight", Storage::BF16, c.dim, 0, 0, Fill::Ones);
    add("head.weight", Storage::BF16, c.vocab_size, c.dim, 1.0f / std::sqrt(float(c.dim)));
    if (!c.v41) {  // V4.1 collapses with the lagged pre: no HC head
      add("hc_head_fn", Storage::F32, c.hc_mult, c.hc_mult * c.dim, 0.01f / std::sqrt(float(c.hc_mult * c.dim)));
      add("hc_head_base", Storage::F32, c.hc_mult, 0, 0, Fill::Zeros);
      add("hc_head_scale", Storage::F32, 1, 0, 0, Fill::Ones);
    }
    for (int64_t k = 0; k < c.n_mtp_layers; ++k) {
      std::string p = "mtp." + std::to_string(k);
      block(p, c.n_layers + k);
      linear(p + ".e_proj", c.dim, c.dim);
      linear(p + ".h_proj", c.dim, c.dim);
      for (const char* n : {".enorm.weight", ".hnorm.weight", ".norm.weight"})
        add(p + n, Storage::BF16, c.dim, 0, 0, Fill::Ones);
      add(p + ".hc_head_fn", Storage::F32, c.hc_mult, c.hc_mult * c.dim, 0.01f / std::sqrt(float(c.hc_mult * c.dim)));
      add(p + ".hc_head_base", Storage::F32, c.hc_mult, 0, 0, Fill::Zeros);
      add(p + ".hc_head_scale", Storage::F32, 1, 0, 0, Fill::Ones);
    }
    for (int64_t k = 0; k < c.dspark_stages; ++k) block("mtp." + std::to_string(k), c.n_layers + k);
    if (c.dspark_stages > 0) {
      const int64_t targets = int64_t(c.dspark_target_layer_ids.size()), rank = c.dspark_markov_rank;
      linear("mtp.0.main_proj", c.dim, targets * c.dim);
      add("mtp.0.main_norm.weight", Storage::BF16, c.dim, 0, 0, Fill::Ones);
      const std::string last = "mtp." + std::to_string(c.dspark_stages - 1);
      add(last + ".norm.weight", Storage::BF16, c.dim, 0, 0, Fill::Ones);
      if (!c.v41) {
        add(last + ".hc_head_fn", Storage::F32, c.hc_mult, c.hc_mult * c.dim,
            0.01f / std::sqrt(float(c.hc_mult * c.dim)));
        add(last + ".hc_head_base", Storage::F32, c.hc_mult, 0, 0, Fill::Zeros);
        add(last + ".hc_head_scale", Storage::F32, 1, 0, 0, Fill::Ones);
      }
      const std::string w1 = c.v41 ? ".markov_head.embed.weight" : ".markov_head.markov_w1.weight";
      const std::string w2 = c.v41 ? ".markov_head.head.weight" : ".markov_head.markov_w2.weight";
      add(last + w1, Storage::BF16, c.vocab_size, rank, 1.0f);
      add(last + w2, Storage::BF16, c.vocab_size, rank, 1.0f / std::sqrt(float(rank)));
      add(last + ".confidence_head.proj.weight", Storage::BF16, 1, c.dim + rank, 1.0f / std::sqrt(float(c.dim + rank)));
    }
  }

  std::vector<uint8_t> generate(const StoredPiece& p) {
    const PlannedTensor& t = *p.source;
    std::vector<uint8_t> out(size_t(p.bytes));
    const uint64_t seed = spec_.seed;
    if (t.fill == Fill::HashTable) {
      for (int64_t r = 0; r < t.rows; ++r) {
        std::mt19937_64 rng(name_seed(t.name, seed) + uint64_t(r));
        std::vector<int64_t> ids(size_t(c_.n_routed_experts));
        for (int64_t e = 0; e < c_.n_routed_experts; ++e) ids[size_t(e)] = e;
        std::shuffle(ids.begin(), ids.end(), rng);
        std::memcpy(out.data() + r * t.cols * 8, ids.data(), size_t(t.cols) * 8);
      }
      return out;
    }
    if (t.fill != Fill::Gaussian) {
      float v = t.fill == Fill::Ones ? 1.0f : 0.0f;
      for (int64_t i = 0; i < t.rows * t.cols; ++i) {
        if (t.storage == Storage::BF16) {
          uint16_t b = to_bf16(v);
          std::memcpy(out.data() + 2 * i, &b, 2);
        } else {
          std::memcpy(out.data() + 4 * i, &v, 4);
        }
      }
      return out;
    }
    // Gaussian values, generated and encoded in blocks of 128 rows.
    const int64_t block_rows = 128;
    const int64_t n_blocks = (t.rows + block_rows - 1) / block_rows;
    parallel_for(n_blocks, [&](int64_t b) {
      int64_t r0 = b * block_rows, r1 = std::min(t.rows, r0 + block_rows);
      std::vector<float> v(size_t((r1 - r0) * t.cols));
      gaussian_rows(t, seed, r0, r1, v.data());
      encode_rows(t, p, r0, r1, v.data(), out.data());
    });
    return out;
  }

  void encode_rows(const PlannedTensor& t, const StoredPiece& p, int64_t r0, int64_t r1, const float* v, uint8_t* out) {
    const int64_t cols = t.cols;
    switch (t.storage) {
      case Storage::BF16:
        for (int64_t i = 0; i < (r1 - r0) * cols; ++i) {
          uint16_t b = to_bf16(v[i]);
          std::memcpy(out + (r0 * cols + i) * 2, &b, 2);
        }
        return;
      case Storage::F32: std::memcpy(out + r0 * cols * 4, v, size_t((r1 - r0) * cols) * 4); return;
      case Storage::I64: return;
      case Storage::FP8:
      case Storage::FP8_ROWS: {
        // One scale per block (128x128 in V4, 32x32 in V4.1, 1x32 for the
        // Engram rows): the power of two that fits the block amax. The
        // generated row ranges start on block boundaries.
        const int64_t rb = t.storage == Storage::FP8_ROWS ? 1 : c_.weight_block;
        const int64_t cbw = t.storage == Storage::FP8_ROWS ? 32 : c_.weight_block;
        const int64_t sc = (cols + cbw - 1) / cbw;
        for (int64_t b0 = r0; b0 < r1; b0 += rb)
          for (int64_t cb = 0; cb < sc; ++cb) {
            const int64_t b1 = std::min(r1, b0 + rb), c0 = cb * cbw, c1 = std::min(cols, c0 + cbw);
            float amax = 1e-30f;
            for (int64_t r = b0; r < b1; ++r)
              for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[(r - r0) * cols + c]));
            float scale = pow2_ceil(amax / 448.0f);
            if (p.is_scale) {
              out[(b0 / rb) * sc + cb] = e8m0_code(scale);
              continue;
            }
            for (int64_t r = b0; r < b1; ++r)
              for (int64_t c = c0; c < c1; ++c) {
                float q = round_to_e4m3(std::clamp(v[(r - r0) * cols + c] / scale, -448.0f, 448.0f));
                out[r * cols + c] = e4m3_code(q);
              }
          }
        return;
      }
      case Storage::FP4: {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t cb = 0; cb < cols / 32; ++cb) {
            const float* x = v + (r - r0) * cols + cb * 32;
            float amax = 1e-30f;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
            float scale = pow2_ceil(amax / 6.0f);
            if (p.is_scale) {
              out[r * (cols / 32) + cb] = e8m0_code(scale);
              continue;
            }
            for (int i = 0; i < 32; i += 2) {
              uint8_t lo = e2m1_code(round_to_e2m1(std::clamp(x[i] / scale, -6.0f, 6.0f)));
              uint8_t hi = e2m1_code(round_to_e2m1(std::clamp(x[i + 1] / scale, -6.0f, 6.0f)));
              out[r * (cols / 2) + cb * 16 + i / 2] = uint8_t(lo | (hi << 4));
            }
          }
        return;
      }
    }
  }

  const SyntheticSpec& spec_;
  const ModelConfig& c_;
  std::vector<std::unique_ptr<PlannedTensor>> planned_;
  std::vector<StoredPiece> pieces_;
};

}  // namespace

void write_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& dir, const std::string& tokenizer_dir,
                                const std::function<void(int64_t, int64_t)>& progress) {
  json config = synthetic_config(spec);
  ModelConfig c = parse_config(config.dump(), "synthetic config");
  fs::create_directories(dir);
  {
    std::ofstream out(fs::path(dir) / "config.json");
    out << config.dump(2) << "\n";
    if (!out) throw Error("cannot write " + (fs::path(dir) / "config.json").string());
  }
  CheckpointWriter(spec, c).write(dir, progress);
  if (!tokenizer_dir.empty())
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::path src = fs::path(tokenizer_dir) / f;
      if (!fs::exists(src)) throw Error("tokenizer file missing: " + src.string());
      if (c.v41 && std::string(f) == "tokenizer.json")
        write_v41_tokenizer(src.string(), (fs::path(dir) / f).string());
      else
        fs::copy_file(src, fs::path(dir) / f, fs::copy_options::overwrite_existing);
    }
}

}  // namespace dsv4
