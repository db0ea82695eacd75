#include "model/model.h"

#include <filesystem>

#include "core/error.h"
#include "model/layers.h"

namespace dsv4 {

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  std::unique_ptr<Model> model(new Model());
  model->config_ = load_config(path);
  if (!std::filesystem::is_directory(path)) throw Error("model path must be a directory: " + path);
  model->store_ = TensorStore::open(path);
  model->weights_ = bind_weights(model->config_, model->store_, options.progress);
  model->rope_window_ = RopeTable(model->config_, false);
  model->rope_compressed_ = RopeTable(model->config_, true);
  return model;
}

SequenceState Model::new_state() const {
  SequenceState s;
  s.reset(config_);
  return s;
}

void Model::block_forward(const BlockWeights& b, LayerState& state, float* x_hc,
                          const int32_t* tokens, int64_t start, int64_t n) const {
  const ModelConfig& c = config_;
  const RopeTable& rope = b.ratio > 0 ? rope_compressed_ : rope_window_;
  std::vector<float> y(size_t(n * c.dim)), sub(size_t(n * c.dim));
  HcMix mix;

  hc_pre(c, b.hc_attn, x_hc, n, y.data(), &mix);
  for (int64_t t = 0; t < n; ++t) rms_norm(y.data() + t * c.dim, b.attn_norm.data(), c.dim, c.norm_eps);
  attention_forward(c, b.attn, rope, b.ratio, state, y.data(), start, n, sub.data());
  hc_post(c, mix, sub.data(), x_hc, n);

  hc_pre(c, b.hc_ffn, x_hc, n, y.data(), &mix);
  for (int64_t t = 0; t < n; ++t) rms_norm(y.data() + t * c.dim, b.ffn_norm.data(), c.dim, c.norm_eps);
  moe_forward(c, b.moe, y.data(), tokens, n, sub.data());
  hc_post(c, mix, sub.data(), x_hc, n);
}

void Model::head_forward(const HyperConnectionWeights& hc_head, const std::vector<float>& norm,
                         const float* x_hc, int64_t n, float* logits) const {
  std::vector<float> y(size_t(n * config_.dim));
  hc_head_collapse(config_, hc_head, x_hc, n, y.data());
  for (int64_t t = 0; t < n; ++t) rms_norm(y.data() + t * config_.dim, norm.data(), config_.dim, config_.norm_eps);
  linear_forward(weights_.head, y.data(), n, logits);
}

static void check_tokens(const ModelConfig& c, const int32_t* tokens, int64_t n) {
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size)
      throw Error("token id " + std::to_string(tokens[t]) + " is outside the vocabulary [0, " +
                  std::to_string(c.vocab_size) + ")");
}

void Model::forward(SequenceState& state, const int32_t* tokens, int64_t n, float* logits,
                    float* final_hc) const {
  const ModelConfig& c = config_;
  if (n <= 0) return;
  check_tokens(c, tokens, n);
  if (int64_t(state.layers.size()) != c.n_layers) throw Error("sequence state does not match the model");
  const int64_t width = c.hc_mult * c.dim;
  std::vector<float> x_hc(size_t(n * width));
  std::vector<float> row(size_t(c.dim));
  for (int64_t t = 0; t < n; ++t) {
    linear_decode_row(weights_.embed, tokens[t], row.data());
    for (int64_t k = 0; k < c.hc_mult; ++k)
      std::copy(row.begin(), row.end(), x_hc.begin() + t * width + k * c.dim);
  }
  const int64_t start = state.n_tokens;
  if (hc_observer_) hc_observer_(0, x_hc.data(), start, n);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    block_forward(weights_.layers[size_t(l)], state.layers[size_t(l)], x_hc.data(), tokens, start, n);
    if (hc_observer_) hc_observer_(l + 1, x_hc.data(), start, n);
  }
  state.n_tokens += n;
  if (final_hc) std::copy(x_hc.begin(), x_hc.end(), final_hc);
  if (logits) head_forward(weights_.hc_head, weights_.norm, x_hc.data(), n, logits);
}

void Model::forward_mtp(SequenceState& state, const float* hc, const int32_t* next_tokens,
                        int64_t n, float* logits) const {
  const ModelConfig& c = config_;
  if (weights_.mtp.empty()) throw Error("this checkpoint has no MTP block");
  if (n <= 0) return;
  check_tokens(c, next_tokens, n);
  const MtpWeights& m = weights_.mtp[0];
  const int64_t D = c.dim, H = c.hc_mult;
  // x[k] = e_proj(enorm(embed(next))) + h_proj(hnorm(hc[k])) for each copy k.
  std::vector<float> e(size_t(n * D)), e_out(size_t(n * D));
  for (int64_t t = 0; t < n; ++t) {
    linear_decode_row(weights_.embed, next_tokens[t], e.data() + t * D);
    rms_norm(e.data() + t * D, m.enorm.data(), D, c.norm_eps);
  }
  linear_forward(m.e_proj, e.data(), n, e_out.data());
  std::vector<float> h(hc, hc + n * H * D), x_hc(size_t(n * H * D));
  for (int64_t r = 0; r < n * H; ++r) rms_norm(h.data() + r * D, m.hnorm.data(), D, c.norm_eps);
  linear_forward(m.h_proj, h.data(), n * H, x_hc.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < H; ++k)
      for (int64_t d = 0; d < D; ++d) x_hc[size_t((t * H + k) * D + d)] += e_out[size_t(t * D + d)];
  block_forward(m.block, state.mtp_layers[0], x_hc.data(), next_tokens, state.mtp_tokens, n);
  state.mtp_tokens += n;
  head_forward(m.hc_head, m.norm, x_hc.data(), n, logits);
}

int64_t Model::decode_weight_bytes_per_token() const {
  const ModelConfig& c = config_;
  int64_t bytes = weights_.head.weight_bytes() + weights_.embed.weight_bytes() / c.vocab_size;
  bytes += weights_.hc_head.fn.weight_bytes();
  for (const BlockWeights& b : weights_.layers) {
    const AttentionWeights& a = b.attn;
    bytes += b.hc_attn.fn.weight_bytes() + b.hc_ffn.fn.weight_bytes();
    for (const Linear* l : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b}) bytes += l->weight_bytes();
    if (a.has_compressor) bytes += a.compressor.wkv.weight_bytes() + a.compressor.wgate.weight_bytes();
    if (a.has_indexer)
      bytes += a.indexer.wq_b.weight_bytes() + a.indexer.weights_proj.weight_bytes() +
               a.indexer.compressor.wkv.weight_bytes() + a.indexer.compressor.wgate.weight_bytes();
    const MoeWeights& m = b.moe;
    bytes += m.gate.weight_bytes();
    for (const Linear* l : {&m.shared.w1, &m.shared.w2, &m.shared.w3}) bytes += l->weight_bytes();
    const ExpertWeights& e = m.experts[0];
    bytes += c.n_activated_experts * (e.w1.weight_bytes() + e.w2.weight_bytes() + e.w3.weight_bytes());
  }
  return bytes;
}

}  // namespace dsv4
