#include "io/config.h"

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

}  // namespace

ModelConfig parse_config(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(origin + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(origin + ": not a JSON object");
  // V4.1-style configs nest the language model under text_config.
  if (j.contains("text_config") && j["text_config"].is_object()) {
    std::string type = j.value("model_type", "");
    throw Error(origin + ": model_type \"" + type + "\" (DeepSeek-V4.1 with text_config) is not supported yet");
  }
  Reader r{j, origin};
  ModelConfig c;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type != "deepseek_v4")
    throw Error(origin + ": unsupported model_type \"" + c.model_type + "\" (supported: deepseek_v4)");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    c.architecture = j["architectures"][0].get<std::string>();
  if (!c.architecture.empty() && c.architecture != "DeepseekV4ForCausalLM")
    throw Error(origin + ": unsupported architecture \"" + c.architecture + "\"");
  for (const char* key : {"engram_layer_ids", "kv_source_layer_ids", "vision_config"})
    if (j.contains(key)) throw Error(origin + ": feature \"" + key + "\" is not supported yet (V4.1 checkpoints)");

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
    if (m != 0 && m != 4 && m != 128 && !(m > 4 && (m & (m - 1)) == 0))
      throw Error(origin + ": compress ratio " + std::to_string(m) +
                  " is not supported (0, 4 with overlap, or a power of two above 4)");
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
    if (block != std::vector<int64_t>{128, 128})
      throw Error(origin + ": weight_block_size other than [128, 128] is not supported");
    c.fp8_weights = true;
  }
  c.expert_dtype = r.string_or("expert_dtype", "");
  if (!c.expert_dtype.empty() && c.expert_dtype != "fp4" && c.expert_dtype != "fp8")
    throw Error(origin + ": expert_dtype \"" + c.expert_dtype + "\" is not supported");

  // Shape relations the forward pass relies on.
  require(c.rope_dim % 2 == 0 && c.rope_dim < c.head_dim,
          origin + ": qk_rope_head_dim must be even and below head_dim");
  require(c.rope_dim <= c.index_head_dim, origin + ": index_head_dim must hold the RoPE dims");
  require(c.n_heads % c.o_groups == 0, origin + ": num_attention_heads must be a multiple of o_groups");
  require(c.n_shared_experts == 1, origin + ": n_shared_experts must be 1");
  require(c.n_activated_experts <= c.n_routed_experts, origin + ": num_experts_per_tok exceeds n_routed_experts");
  require(c.n_hash_layers <= c.n_layers, origin + ": num_hash_layers exceeds num_hidden_layers");
  require((c.index_head_dim & (c.index_head_dim - 1)) == 0,
          origin + ": index_head_dim must be a power of two (Hadamard)");
  require(c.index_head_dim % 32 == 0, origin + ": index_head_dim must be a multiple of 32 (FP4 blocks)");
  require(c.nope_dim() % 64 == 0, origin + ": head_dim - qk_rope_head_dim must be a multiple of 64 (FP8 KV blocks)");
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
