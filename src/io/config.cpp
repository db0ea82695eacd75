#include "io/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace dsv4 {
using nlohmann::json;

namespace {

struct Reader {
  const json& j;
  const std::string& origin;

  const json& need(const char* key) const {
    if (!j.contains(key)) throw Error(origin + ": missing field \"" + key + "\"");
    return j.at(key);
  }
  int64_t integer(const char* key, int64_t min_value = 1) const {
    const json& v = need(key);
    if (!v.is_number_integer()) throw Error(origin + ": field \"" + key + "\" must be an integer");
    int64_t x = v.get<int64_t>();
    if (x < min_value)
      throw Error(origin + ": field \"" + key + "\" = " + std::to_string(x) + " is below " + std::to_string(min_value));
    return x;
  }
  int64_t integer_or(const char* key, int64_t fallback, int64_t min_value = 0) const {
    return j.contains(key) ? integer(key, min_value) : fallback;
  }
  double number(const char* key) const {
    const json& v = need(key);
    if (!v.is_number()) throw Error(origin + ": field \"" + key + "\" must be a number");
    return v.get<double>();
  }
  double number_or(const char* key, double fallback) const { return j.contains(key) ? number(key) : fallback; }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_string()) throw Error(origin + ": field \"" + key + "\" must be a string");
    return j.at(key).get<std::string>();
  }
};

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}


std::vector<int64_t> int_list(const json& j, const char* key, const std::string& origin) {
  std::vector<int64_t> out;
  if (!j.contains(key)) return out;
  if (!j[key].is_array()) throw Error(origin + ": field \"" + key + "\" must be a list of integers");
  for (auto& v : j[key]) {
    if (!v.is_number_integer()) throw Error(origin + ": field \"" + key + "\" must be a list of integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// The V4.1 layer roles, candidate filter, Engram and DSpark MoE fields, and
// the relations between them that the forward pass relies on.
void parse_v41_fields(const json& j, const Reader& r, ModelConfig& c, const std::string& origin) {
  auto layer_ids = [&](const char* key) {
    std::vector<int64_t> ids = int_list(j, key, origin);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= c.n_layers)
        throw Error(origin + ": " + key + " holds " + std::to_string(ids[i]) + ", not a main layer");
      if (i > 0 && ids[i] <= ids[i - 1]) throw Error(origin + ": " + key + " must be strictly increasing");
    }
    return ids;
  };
  c.kv_source_layer_ids = layer_ids("kv_source_layer_ids");
  c.index_source_layer_ids = layer_ids("index_source_layer_ids");
  c.candidate_source_layer_id = r.integer_or("candidate_source_layer_id", -1, -1);
  if (c.candidate_source_layer_id >= 0) {
    c.candidate_topk_blocks = r.integer("candidate_topk_blocks");
    c.candidate_block_size = r.integer("candidate_block_size");
  }
  c.dspark_n_routed_experts = r.integer_or("dspark_n_routed_experts", 0);
  c.dspark_n_activated_experts = r.integer_or("dspark_num_experts_per_tok", 0);
  require(c.dspark_n_activated_experts <= c.routed_experts(c.n_layers),
          origin + ": dspark_num_experts_per_tok exceeds dspark_n_routed_experts");

  // Every compressed layer reads the compressed rows of the latest KV source
  // at or before it and the selection of the latest index source; both must
  // exist and share its ratio (rows are addressed by position div ratio).
  auto contains = [](const std::vector<int64_t>& ids, int64_t l) {
    return std::find(ids.begin(), ids.end(), l) != ids.end();
  };
  int64_t kv_source = -1, index_source = -1;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t m = c.ratio(l);
    if (contains(c.kv_source_layer_ids, l)) {
      require(m > 0, origin + ": KV source layer " + std::to_string(l) + " has compress ratio 0");
      kv_source = l;
    }
    if (contains(c.index_source_layer_ids, l)) {
      require(m > 0, origin + ": index source layer " + std::to_string(l) + " has compress ratio 0");
      index_source = l;
    }
    if (m == 0) continue;
    require(kv_source >= 0 && c.ratio(kv_source) == m,
            origin + ": compressed layer " + std::to_string(l) + " (ratio " + std::to_string(m) +
                ") has no KV source of its ratio at or before it (kv_source_layer_ids)");
    require(index_source >= 0 && c.ratio(index_source) == m,
            origin + ": compressed layer " + std::to_string(l) + " (ratio " + std::to_string(m) +
                ") has no index source of its ratio at or before it (index_source_layer_ids)");
  }
  for (int64_t l : c.kv_source_layer_ids)
    require(contains(c.index_source_layer_ids, l),
            origin + ": KV source layer " + std::to_string(l) + " must also be an index source (it publishes index keys)");
  if (c.candidate_source_layer_id >= 0)
    require(contains(c.index_source_layer_ids, c.candidate_source_layer_id),
            origin + ": candidate_source_layer_id must be an index source layer");

  c.engram_layer_ids = layer_ids("engram_layer_ids");
  if (!c.engram_layer_ids.empty()) {
    c.engram_num_embeddings = int_list(j, "engram_num_embeddings", origin);
    require(c.engram_num_embeddings.size() == c.engram_layer_ids.size(),
            origin + ": engram_num_embeddings needs one entry per Engram layer");
    c.engram_max_ngram_size = r.integer("engram_max_ngram_size", 2);
    c.engram_n_heads = r.integer("engram_n_heads");
    c.engram_head_dim = r.integer("engram_head_dim");
    c.engram_vocab_size = r.integer("engram_vocab_size", 2);
    c.engram_pad_token_id = r.integer_or("engram_pad_token_id", r.integer_or("engram_pad_id", 2));
    c.engram_compressed_vocab_size = r.integer("engram_compressed_vocab_size");
    require(c.engram_head_dim % 32 == 0, origin + ": engram_head_dim must be a multiple of 32 (FP8 row scales)");
    require(c.engram_pad_token_id < c.vocab_size, origin + ": engram_pad_token_id is outside the vocabulary");
  }
}
}  // namespace

