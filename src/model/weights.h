// The DeepSeek-V4 weights bound to checkpoint tensors, with every name, shape
// and dtype checked against the config before the first forward pass.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/backend.h"
#include "kernels/linear.h"
#include "model/layer_kind.h"

namespace dsv4 {

struct HyperConnectionWeights {
  Linear fn;                 // [mix, hc_mult * dim] fp32
  std::vector<float> base;   // [mix]
  std::vector<float> scale;  // [3] for blocks, [1] for heads
};

struct CompressorWeights {
  int64_t ratio = 0;
  int64_t width = 0;        // output row width (512 main, index_head_dim indexer)
  bool overlap = false;     // ratio 4: each token feeds two rows
  Linear wkv, wgate;        // [(1+overlap)*width, dim], computed in fp32
  std::vector<float> ape;   // [ratio, (1+overlap)*width]
  std::vector<float> norm;  // [width]
};

struct IndexerWeights {
  Linear wq_b;          // [index_heads*index_dim, q_lora]
  Linear weights_proj;  // [index_heads, dim]
  CompressorWeights compressor;
  // V4.1 KV sources: index keys = k_norm(wk . compressed latent).
  Linear wk;  // [index_dim, head_dim]
  std::vector<float> k_norm;
};

struct AttentionWeights {
  std::vector<float> sink;  // [heads]
  Linear wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm;
  bool has_compressor = false, has_indexer = false;
  CompressorWeights compressor;
  IndexerWeights indexer;
};

struct ExpertWeights {
  Linear w1, w2, w3;
};

struct MoeWeights {
  bool hash_routed = false;
  int64_t top_k = 0;             // experts per token (the DSpark stages may have their own)
  Linear gate;                   // [experts, dim] router, fp32 compute
  std::vector<float> bias;       // [experts] selection-only bias (score routing)
  std::vector<int32_t> tid2eid;  // [vocab, top_k] (hash routing)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

// V4.1 Engram of one layer: the hashed rows' table, the projection of the
// concatenated rows into one key per HC copy and a value, and the gate's
// weights (q_weight * k_weight, only ever used as that product).
struct EngramWeights {
  EngramTable table;
  Linear wkv;                 // [(hc_mult + 1) * dim, hash columns * head_dim]
  std::vector<float> weight;  // [hc_mult, dim]
};

struct BlockWeights {
  int64_t layer_id = 0;
  LayerLayout layout;
  std::optional<EngramWeights> engram;
  std::vector<float> attn_norm, ffn_norm;
  HyperConnectionWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights moe;
};

struct MtpWeights {
  BlockWeights block;
  Linear e_proj, h_proj;
  std::vector<float> enorm, hnorm, norm;
  HyperConnectionWeights hc_head;
};

// The DSpark draft head of the refreshed checkpoints: window-only stage
// blocks (mtp.0 ..), the projection of the target layers' hidden states
// (stage 0), and the last stage's norm, HC head, Markov head (W1 embeds a
// drafted token into `dspark_markov_rank` dims, W2 projects back onto the
// vocabulary) and confidence head. The stages share embed and head.
struct DsparkWeights {
  std::vector<BlockWeights> stages;
  Linear main_proj;  // [dim, targets * dim]
  std::vector<float> main_norm, norm;
  HyperConnectionWeights hc_head;
  Linear markov_w1, markov_w2;  // [vocab, rank] each (V4.1: markov_head.embed / .head)
  Linear confidence;            // [1, dim + rank]
};

struct ModelWeights {
  Linear embed, head;
  std::vector<float> norm;
  HyperConnectionWeights hc_head;
  std::vector<BlockWeights> layers;
  std::vector<MtpWeights> mtp;
  std::optional<DsparkWeights> dspark;
  int64_t total_bytes = 0;  // bytes of all bound tensors
  // Weights converted at load (V4.1's 32x32-block FP8 expanded to BF16,
  // exactly); the Linears above point into them.
  std::vector<std::unique_ptr<uint16_t[]>> converted;
  int64_t converted_bytes = 0;
  // The mapped bytes the forward pass reads (tensors used in place; those
  // copied or converted at load are not), for prefaulting only those.
  std::vector<std::pair<const uint8_t*, int64_t>> mapped_ranges;
  // Vision-tower tensors of a V4.1 checkpoint, left unbound (text only).
  int64_t skipped_vision_tensors = 0, skipped_vision_bytes = 0;
};

// progress(done, total) is called while binding layers (load progress bars).
ModelWeights bind_weights(const ModelConfig& config, const TensorStore& store,
                          const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace dsv4
