// DeepSeek-V4 model configuration read from a Hugging Face config.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

struct ModelConfig {
  std::string model_type;
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t dim = 0;           // hidden_size
  int64_t n_layers = 0;      // num_hidden_layers (main layers)
  int64_t n_mtp_layers = 0;  // num_nextn_predict_layers
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;  // qk_rope_head_dim
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t window = 0;                    // sliding_window
  std::vector<int64_t> compress_ratios;  // n_layers + n_mtp_layers + dspark_stages entries
  double rope_theta = 0, compress_rope_theta = 0;
  double rope_factor = 1;
  int64_t original_seq_len = 0;
  double beta_fast = 32, beta_slow = 1;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t n_routed_experts = 0, n_activated_experts = 0, n_shared_experts = 0;
  int64_t moe_inter_dim = 0;
  double route_scale = 1;
  int64_t n_hash_layers = 0;
  float swiglu_limit = 0;
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  float hc_eps = 0, norm_eps = 0;
  int64_t bos_token_id = 0, eos_token_id = 1;
  int64_t max_position_embeddings = 0;
  // DSpark draft head of the refreshed checkpoints (V4-Flash-0731,
  // V4-Pro-0813): `dspark_stages` window-only blocks stored as mtp.0 ..
  // mtp.{stages-1} (compress_ratios ends with one 0 per stage), reading the
  // main model's hidden states of `dspark_target_layer_ids`. Such a
  // checkpoint has no MTP head (its legacy num_nextn_predict_layers is
  // ignored). 0 stages: no DSpark head.
  int64_t dspark_stages = 0, dspark_block_size = 0, dspark_noise_token_id = 0, dspark_markov_rank = 0;
  std::vector<int64_t> dspark_target_layer_ids;
  bool fp8_weights = false;  // quantization_config present (fp8 e4m3, ue8m0 block scales)
  std::string expert_dtype;  // "fp4", "fp8" or "" (same as the other linears)
  // FP8 weight blocks (128x128 in V4, 32x32 in V4.1) and the width of the
  // FP8 blocks the reference rounds a quantized product's input through.
  int64_t weight_block = 128, activation_block = 128;

  // ---- DeepSeek-V4.1 (docs/v41.md). `v41` switches the differences that
  // are not layer roles: no per-head query norm, window rows rounded whole
  // in 32-blocks, compressed rows in FP4 with E4M3 scales, the lagged HC
  // pre and no HC head, DSpark reading the target layers' inputs.
  bool v41 = false;
  // Layers that compress their own KV (and publish index keys), layers that
  // run their own indexer queries; every other compressed layer reuses the
  // latest of each. The candidate source's block scores restrict the top-k
  // of the index sources after it (-1: no candidate pre-filtering).
  std::vector<int64_t> kv_source_layer_ids, index_source_layer_ids;
  int64_t candidate_source_layer_id = -1, candidate_topk_blocks = 0, candidate_block_size = 0;
  // Engram: n-gram hash memory added to the residual before these layers.
  std::vector<int64_t> engram_layer_ids, engram_num_embeddings;
  int64_t engram_max_ngram_size = 0, engram_n_heads = 0, engram_head_dim = 0, engram_vocab_size = 0;
  int64_t engram_pad_token_id = 0, engram_compressed_vocab_size = 0;
  // DSpark's own MoE size (0: the main model's).
  int64_t dspark_n_routed_experts = 0, dspark_n_activated_experts = 0;
  bool has_vision = false;  // vision_config present: its tensors are skipped (text only)

  // Routed experts of layer `layer` (the DSpark stages may have their own).
  int64_t routed_experts(int64_t layer) const {
    return layer >= n_layers && dspark_n_routed_experts > 0 ? dspark_n_routed_experts : n_routed_experts;
  }
  int64_t activated_experts(int64_t layer) const {
    return layer >= n_layers && dspark_n_activated_experts > 0 ? dspark_n_activated_experts : n_activated_experts;
  }
  bool has_engram() const { return !engram_layer_ids.empty(); }

  int64_t ratio(int64_t layer) const { return compress_ratios.at(size_t(layer)); }
  int64_t nope_dim() const { return head_dim - rope_dim; }
  int64_t hc_mix() const { return (2 + hc_mult) * hc_mult; }
};

// Parses and validates config.json (a file or a directory holding it). Every
// field the forward pass uses is checked; unsupported model types or features
// are refused with a message that names them.
ModelConfig load_config(const std::string& path);
ModelConfig parse_config(const std::string& json_text, const std::string& origin);

}  // namespace dsv4