ModelConfig parse_config(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(origin + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(origin + ": not a JSON object");
  // V4.1 nests the language model under text_config (Hugging Face
  // spellings); the root keeps the architecture, the special token ids and
  // the quantization. Merge them into one object and read it like V4's.
  ModelConfig c;
  if (j.contains("text_config") && j["text_config"].is_object()) {
    json merged = j["text_config"];
    for (const char* key : {"architectures", "bos_token_id", "eos_token_id", "quantization_config"})
      if (j.contains(key) && !merged.contains(key)) merged[key] = j[key];
    c.has_vision = j.contains("vision_config") && j["vision_config"].is_object();
    const std::string root_type = j.value("model_type", "");
    // The V4.1 model card spells it deepseek_v4.1; the config files deepseek_v41.
    if (root_type != "deepseek_v41" && root_type != "deepseek_v4.1")
      throw Error(origin + ": unsupported model_type \"" + root_type + "\" with text_config (supported: deepseek_v41)");
    const std::string text_type = merged.value("model_type", "deepseek_v41_text");
    if (text_type != "deepseek_v41_text" && text_type != "deepseek_v4.1_text")
      throw Error(origin + ": unsupported text_config.model_type \"" + text_type + "\" (supported: deepseek_v41_text)");
    merged["model_type"] = "deepseek_v41";
    j = std::move(merged);
  }
  Reader r{j, origin};
  c.model_type = r.string_or("model_type", "");
  if (c.model_type != "deepseek_v4" && c.model_type != "deepseek_v41")
    throw Error(origin + ": unsupported model_type \"" + c.model_type + "\" (supported: deepseek_v4, deepseek_v41)");
  c.v41 = c.model_type == "deepseek_v41";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    c.architecture = j["architectures"][0].get<std::string>();
  // A V4.1 checkpoint may also carry the V4 architecture name.
  if (!c.architecture.empty() && c.architecture != "DeepseekV4ForCausalLM" &&
      !(c.v41 && c.architecture == "DeepseekV41ForCausalLM"))
    throw Error(origin + ": unsupported architecture \"" + c.architecture + "\"");
  if (!c.v41)
    for (const char* key : {"engram_layer_ids", "kv_source_layer_ids", "vision_config"})
      if (j.contains(key))
        throw Error(origin + ": feature \"" + key + "\" belongs to DeepSeek-V4.1 (model_type deepseek_v41 with a text_config)");

  c.vocab_size = r.integer("vocab_size");
  c.dim = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_mtp_layers = r.integer_or("num_nextn_predict_layers", 0);
  c.n_heads = r.integer("num_attention_heads");
  c.head_dim = r.integer("head_dim");
  c.rope_dim = r.integer("qk_rope_head_dim");
  c.q_lora_rank = r.integer("q_lora_rank");
  c.o_groups = r.integer("o_groups");
  c.o_lora_rank = r.integer("o_lora_rank");
  c.window = r.integer("sliding_window");
  c.rope_theta = r.number("rope_theta");
  c.compress_rope_theta = r.number_or("compress_rope_theta", c.rope_theta);
  c.index_n_heads = r.integer("index_n_heads");
  c.index_head_dim = r.integer("index_head_dim");
  c.index_topk = r.integer("index_topk");
  c.n_routed_experts = r.integer("n_routed_experts");
  c.n_activated_experts = r.integer("num_experts_per_tok");
  c.n_shared_experts = r.integer("n_shared_experts");
  c.moe_inter_dim = r.integer("moe_intermediate_size");
  c.route_scale = r.number("routed_scaling_factor");
  c.n_hash_layers = r.integer_or("num_hash_layers", 0);
  c.swiglu_limit = float(r.number_or("swiglu_limit", 0.0));
  c.hc_mult = r.integer("hc_mult");
  c.hc_sinkhorn_iters = r.integer("hc_sinkhorn_iters");
  c.hc_eps = float(r.number("hc_eps"));
  c.norm_eps = float(r.number("rms_norm_eps"));
  c.bos_token_id = r.integer_or("bos_token_id", 0);
  c.eos_token_id = r.integer_or("eos_token_id", 1);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 1 << 20, 1);

  if (r.integer_or("num_key_value_heads", 1, 1) != 1)
    throw Error(origin + ": num_key_value_heads must be 1 (single shared K=V latent)");
  std::string scoring = r.string_or("scoring_func", "sqrtsoftplus");
  if (scoring != "sqrtsoftplus")
    throw Error(origin + ": scoring_func \"" + scoring + "\" is not supported (sqrtsoftplus only)");
  std::string topk_method = r.string_or("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc")
    throw Error(origin + ": topk_method \"" + topk_method + "\" is not supported (noaux_tc only)");
  if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].get<bool>())
    throw Error(origin + ": norm_topk_prob=false is not supported");
  std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu") throw Error(origin + ": hidden_act \"" + act + "\" is not supported");
  if (j.value("tie_word_embeddings", false)) throw Error(origin + ": tie_word_embeddings=true is not supported");
  if (j.value("attention_bias", false)) throw Error(origin + ": attention_bias=true is not supported");

  const json& ratios = r.need("compress_ratios");
  if (!ratios.is_array()) throw Error(origin + ": compress_ratios must be a list");
  for (auto& v : ratios) {
    if (!v.is_number_integer()) throw Error(origin + ": compress_ratios must hold integers");
    int64_t m = v.get<int64_t>();
    // V4.1 groups layers by ratio (1 and 2 in the released schedule); V4
    // has CSA (4) and HCA (powers of two above 4).
    if (c.v41 ? m < 0 : (m != 0 && m != 4 && m != 128 && !(m > 4 && (m & (m - 1)) == 0)))
      throw Error(origin + ": compress ratio " + std::to_string(m) +
                  (c.v41 ? " is not supported (negative)" : " is not supported (0, 4 with overlap, or a power of two above 4)"));
    c.compress_ratios.push_back(m);
  }
  if (j.contains("dspark_block_size")) {
    // The refreshed checkpoints: the stages follow the main layers in
    // compress_ratios, and mtp.* holds them instead of an MTP head.
    c.n_mtp_layers = 0;
    c.dspark_block_size = r.integer("dspark_block_size", 1);
    c.dspark_noise_token_id = r.integer("dspark_noise_token_id", 0);
    c.dspark_markov_rank = r.integer("dspark_markov_rank", 1);
    const json& targets = r.need("dspark_target_layer_ids");
    if (!targets.is_array() || targets.empty())
      throw Error(origin + ": dspark_target_layer_ids must be a non-empty list");
    for (auto& v : targets) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.n_layers)
        throw Error(origin + ": dspark_target_layer_ids must hold main-layer ids in [0, " + std::to_string(c.n_layers) +
                    ")");
      c.dspark_target_layer_ids.push_back(v.get<int64_t>());
    }
    c.dspark_stages = int64_t(c.compress_ratios.size()) - c.n_layers;
    require(c.dspark_stages >= 1, origin +
                                      ": compress_ratios has no entries for the DSpark stages (one 0 per stage "
                                      "after the main layers)");
    require(c.dspark_noise_token_id < c.vocab_size, origin + ": dspark_noise_token_id is outside the vocabulary");
  }
  require(int64_t(c.compress_ratios.size()) == c.n_layers + c.n_mtp_layers + c.dspark_stages,
          origin + ": compress_ratios has " + std::to_string(c.compress_ratios.size()) +
              " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
              std::to_string(c.n_layers + c.n_mtp_layers));
  for (int64_t l = c.n_layers; l < c.n_layers + c.n_mtp_layers + c.dspark_stages; ++l)
    require(c.compress_ratios[size_t(l)] == 0,
            origin + (c.dspark_stages > 0 ? ": DSpark stages must have compress ratio 0"
                                          : ": MTP layers must have compress ratio 0"));
  require(c.n_mtp_layers <= 1,
          origin + ": num_nextn_predict_layers " + std::to_string(c.n_mtp_layers) + " > 1 is not supported yet");

  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const json& rs = j["rope_scaling"];
    std::string type = rs.value("type", rs.value("rope_type", "yarn"));
    if (type != "yarn") throw Error(origin + ": rope_scaling type \"" + type + "\" is not supported");
    Reader rr{rs, origin};
    c.rope_factor = rr.number("factor");
    c.original_seq_len = rr.integer("original_max_position_embeddings");
    c.beta_fast = rr.number_or("beta_fast", 32);
    c.beta_slow = rr.number_or("beta_slow", 1);
  }

  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    std::string method = q.value("quant_method", "");
    std::string fmt = q.value("fmt", "e4m3");
    std::string scale_fmt = q.value("scale_fmt", "ue8m0");
    if (method != "fp8") throw Error(origin + ": quant_method \"" + method + "\" is not supported (fp8 only)");
    if (fmt != "e4m3") throw Error(origin + ": quantization fmt \"" + fmt + "\" is not supported (e4m3 only)");
    if (scale_fmt != "ue8m0") throw Error(origin + ": scale_fmt \"" + scale_fmt + "\" is not supported (ue8m0 only)");
    auto block = q.value("weight_block_size", std::vector<int64_t>{128, 128});
    if (block != std::vector<int64_t>{128, 128} && !(c.v41 && block == std::vector<int64_t>{32, 32}))
      throw Error(origin + ": weight_block_size [" + std::to_string(block.empty() ? 0 : block[0]) + ", ...] is not " +
                  "supported ([128, 128]; [32, 32] for DeepSeek-V4.1)");
    c.fp8_weights = true;
    c.weight_block = block[0];
    if (q.contains("expert_dtype") && q["expert_dtype"].is_string() && !j.contains("expert_dtype"))
      j["expert_dtype"] = q["expert_dtype"];
  }
  // V4.1 rounds every quantized product's input in 32-blocks (V4: 128).
  c.activation_block = c.v41 ? 32 : 128;
  c.expert_dtype = r.string_or("expert_dtype", "");
  if (!c.expert_dtype.empty() && c.expert_dtype != "fp4" && c.expert_dtype != "fp8")
    throw Error(origin + ": expert_dtype \"" + c.expert_dtype + "\" is not supported");

  if (c.v41) parse_v41_fields(j, r, c, origin);

  // Shape relations the forward pass relies on.
  require(c.rope_dim % 2 == 0 && c.rope_dim < c.head_dim,
          origin + ": qk_rope_head_dim must be even and below head_dim");
  require(c.rope_dim <= c.index_head_dim, origin + ": index_head_dim must hold the RoPE dims");
  require(c.n_heads % c.o_groups == 0, origin + ": num_attention_heads must be a multiple of o_groups");
  require(c.n_shared_experts == 1, origin + ": n_shared_experts must be 1");
  require(c.n_activated_experts <= c.n_routed_experts, origin + ": num_experts_per_tok exceeds n_routed_experts");
  require(c.n_hash_layers <= c.n_layers, origin + ": num_hash_layers exceeds num_hidden_layers");
  require(c.v41 || (c.index_head_dim & (c.index_head_dim - 1)) == 0,
          origin + ": index_head_dim must be a power of two (Hadamard)");
  require(c.index_head_dim % 32 == 0, origin + ": index_head_dim must be a multiple of 32 (FP4 blocks)");
  require(c.v41 ? c.head_dim % 32 == 0 : c.nope_dim() % 64 == 0,
          origin + (c.v41 ? ": head_dim must be a multiple of 32 (FP8 KV blocks)"
                          : ": head_dim - qk_rope_head_dim must be a multiple of 64 (FP8 KV blocks)"));
  require(c.hc_mult >= 1 && c.hc_mult <= 16, origin + ": hc_mult out of range");
  return c;
}

ModelConfig load_config(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  std::ifstream in(file);
  if (!in) throw Error("cannot read " + file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), file.string());
}

}  // namespace dsv4
