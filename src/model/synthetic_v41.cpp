// Synthetic DeepSeek-V4.1 checkpoints (the v41 and smoke-v41 presets of
// `dsv4 make-model`): the V4.1 config layout (a root with text_config and
// the quantization, 32x32 FP8 blocks), a layer schedule that has every role
// of the released one, Engram layers and a DSpark head.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/config.h"
#include "model/engram.h"
#include "model/synthetic.h"

namespace dsv4 {
using nlohmann::json;

namespace {

// Layer roles of an n-layer slice, in the released schedule's order: a
// ratio-2 group (its first layer the KV and index source, the others
// reusing them), then a ratio-1 group whose source is also the candidate
// source, with a re-indexing layer every fourth layer after it (layers 24,
// 28, 32 and 36 of the 40). The released model adds two window-only layers
// in front; a slice of more than 8 layers keeps them too.
struct Schedule {
  std::vector<int64_t> ratios, kv_sources, index_sources, engram;
  int64_t candidate_source = -1;
};

Schedule schedule(int64_t n) {
  Schedule s;
  const int64_t window = n > 8 ? 2 : 0, rest = n - window, ratio2 = (rest + 1) / 2;
  for (int64_t l = 0; l < n; ++l) {
    if (l < window) {
      s.ratios.push_back(0);
      continue;
    }
    const bool first_group = l < window + ratio2;
    s.ratios.push_back(first_group ? 2 : 1);
    const int64_t group_start = first_group ? window : window + ratio2;
    if (l == group_start) s.kv_sources.push_back(l), s.index_sources.push_back(l);
    if (!first_group && l > group_start && (l - group_start) % 4 == 0) s.index_sources.push_back(l);
    if (!first_group && l == group_start) s.candidate_source = l;
  }
  // Engram before the first layer and before the middle of the first group
  // (the released model: layers 1 and 14).
  s.engram.push_back(window > 0 ? 1 : 0);
  if (n > 1) s.engram.push_back(std::max<int64_t>(s.engram[0] + 1, window + ratio2 / 2));
  return s;
}

}  // namespace

json synthetic_config_v41(const SyntheticSpec& spec) {
  const bool smoke = spec.preset == "smoke-v41";
  const int64_t layers = spec.layers > 0 ? spec.layers : (smoke ? 4 : 2);
  const Schedule s = schedule(layers);
  json t = synthetic_text_fields();
  t["rope_scaling"]["rope_type"] = "yarn";
  t.update({{"model_type", "deepseek_v41_text"},
            {"rms_norm_eps", 1e-20},
            {"routed_scaling_factor", 1.5},
            {"num_hidden_layers", layers},
            {"num_nextn_predict_layers", 3},
            {"kv_source_layer_ids", s.kv_sources},
            {"index_source_layer_ids", s.index_sources},
            {"engram_layer_ids", s.engram},
            {"engram_max_ngram_size", 4},
            {"engram_pad_token_id", 2},
            {"engram_compressed_vocab_size", 99092},  // the V4.1 tokenizer's classes
            {"dspark_block_size", 5},
            {"dspark_noise_token_id", 128799},
            {"dspark_target_layer_ids",
             {std::max<int64_t>(0, layers - 3), std::max<int64_t>(0, layers - 2), layers - 1}}});
  if (s.candidate_source >= 0) t["candidate_source_layer_id"] = s.candidate_source;
  if (smoke) {
    t.update({{"hidden_size", 256},
              {"num_attention_heads", 4},
              {"head_dim", 128},
              {"q_lora_rank", 128},
              {"o_groups", 2},
              {"o_lora_rank", 64},
              {"index_n_heads", 4},
              {"index_head_dim", 64},
              {"index_topk", 64},
              {"candidate_topk_blocks", 16},
              {"candidate_block_size", 8},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 256},
              {"engram_n_heads", 4},
              {"engram_head_dim", 32},
              {"engram_vocab_size", 64},
              {"dspark_markov_rank", 32},
              {"dspark_n_routed_experts", 4},
              {"dspark_num_experts_per_tok", 2}});
  } else {
    // The released V4.1-Flash dimensions. The Engram tables start their
    // prime search at 16000 instead of 16,000,000 rows (about 100 MB per
    // layer instead of 98 GB): a token reads 24 rows either way.
    t.update({{"hidden_size", 5120},
              {"num_attention_heads", 64},
              {"head_dim", 512},
              {"q_lora_rank", 1280},
              {"o_groups", 8},
              {"o_lora_rank", 1024},
              {"index_n_heads", 32},
              {"index_head_dim", 128},
              {"index_topk", 512},
              {"candidate_topk_blocks", 2048},
              {"candidate_block_size", 8},
              {"n_routed_experts", 384},
              {"num_experts_per_tok", 6},
              {"moe_intermediate_size", 2304},
              {"engram_n_heads", 8},
              {"engram_head_dim", 256},
              {"engram_vocab_size", 16000},
              {"dspark_markov_rank", 256},
              {"dspark_n_routed_experts", 128},
              {"dspark_num_experts_per_tok", 3}});
  }
  std::vector<int64_t> ratios = s.ratios;
  for (int i = 0; i < 3; ++i) ratios.push_back(0);  // the DSpark stages
  t["compress_ratios"] = ratios;
  // Each Engram table has exactly the rows of its hash columns' primes.
  ModelConfig primes_of;
  primes_of.engram_layer_ids = s.engram;
  primes_of.engram_max_ngram_size = t["engram_max_ngram_size"];
  primes_of.engram_n_heads = t["engram_n_heads"];
  primes_of.engram_vocab_size = t["engram_vocab_size"];
  std::vector<int64_t> rows;
  for (const auto& layer : engram_primes(primes_of)) {
    int64_t sum = 0;
    for (int64_t p : layer) sum += p;
    rows.push_back(sum);
  }
  t["engram_num_embeddings"] = rows;
  json c = {{"architectures", {"DeepseekV41ForCausalLM"}},
            {"model_type", "deepseek_v41"},
            {"bos_token_id", 0},
            {"eos_token_id", 1},
            {"pad_token_id", 2},
            {"image_token_id", 129264},
            {"dtype", "bfloat16"},
            {"text_config", t}};
  if (!spec.fp8) throw Error("the V4.1 presets are FP8 (32x32 blocks) with FP4 experts only");
  c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"expert_dtype", "fp4"},  {"quant_method", "fp8"},
                              {"scale_fmt", "ue8m0"},           {"weight_block_size", {32, 32}}};
  return c;
}

void write_v41_tokenizer(const std::string& v4_tokenizer_json, const std::string& out_path) {
  std::ifstream in(v4_tokenizer_json);
  if (!in) throw Error("cannot read " + v4_tokenizer_json);
  json j = json::parse(in);
  // V4.1 renamed two special tokens of the V4 vocabulary.
  for (auto& token : j["added_tokens"]) {
    if (token["id"] == 128799) token["content"] = "<｜System｜>";
    if (token["id"] == 129264) token["content"] = "<｜deepseek_image｜>";
  }
  std::ofstream out(out_path);
  out << j.dump();
  if (!out) throw Error("cannot write " + out_path);
}

}  // namespace dsv4
