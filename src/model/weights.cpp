#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/numeric.h"

namespace dsv4 {
namespace {

// How a linear may be stored. Dense linears are always BF16/F32 in the
// official checkpoints; quantized ones are FP8 blocks in FP8 checkpoints;
// routed experts follow expert_dtype.
enum class Storage { Dense, Quantized, Expert };

class Binder {
 public:
  Binder(const ModelConfig& c, const TensorStore& s, ModelWeights& out) : config_(c), store_(s), out_(out) {}

  const TensorInfo& tensor(const std::string& name) {
    const TensorInfo* t = store_.find(name);
    if (!t) throw Error("checkpoint is missing tensor " + name);
    total_bytes += t->nbytes;
    return *t;
  }

  static std::string shape_of(std::vector<int64_t> shape) {
    TensorInfo t;
    t.shape = std::move(shape);
    return t.shape_string();
  }

  void expect_shape(const TensorInfo& t, const std::vector<int64_t>& shape) {
    if (t.shape != shape)
      throw Error("tensor " + t.name + " has shape " + t.shape_string() + ", expected " + shape_of(shape) +
                  " from config.json");
  }

  [[noreturn]] void bad_dtype(const TensorInfo& t, const std::string& allowed) {
    throw Error("tensor " + t.name + " has dtype " + dtype_name(t.dtype) + ", expected " + allowed);
  }

  std::vector<float> vec(const std::string& name, int64_t n) {
    const TensorInfo& t = tensor(name);
    expect_shape(t, {n});
    return to_floats(t);
  }

  std::vector<float> to_floats(const TensorInfo& t) {
    std::vector<float> out(size_t(t.numel()));
    if (t.dtype == DType::F32) {
      std::memcpy(out.data(), t.data, size_t(t.nbytes));
    } else if (t.dtype == DType::BF16) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[size_t(i)] = bf16_to_float(v);
      }
    } else {
      bad_dtype(t, "F32 or BF16");
    }
    return out;
  }

  Linear linear(const std::string& prefix, int64_t rows, int64_t cols, Storage storage, bool quantize_input = true) {
    const TensorInfo& w = tensor(prefix + ".weight");
    Linear lin;
    lin.rows = rows;
    lin.cols = cols;
    lin.data = w.data;
    const TensorInfo* s = store_.find(prefix + ".scale");
    bool fp8_allowed = storage != Storage::Dense && config_.fp8_weights;
    bool fp4_allowed = storage == Storage::Expert && config_.expert_dtype == "fp4";
    if (w.dtype == DType::BF16 || w.dtype == DType::F32) {
      if (storage != Storage::Dense && config_.fp8_weights && storage != Storage::Expert)
        bad_dtype(w, "F8_E4M3 (config.json declares an fp8 quantization_config)");
      expect_shape(w, {rows, cols});
      if (s) throw Error("tensor " + s->name + " is a scale for an unquantized " + dtype_name(w.dtype) + " weight");
      lin.format = w.dtype == DType::BF16 ? WeightFormat::BF16 : WeightFormat::F32;
      keep(w);
      return lin;
    }
    if (w.dtype == DType::F8_E4M3) {
      if (!fp8_allowed)
        bad_dtype(w, config_.fp8_weights ? "BF16 or F32" : "BF16 or F32 (config.json has no fp8 quantization_config)");
      expect_shape(w, {rows, cols});
      if (!s) throw Error("checkpoint is missing tensor " + prefix + ".scale");
      total_bytes += s->nbytes;
      if (s->dtype != DType::F8_E8M0) bad_dtype(*s, "F8_E8M0 (ue8m0 block scales)");
      const int64_t block = config_.weight_block;
      expect_shape(*s, {(rows + block - 1) / block, (cols + block - 1) / block});
      check_scales(*s);
      lin.quantize_input = quantize_input;
      lin.input_block = config_.activation_block;
      if (block == 128) {
        lin.format = WeightFormat::FP8_BLOCK128;
        lin.scale = s->data;
        lin.scale_cols = (cols + 127) / 128;
        keep(w);
        keep(*s);
      } else {
        expand_to_bf16(lin, w, *s, block);
      }
      return lin;
    }
    if (w.dtype == DType::I8 || w.dtype == DType::U8) {
      if (!fp4_allowed)
        bad_dtype(w, "F8_E4M3 or BF16 (packed FP4 is only used for routed experts with expert_dtype fp4)");
      if (cols % 32) throw Error("tensor " + w.name + ": FP4 input width must be a multiple of 32");
      expect_shape(w, {rows, cols / 2});
      if (!s) throw Error("checkpoint is missing tensor " + prefix + ".scale");
      total_bytes += s->nbytes;
      if (s->dtype != DType::F8_E8M0) bad_dtype(*s, "F8_E8M0 (ue8m0 block scales)");
      expect_shape(*s, {rows, cols / 32});
      lin.format = WeightFormat::FP4_BLOCK32;
      lin.scale = s->data;
      lin.scale_cols = cols / 32;
      keep(w);
      keep(*s);
      lin.quantize_input = quantize_input;
      lin.input_block = config_.activation_block;
      check_scales(*s);
      return lin;
    }
    bad_dtype(w, "BF16, F32, F8_E4M3 or packed FP4 (I8)");
  }

  // V4.1's FP8 weights have 32x32 blocks, which the FP8 kernels (128x128)
  // do not read: they are expanded to BF16 once. e4m3 values times a power
  // of two keep at most 4 significant bits, so BF16 holds them exactly (the
  // check below refuses the one exception, results below BF16's smallest
  // subnormal). Costs twice the FP8 bytes for those matrices.
  void expand_to_bf16(Linear& lin, const TensorInfo& w, const TensorInfo& s, int64_t block) {
    const int64_t rows = lin.rows, cols = lin.cols, scale_cols = (cols + block - 1) / block;
    auto buffer = std::make_unique<uint16_t[]>(size_t(rows * cols));
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < cols; ++i) {
        const float v = e4m3_to_float(w.data[o * cols + i]) * e8m0_to_float(s.data[(o / block) * scale_cols + i / block]);
        const uint32_t bits = float_to_bits(v);
        if (bits & 0xffff)
          throw Error("tensor " + w.name + ": value at [" + std::to_string(o) + ", " + std::to_string(i) +
                      "] does not fit BF16 exactly (scale out of range)");
        buffer[size_t(o * cols + i)] = uint16_t(bits >> 16);
      }
    lin.format = WeightFormat::BF16;
    lin.data = reinterpret_cast<const uint8_t*>(buffer.get());
    lin.scale = nullptr;
    lin.scale_cols = 0;
    out_.converted_bytes += rows * cols * 2;
    out_.converted.push_back(std::move(buffer));
  }

  void keep(const TensorInfo& t) { out_.mapped_ranges.push_back({t.data, t.nbytes}); }

  void check_scales(const TensorInfo& s) {
    for (int64_t i = 0; i < s.nbytes; ++i)
      if (s.data[i] == 255) throw Error("tensor " + s.name + " holds a NaN ue8m0 scale (0xFF)");
  }

  HyperConnectionWeights hyper(const std::string& prefix, int64_t mix, int64_t n_scale) {
    HyperConnectionWeights hc;
    const TensorInfo& fn = tensor(prefix + "_fn");
    if (fn.dtype != DType::F32) bad_dtype(fn, "F32");
    expect_shape(fn, {mix, config_.hc_mult * config_.dim});
    hc.fn.format = WeightFormat::F32;
    hc.fn.rows = mix;
    hc.fn.cols = config_.hc_mult * config_.dim;
    hc.fn.data = fn.data;
    keep(fn);
    hc.base = vec(prefix + "_base", mix);
    hc.scale = vec(prefix + "_scale", n_scale);
    return hc;
  }

  CompressorWeights compressor(const std::string& prefix, const LayerLayout& layout, int64_t width) {
    CompressorWeights c;
    const int64_t ratio = layout.ratio;
    c.ratio = ratio;
    c.width = width;
    c.overlap = layout.overlapping();
    int64_t w2 = (c.overlap ? 2 : 1) * width;
    c.wkv = linear(prefix + ".wkv", w2, config_.dim, Storage::Dense);
    c.wgate = linear(prefix + ".wgate", w2, config_.dim, Storage::Dense);
    const TensorInfo& ape = tensor(prefix + ".ape");
    expect_shape(ape, {ratio, w2});
    c.ape = to_floats(ape);
    c.norm = vec(prefix + ".norm.weight", width);
    return c;
  }

  BlockWeights block(const std::string& p, int64_t layer_id) {
    const ModelConfig& c = config_;
    BlockWeights b;
    b.layer_id = layer_id;
    b.layout = layer_layout(c, layer_id);
    b.attn_norm = vec(p + ".attn_norm.weight", c.dim);
    b.ffn_norm = vec(p + ".ffn_norm.weight", c.dim);
    b.hc_attn = hyper(p + ".hc_attn", c.hc_mix(), 3);
    b.hc_ffn = hyper(p + ".hc_ffn", c.hc_mix(), 3);

    AttentionWeights& a = b.attn;
    const std::string ap = p + ".attn";
    a.sink = vec(ap + ".attn_sink", c.n_heads);
    a.wq_a = linear(ap + ".wq_a", c.q_lora_rank, c.dim, Storage::Quantized);
    a.q_norm = vec(ap + ".q_norm.weight", c.q_lora_rank);
    a.wq_b = linear(ap + ".wq_b", c.n_heads * c.head_dim, c.q_lora_rank, Storage::Quantized);
    a.wkv = linear(ap + ".wkv", c.head_dim, c.dim, Storage::Quantized);
    a.kv_norm = vec(ap + ".kv_norm.weight", c.head_dim);
    // wo_a is used dequantized (bf16-exact) without input rounding.
    a.wo_a = linear(ap + ".wo_a", c.o_groups * c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups, Storage::Quantized,
                    false);
    a.wo_b = linear(ap + ".wo_b", c.dim, c.o_groups * c.o_lora_rank, Storage::Quantized);
    if (b.layout.kind == LayerKind::Grouped) {
      grouped_attention(a, ap, b.layout, layer_id);
    } else if (b.layout.compresses()) {
      a.has_compressor = true;
      a.compressor = compressor(ap + ".compressor", b.layout, c.head_dim);
      if (b.layout.has_indexer()) {
        a.has_indexer = true;
        a.indexer.wq_b =
            linear(ap + ".indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, Storage::Quantized);
        a.indexer.weights_proj = linear(ap + ".indexer.weights_proj", c.index_n_heads, c.dim, Storage::Dense);
        a.indexer.compressor = compressor(ap + ".indexer.compressor", b.layout, c.index_head_dim);
      }
    }
    for (const char* unexpected : {".compressor.wkv.weight", ".indexer.wq_b.weight"})
      if (!b.layout.compresses() && store_.find(ap + unexpected))
        throw Error("tensor " + ap + unexpected + " present but layer " + std::to_string(layer_id) +
                    " is window-only (compress ratio 0)");

    if (std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), layer_id) != c.engram_layer_ids.end())
      b.engram = engram(p + ".engram", layer_id);

    MoeWeights& m = b.moe;
    const std::string fp = p + ".ffn";
    const int64_t experts = c.routed_experts(layer_id);
    m.hash_routed = layer_id < c.n_hash_layers;
    m.top_k = c.activated_experts(layer_id);
    m.gate = linear(fp + ".gate", experts, c.dim, Storage::Dense);
    if (m.hash_routed) {
      const TensorInfo& t = tensor(fp + ".gate.tid2eid");
      expect_shape(t, {c.vocab_size, c.n_activated_experts});
      m.tid2eid.resize(size_t(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) {
        int64_t v;
        if (t.dtype == DType::I64)
          std::memcpy(&v, t.data + 8 * i, 8);
        else if (t.dtype == DType::I32) {
          int32_t v32;
          std::memcpy(&v32, t.data + 4 * i, 4);
          v = v32;
        } else
          bad_dtype(t, "I64 or I32");
        if (v < 0 || v >= c.n_routed_experts)
          throw Error("tensor " + t.name + " holds expert id " + std::to_string(v) + " outside [0, " +
                      std::to_string(c.n_routed_experts) + ")");
        m.tid2eid[size_t(i)] = int32_t(v);
      }
      for (int64_t tok = 0; tok < c.vocab_size; ++tok) {
        std::set<int32_t> ids(m.tid2eid.begin() + tok * c.n_activated_experts,
                              m.tid2eid.begin() + (tok + 1) * c.n_activated_experts);
        if (int64_t(ids.size()) != c.n_activated_experts)
          throw Error("tensor " + t.name + " row " + std::to_string(tok) + " repeats an expert id");
      }
    } else {
      m.bias = vec(fp + ".gate.bias", experts);
    }
    for (int64_t e = 0; e < experts; ++e) {
      std::string ep = fp + ".experts." + std::to_string(e);
      ExpertWeights ex;
      ex.w1 = linear(ep + ".w1", c.moe_inter_dim, c.dim, Storage::Expert);
      ex.w3 = linear(ep + ".w3", c.moe_inter_dim, c.dim, Storage::Expert);
      ex.w2 = linear(ep + ".w2", c.dim, c.moe_inter_dim, Storage::Expert);
      m.experts.push_back(ex);
    }
    m.shared.w1 = linear(fp + ".shared_experts.w1", c.moe_inter_dim, c.dim, Storage::Quantized);
    m.shared.w3 = linear(fp + ".shared_experts.w3", c.moe_inter_dim, c.dim, Storage::Quantized);
    m.shared.w2 = linear(fp + ".shared_experts.w2", c.dim, c.moe_inter_dim, Storage::Quantized);
    return b;
  }

  // V4.1 attention roles: a KV source owns the compressor (ratio 1: one
  // projection per token, no gate; above: gated pooling without position
  // biases or overlap) and the index keys' projection; an index source
  // owns its queries. Other layers of the group own neither.
  void grouped_attention(AttentionWeights& a, const std::string& ap, const LayerLayout& layout, int64_t layer_id) {
    const ModelConfig& c = config_;
    const bool kv_source = layout.kv_group == layer_id, index_source = layout.index_group == layer_id;
    const std::string cp = ap + ".compressor", ip = ap + ".indexer";
    if (kv_source) {
      a.has_compressor = true;
      CompressorWeights& k = a.compressor;
      k.ratio = layout.ratio;
      k.width = c.head_dim;
      k.wkv = linear(cp + ".wkv", c.head_dim, c.dim, Storage::Dense);
      if (layout.ratio > 1) k.wgate = linear(cp + ".wgate", c.head_dim, c.dim, Storage::Dense);
      k.norm = vec(cp + ".norm.weight", c.head_dim);
      a.indexer.wk = linear(ip + ".wk", c.index_head_dim, c.head_dim, Storage::Dense);
      a.indexer.k_norm = vec(ip + ".k_norm.weight", c.index_head_dim);
    }
    if (index_source) {
      a.has_indexer = true;
      a.indexer.wq_b = linear(ip + ".wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, Storage::Quantized);
      a.indexer.weights_proj = linear(ip + ".weights_proj", c.index_n_heads, c.dim, Storage::Dense);
    }
    if (!kv_source)
      for (const std::string& name : {cp + ".wkv.weight", ip + ".wk.weight"})
        if (store_.find(name))
          throw Error("tensor " + name + " present but layer " + std::to_string(layer_id) +
                      " is not a KV source (kv_source_layer_ids)");
    if (!index_source && store_.find(ip + ".wq_b.weight"))
      throw Error("tensor " + ip + ".wq_b.weight present but layer " + std::to_string(layer_id) +
                  " is not an index source (index_source_layer_ids)");
  }

  EngramWeights engram(const std::string& p, int64_t layer_id) {
    const ModelConfig& c = config_;
    const size_t slot = size_t(std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), layer_id) -
                               c.engram_layer_ids.begin());
    const int64_t rows = c.engram_num_embeddings[slot], dim = c.engram_head_dim;
    const int64_t columns = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    EngramWeights e;
    const TensorInfo& table = tensor(p + ".embed.weight");
    if (table.dtype != DType::F8_E4M3) bad_dtype(table, "F8_E4M3 (the Engram table is stored in FP8)");
    expect_shape(table, {rows, dim});
    const TensorInfo& scale = tensor(p + ".embed.scale");
    if (scale.dtype != DType::F8_E8M0) bad_dtype(scale, "F8_E8M0 (one ue8m0 scale per 32 values of a row)");
    expect_shape(scale, {rows, dim / 32});
    check_scales(scale);
    e.table = {table.data, scale.data, rows, dim};
    keep(table);
    keep(scale);
    e.wkv = linear(p + ".wkv", (c.hc_mult + 1) * c.dim, columns * dim, Storage::Quantized);
    const std::vector<float> q = to_floats(shaped(p + ".q_weight", {c.hc_mult, c.dim}));
    const std::vector<float> k = to_floats(shaped(p + ".k_weight", {c.hc_mult, c.dim}));
    e.weight.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) e.weight[i] = q[i] * k[i];
    return e;
  }

  const TensorInfo& shaped(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo& t = tensor(name);
    expect_shape(t, shape);
    return t;
  }

  int64_t total_bytes = 0;

 private:
  const ModelConfig& config_;
  const TensorStore& store_;
  ModelWeights& out_;
};

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const TensorStore& store,
                          const std::function<void(int64_t, int64_t)>& progress) {
  ModelWeights w;
  Binder b(c, store, w);
  int64_t total = c.n_layers + c.n_mtp_layers + 1;  // DSpark stages count with the last step
  w.embed = b.linear("embed", c.vocab_size, c.dim, Storage::Dense);
  w.head = b.linear("head", c.vocab_size, c.dim, Storage::Dense);
  w.norm = b.vec("norm.weight", c.dim);
  // V4.1 collapses with the last sublayer's (lagged) pre: no HC head.
  if (!c.v41) w.hc_head = b.hyper("hc_head", c.hc_mult, 1);
  if (progress) progress(1, total);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    w.layers.push_back(b.block("layers." + std::to_string(l), l));
    if (progress) progress(l + 2, total);
  }
  for (int64_t k = 0; k < c.n_mtp_layers; ++k) {
    std::string p = "mtp." + std::to_string(k);
    MtpWeights m;
    m.block = b.block(p, c.n_layers + k);
    m.e_proj = b.linear(p + ".e_proj", c.dim, c.dim, Storage::Quantized);
    m.h_proj = b.linear(p + ".h_proj", c.dim, c.dim, Storage::Quantized);
    m.enorm = b.vec(p + ".enorm.weight", c.dim);
    m.hnorm = b.vec(p + ".hnorm.weight", c.dim);
    m.norm = b.vec(p + ".norm.weight", c.dim);
    m.hc_head = b.hyper(p + ".hc_head", c.hc_mult, 1);
    w.mtp.push_back(std::move(m));
    if (progress) progress(c.n_layers + k + 2, total);
  }
  if (c.dspark_stages > 0) {
    DsparkWeights d;
    for (int64_t k = 0; k < c.dspark_stages; ++k)
      d.stages.push_back(b.block("mtp." + std::to_string(k), c.n_layers + k));
    const int64_t targets = int64_t(c.dspark_target_layer_ids.size());
    d.main_proj = b.linear("mtp.0.main_proj", c.dim, targets * c.dim, Storage::Quantized);
    d.main_norm = b.vec("mtp.0.main_norm.weight", c.dim);
    const std::string last = "mtp." + std::to_string(c.dspark_stages - 1);
    d.norm = b.vec(last + ".norm.weight", c.dim);
    if (!c.v41) d.hc_head = b.hyper(last + ".hc_head", c.hc_mult, 1);
    const std::string w1 = c.v41 ? ".markov_head.embed" : ".markov_head.markov_w1";
    const std::string w2 = c.v41 ? ".markov_head.head" : ".markov_head.markov_w2";
    d.markov_w1 = b.linear(last + w1, c.vocab_size, c.dspark_markov_rank, Storage::Dense);
    d.markov_w2 = b.linear(last + w2, c.vocab_size, c.dspark_markov_rank, Storage::Dense);
    d.confidence = b.linear(last + ".confidence_head.proj", 1, c.dim + c.dspark_markov_rank, Storage::Dense);
    w.dspark = std::move(d);
  }
  // V4.1's vision tower (ViT, aligner, image span embeddings): not used
  // until vision exists; counted so that the startup log can say so.
  for (const auto& [name, info] : store.tensors())
    for (const char* prefix : {"vision.", "aligner.", "image_start", "image_end", "image_newline"})
      if (name.rfind(prefix, 0) == 0) {
        ++w.skipped_vision_tensors;
        w.skipped_vision_bytes += info.nbytes;
        break;
      }
  w.total_bytes = b.total_bytes;
  return w;
}

}  // namespace dsv4
