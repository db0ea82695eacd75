#include "model/model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "core/numpy_random.h"
#include "model/layers.h"

namespace dsv4 {

namespace {

// The Engram hash tables: the token map from the caller (derived from the
// tokenizer) or from an engram_tokenizer.json beside config.json, which
// also carries the hash multipliers the reference draws from NumPy's
// generator (otherwise they are drawn the same way: core/numpy_random.h).
EngramHasher load_engram_hasher(const ModelConfig& c, const std::string& dir, std::vector<int32_t> token_map) {
  const std::filesystem::path file = std::filesystem::path(dir) / "engram_tokenizer.json";
  nlohmann::json tables;
  if (std::filesystem::exists(file)) {
    std::ifstream in(file);
    try {
      tables = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw Error(file.string() + ": malformed JSON: " + e.what());
    }
  }
  try {
    if (token_map.empty() && tables.contains("token_map")) token_map = tables["token_map"].get<std::vector<int32_t>>();
    if (token_map.empty())
      throw Error("this DeepSeek-V4.1 checkpoint has Engram layers, which need the compressed token map of its "
                  "tokenizer (no tokenizer was given and there is no engram_tokenizer.json)");
    std::vector<std::vector<int64_t>> multipliers;
    if (tables.contains("hash_multipliers"))
      multipliers = tables["hash_multipliers"].get<std::vector<std::vector<int64_t>>>();
    else
      for (int64_t layer : c.engram_layer_ids)
        multipliers.push_back(engram_hash_multipliers(layer, c.engram_max_ngram_size, c.engram_compressed_vocab_size));
    return EngramHasher(c, std::move(token_map), std::move(multipliers));
  } catch (const nlohmann::json::exception& e) {
    throw Error(file.string() + ": " + e.what());
  }
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  std::unique_ptr<Model> model(new Model());
  model->config_ = load_config(path);
  if (!std::filesystem::is_directory(path)) throw Error("model path must be a directory: " + path);
  const ModelConfig& c = model->config_;
  for (int64_t l = 0; l < c.n_layers + c.n_mtp_layers; ++l) model->layouts_.push_back(layer_layout(c, l));
  // V4.1's reference data hold roundings a few units of the last place from
  // their midpoints; only the exact numerics agree with them (docs/v41.md).
  model->backend_ = options.backend ? options.backend : c.v41 ? &exact_backend() : &default_backend();
  model->residency_ =
      choose_residency(options.load_mode, checkpoint_file_bytes(path), options.reserved_bytes,
                       options.load_mode == LoadMode::Auto ? available_memory_bytes() : -1);
  model->store_ = TensorStore::open(path, model->residency_.residency);
  model->weights_ = bind_weights(model->config_, model->store_, options.progress);
  if (c.has_engram()) model->engram_ = load_engram_hasher(c, path, options.engram_token_map);
  for (int64_t l : c.kv_source_layer_ids)
    if (c.ratio(l) == 1) model->replay_layer_ = l;
  // Window-only layers rotate with rope_theta; compressed layers with
  // compress_rope_theta and the YaRN ramp.
  model->rope_window_ = RopeTable(RopeParams{c.rope_dim, c.rope_theta});
  model->rope_compressed_ = RopeTable(
      RopeParams{c.rope_dim, c.compress_rope_theta, c.original_seq_len, c.beta_fast, c.beta_slow, c.rope_factor});
  return model;
}

SequenceState Model::new_state() const {
  SequenceState s;
  s.reset(config_);
  return s;
}

void Model::block_forward(const BlockWeights& b, const std::vector<Segment>& segments, float* x_hc,
                          const int32_t* tokens, int64_t n, GroupedShared& shared, float* lag_pre) const {
  const RopeTable& rope = b.layout.compresses() ? rope_compressed_ : rope_window_;
  block_forward_with(
      b, x_hc, tokens, n,
      [&](const float* y, float* out) {
        if (b.layout.kind == LayerKind::Grouped)
          attention_grouped(*backend_, config_, b.attn, rope, b.layout, b.layer_id, segments, shared, y, n, out);
        else
          attention_forward(*backend_, config_, b.attn, rope, b.layout, segments, y, n, out);
      },
      lag_pre);
}

void Model::block_forward_with(const BlockWeights& b, float* x_hc, const int32_t* tokens, int64_t n,
                               const std::function<void(const float* y, float* out)>& attention,
                               float* lag_pre) const {
  const ModelConfig& c = config_;
  const KernelBackend& kb = *backend_;
  const HcShape shape = hc_shape(c);
  Buffer y = kb.buffer(n * c.dim), sub = kb.buffer(n * c.dim);
  HcMix attn_mix, ffn_mix;

  // V4.1 collapses each sublayer's input with the pre of the sublayer
  // before it (the block's attention with the previous FFN's).
  if (lag_pre)
    kb.hc_pre_lagged(shape, hc_site(b.hc_attn), x_hc, n, lag_pre, y.data(), &attn_mix);
  else
    kb.hc_pre(shape, hc_site(b.hc_attn), x_hc, n, y.data(), &attn_mix);
  kb.rms_norm(y.data(), n, c.dim, c.dim, b.attn_norm.data(), c.norm_eps);
  attention(y.data(), sub.data());
  kb.hc_post(shape, attn_mix, sub.data(), x_hc, n);

  if (lag_pre)
    kb.hc_pre_lagged(shape, hc_site(b.hc_ffn), x_hc, n, attn_mix.pre.data(), y.data(), &ffn_mix);
  else
    kb.hc_pre(shape, hc_site(b.hc_ffn), x_hc, n, y.data(), &ffn_mix);
  kb.rms_norm(y.data(), n, c.dim, c.dim, b.ffn_norm.data(), c.norm_eps);
  moe_forward(kb, c, b.moe, y.data(), tokens, n, sub.data());
  kb.hc_post(shape, ffn_mix, sub.data(), x_hc, n);
  if (lag_pre) std::copy(ffn_mix.pre.begin(), ffn_mix.pre.end(), lag_pre);
}

void Model::replay_compress(const BlockWeights& b, const std::vector<Segment>& segments, const float* x_hc,
                            const float* lag_pre, int64_t n) const {
  const KernelBackend& kb = *backend_;
  Buffer y = kb.buffer(n * config_.dim);
  HcMix unused;
  kb.hc_pre_lagged(hc_shape(config_), hc_site(b.hc_attn), x_hc, n, lag_pre, y.data(), &unused);
  kb.rms_norm(y.data(), n, config_.dim, config_.dim, b.attn_norm.data(), config_.norm_eps);
  grouped_compress(kb, config_, b.attn, rope_compressed_, b.layout, segments, y.data(), n);
}

void Model::engram_forward(const EngramWeights& e, const int64_t* hash_ids, float* x_hc, int64_t n) const {
  const ModelConfig& c = config_;
  const KernelBackend& kb = *backend_;
  const int64_t columns = engram_.columns(), width = columns * c.engram_head_dim, out = (c.hc_mult + 1) * c.dim;
  Buffer rows = kb.buffer(n * width), kv = kb.buffer(n * out);
  kb.engram_lookup(e.table, hash_ids, n * columns, rows.data());
  kb.linear(e.wkv, rows.data(), n, kv.data());
  // Each token's kv row: one key per HC copy, then the value.
  kb.engram_gate({x_hc, kv.data(), out, kv.data() + c.hc_mult * c.dim, e.weight.data(), n, c.hc_mult, c.dim,
                  c.norm_eps});
}

std::vector<float> Model::head_rows_forward(const Linear& head, const HyperConnectionWeights& hc_head,
                                            const std::vector<float>& norm, const float* x_hc,
                                            const std::vector<int64_t>& rows, const float* lag_pre) const {
  const int64_t width = config_.hc_mult * config_.dim;
  std::vector<float> logits(rows.size() * size_t(head.rows));
  if (rows.empty()) return logits;
  std::vector<float> selected(rows.size() * size_t(width));
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(x_hc + rows[i] * width, width, selected.begin() + int64_t(i) * width);
  if (!lag_pre) {
    head_forward(head, hc_head, norm, selected.data(), int64_t(rows.size()), logits.data());
    return logits;
  }
  const KernelBackend& kb = *backend_;
  const int64_t n = int64_t(rows.size()), H = config_.hc_mult, D = config_.dim;
  std::vector<float> pre(size_t(n * H));
  for (int64_t i = 0; i < n; ++i) std::copy_n(lag_pre + rows[size_t(i)] * H, H, pre.begin() + i * H);
  Buffer y = kb.buffer(n * D);
  kb.hc_collapse(hc_shape(config_), pre.data(), selected.data(), n, y.data());
  kb.rms_norm(y.data(), n, D, D, norm.data(), config_.norm_eps);
  kb.linear(head, y.data(), n, logits.data());
  return logits;
}

void Model::head_forward(const Linear& head, const HyperConnectionWeights& hc_head, const std::vector<float>& norm,
                         const float* x_hc, int64_t n, float* logits) const {
  const KernelBackend& kb = *backend_;
  Buffer y = kb.buffer(n * config_.dim);
  kb.hc_head(hc_shape(config_), hc_site(hc_head), x_hc, n, y.data());
  kb.rms_norm(y.data(), n, config_.dim, config_.dim, norm.data(), config_.norm_eps);
  kb.linear(head, y.data(), n, logits);
}

void Model::head_logits(const float* final_hc, int64_t n, float* logits) const {
  if (!head_from_final_hc()) throw Error("head_logits: V4.1's head needs the rows' lagged pre, not only final_hc");
  if (n > 0) head_forward(weights_.head, weights_.hc_head, weights_.norm, final_hc, n, logits);
}

void check_token_ids(int64_t vocab, const int32_t* ids, int64_t n, const char* what) {
  for (int64_t t = 0; t < n; ++t)
    if (ids[t] < 0 || ids[t] >= vocab)
      throw Error(std::string(what) + " " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
}

void Model::forward(SequenceState& state, const int32_t* tokens, int64_t n, float* logits, float* final_hc) const {
  forward_batch({BatchItem{&state, tokens, n, logits, final_hc}});
}

void Model::forward_batch(const std::vector<BatchItem>& items) const {
  const ModelConfig& c = config_;
  int64_t rows = 0;
  for (const BatchItem& it : items) {
    if (it.n < 0) throw Error("negative token count");
    // The embedding lookup must never read outside its table, whoever calls:
    // the same check validate_request ran, kept as the model's own guard.
    check_token_ids(c.vocab_size, it.tokens, it.n);
    if (int64_t(it.state->layers.size()) != c.n_layers) throw Error("sequence state does not match the model");
    rows += it.n;
  }
  if (rows == 0) return;
  const int64_t width = c.hc_mult * c.dim;
  std::vector<int32_t> tokens;
  tokens.reserve(size_t(rows));
  for (const BatchItem& it : items) tokens.insert(tokens.end(), it.tokens, it.tokens + it.n);
  Buffer x_hc = backend_->buffer(rows * width);
  backend_->embed(weights_.embed, tokens.data(), rows, c.hc_mult, x_hc.data());
  auto segments_for = [&](int64_t layer) {
    std::vector<Segment> segments;
    int64_t row0 = 0;
    for (const BatchItem& it : items) {
      if (it.n > 0) segments.push_back({&it.state->layers[size_t(layer)], it.state->n_tokens, row0, it.n, it.state});
      row0 += it.n;
    }
    return segments;
  };
  // V4.1: the lagged pre starts one-hot on copy 0; the Engram rows of every
  // position come from the token ids before it.
  std::vector<float> lag_pre;
  if (c.v41) {
    lag_pre.assign(size_t(rows * c.hc_mult), 0.0f);
    for (int64_t r = 0; r < rows; ++r) lag_pre[size_t(r * c.hc_mult)] = 1.0f;
  }
  std::vector<std::vector<int64_t>> hash_ids(c.engram_layer_ids.size());
  for (size_t slot = 0; slot < hash_ids.size(); ++slot) {
    hash_ids[slot].resize(size_t(rows * engram_.columns()));
    int64_t row0 = 0;
    for (const BatchItem& it : items) {
      if (int64_t(it.state->tokens.size()) != it.state->n_tokens)
        throw Error("sequence state lacks the token ids an Engram model needs");
      engram_.hash(int64_t(slot), it.state->tokens, it.tokens, it.n, hash_ids[slot].data() + row0 * engram_.columns());
      row0 += it.n;
    }
  }
  GroupedShared shared;
  // Bounded replay: from the replay layer on, only the rows at or after each
  // item's replay_from run (gathered into a compact batch and scattered
  // back); the replay layer first compresses the rows that skip it.
  bool replaying = false;
  for (const BatchItem& it : items) replaying |= it.replay_from > it.state->n_tokens && it.n > 0;
  if (replaying && replay_layer_ < 0) throw Error("bounded replay needs a model with a ratio-1 KV source (V4.1)");
  auto replay_block = [&](int64_t l) {
    const BlockWeights& block = weights_.layers[size_t(l)];
    const int64_t H = c.hc_mult;
    std::vector<Segment> skipped, kept;
    std::vector<int64_t> kept_rows, skipped_rows;
    int64_t row0 = 0;
    for (const BatchItem& it : items) {
      const int64_t start = it.state->n_tokens;
      const int64_t skip = std::clamp<int64_t>(it.replay_from - start, 0, it.n);
      LayerState* layer = &it.state->layers[size_t(l)];
      if (skip > 0) skipped.push_back({layer, start, int64_t(skipped_rows.size()), skip, it.state});
      for (int64_t t = 0; t < skip; ++t) skipped_rows.push_back(row0 + t);
      if (it.n > skip) kept.push_back({layer, start + skip, int64_t(kept_rows.size()), it.n - skip, it.state});
      for (int64_t t = skip; t < it.n; ++t) kept_rows.push_back(row0 + t);
      row0 += it.n;
    }
    auto gather = [&](const std::vector<int64_t>& which, std::vector<float>& x, std::vector<float>& pre,
                      std::vector<int32_t>& ids) {
      x.resize(which.size() * size_t(width));
      pre.resize(which.size() * size_t(H));
      ids.resize(which.size());
      for (size_t i = 0; i < which.size(); ++i) {
        std::copy_n(x_hc.data() + which[i] * width, width, x.begin() + int64_t(i) * width);
        std::copy_n(lag_pre.data() + which[i] * H, H, pre.begin() + int64_t(i) * H);
        ids[i] = tokens[size_t(which[i])];
      }
    };
    std::vector<float> x, pre;
    std::vector<int32_t> ids;
    if (l == replay_layer_ && !skipped_rows.empty()) {
      gather(skipped_rows, x, pre, ids);
      replay_compress(block, skipped, x.data(), pre.data(), int64_t(skipped_rows.size()));
    }
    if (kept_rows.empty()) return;
    gather(kept_rows, x, pre, ids);
    block_forward(block, kept, x.data(), ids.data(), int64_t(kept_rows.size()), shared, pre.data());
    for (size_t i = 0; i < kept_rows.size(); ++i) {
      std::copy_n(x.begin() + int64_t(i) * width, width, x_hc.data() + kept_rows[i] * width);
      std::copy_n(pre.begin() + int64_t(i) * H, H, lag_pre.data() + kept_rows[i] * H);
    }
  };
  const bool observe = hc_observer_ && items.size() == 1;
  if (observe) hc_observer_(0, x_hc.data(), items[0].state->n_tokens, rows);
  // DSpark's inputs: the mean of the HC copies after each target layer.
  auto keep_dspark_hidden = [&](int64_t layer) {
    const int64_t targets = int64_t(c.dspark_target_layer_ids.size());
    for (int64_t j = 0; j < targets; ++j) {
      if (c.dspark_target_layer_ids[size_t(j)] != layer) continue;
      int64_t r0 = 0;
      for (const BatchItem& it : items) {
        if (it.dspark_hidden) {
          const int64_t keep = it.dspark_hidden_rows < 0 ? it.n : std::min(it.n, it.dspark_hidden_rows);
          for (int64_t t = 0; t < keep; ++t) {
            const float* x = x_hc.data() + (r0 + it.n - keep + t) * width;
            float* out = it.dspark_hidden + (t * targets + j) * c.dim;
            for (int64_t i = 0; i < c.dim; ++i) {
              float sum = 0;
              for (int64_t k = 0; k < c.hc_mult; ++k) sum += x[k * c.dim + i];
              out[i] = sum / float(c.hc_mult);
            }
          }
        }
        r0 += it.n;
      }
    }
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const BlockWeights& block = weights_.layers[size_t(l)];
    if (block.engram) {
      const size_t slot = size_t(std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), l) -
                                 c.engram_layer_ids.begin());
      engram_forward(*block.engram, hash_ids[slot].data(), x_hc.data(), rows);
      if (observe && engram_observer_) engram_observer_(l, x_hc.data(), items[0].state->n_tokens, rows);
    }
    // V4.1's DSpark reads its target layers' inputs, V4's their outputs.
    if (has_dspark() && c.v41) keep_dspark_hidden(l);
    if (replaying && l >= replay_layer_)
      replay_block(l);
    else
      block_forward(block, segments_for(l), x_hc.data(), tokens.data(), rows, shared,
                    c.v41 ? lag_pre.data() : nullptr);
    if (observe) hc_observer_(l + 1, x_hc.data(), items[0].state->n_tokens, rows);
    if (has_dspark() && !c.v41) keep_dspark_hidden(l);
  }
  // The head runs only on the rows whose logits someone asked for.
  std::vector<int64_t> head_rows;
  {
    int64_t r0 = 0;
    for (const BatchItem& it : items) {
      if (it.logits && it.n > 0) {
        for (int64_t t = it.last_logits_only ? it.n - 1 : 0; t < it.n; ++t) head_rows.push_back(r0 + t);
      }
      r0 += it.n;
    }
  }
  const std::vector<float> logits = head_rows_forward(weights_.head, weights_.hc_head, weights_.norm, x_hc.data(),
                                                      head_rows, c.v41 ? lag_pre.data() : nullptr);
  int64_t row0 = 0, head_index = 0;
  for (const BatchItem& it : items) {
    it.state->n_tokens += it.n;
    if (c.has_engram()) it.state->tokens.insert(it.state->tokens.end(), it.tokens, it.tokens + it.n);
    if (it.final_hc) {
      const int64_t keep = it.final_hc_rows < 0 ? it.n : std::min(it.n, it.final_hc_rows);
      std::copy_n(x_hc.begin() + (row0 + it.n - keep) * width, keep * width, it.final_hc);
    }
    if (it.logits && it.n > 0) {
      int64_t rows_out = it.last_logits_only ? 1 : it.n;
      std::copy_n(logits.begin() + head_index * c.vocab_size, rows_out * c.vocab_size, it.logits);
      head_index += rows_out;
    }
    row0 += it.n;
  }
}

void Model::forward_mtp(SequenceState& state, const float* hc, const int32_t* next_tokens, int64_t n,
                        float* logits) const {
  forward_mtp_batch({MtpBatchItem{&state, hc, next_tokens, n, logits}});
}

void Model::forward_mtp_batch(const std::vector<MtpBatchItem>& items) const {
  const ModelConfig& c = config_;
  if (weights_.mtp.empty()) throw Error("this checkpoint has no MTP block");
  int64_t n = 0;
  for (const MtpBatchItem& it : items) {
    check_token_ids(c.vocab_size, it.next_tokens, it.n);
    n += it.n;
  }
  if (n == 0) return;
  const MtpWeights& m = weights_.mtp[0];
  const int64_t D = c.dim, H = c.hc_mult;
  // The HC rows in a scratch buffer (pooled, so a first draft's catch-up
  // over a window of rows, 8 MB a sequence at V4-Flash's width, does not
  // fault in fresh pages each time).
  const KernelBackend& kb = *backend_;
  std::vector<int32_t> next;
  Buffer h = kb.buffer(n * H * D);
  int64_t filled = 0;
  for (const MtpBatchItem& it : items) {
    next.insert(next.end(), it.next_tokens, it.next_tokens + it.n);
    std::copy_n(it.hc, it.n * H * D, h.data() + filled);
    filled += it.n * H * D;
  }
  // x[k] = e_proj(enorm(embed(next))) + h_proj(hnorm(hc[k])) for each copy k.
  Buffer e = kb.buffer(n * D), e_out = kb.buffer(n * D), x_hc = kb.buffer(n * H * D);
  kb.embed(weights_.embed, next.data(), n, 1, e.data());
  kb.rms_norm(e.data(), n, D, D, m.enorm.data(), c.norm_eps);
  kb.linear(m.e_proj, e.data(), n, e_out.data());
  kb.rms_norm(h.data(), n * H, D, D, m.hnorm.data(), c.norm_eps);
  kb.linear(m.h_proj, h.data(), n * H, x_hc.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < H; ++k) kb.add(x_hc.data() + (t * H + k) * D, e_out.data() + t * D, D);
  std::vector<Segment> segments;
  int64_t row0 = 0;
  for (const MtpBatchItem& it : items) {
    if (it.n > 0) segments.push_back({&it.state->mtp_layers[0], it.state->mtp_tokens, row0, it.n});
    row0 += it.n;
  }
  GroupedShared shared;
  block_forward(m.block, segments, x_hc.data(), next.data(), n, shared);
  // The head only on the rows whose logits someone asked for.
  std::vector<int64_t> head_rows;
  row0 = 0;
  for (const MtpBatchItem& it : items) {
    if (it.logits && it.n > 0)
      for (int64_t t = it.last_logits_only ? it.n - 1 : 0; t < it.n; ++t) head_rows.push_back(row0 + t);
    row0 += it.n;
  }
  const int64_t width = H * D;
  const std::vector<float> logits = mtp_head_rows(m, x_hc.data(), head_rows);
  row0 = 0;
  int64_t head_index = 0;
  for (const MtpBatchItem& it : items) {
    it.state->mtp_tokens += it.n;
    if (it.last_hc && it.n > 0) std::copy_n(x_hc.data() + (row0 + it.n - 1) * width, width, it.last_hc);
    if (it.logits && it.n > 0) {
      const int64_t rows_out = it.last_logits_only ? 1 : it.n;
      std::copy_n(logits.begin() + head_index * c.vocab_size, rows_out * c.vocab_size, it.logits);
      head_index += rows_out;
    }
    row0 += it.n;
  }
}

std::vector<float> Model::mtp_head_rows(const MtpWeights& m, const float* x_hc,
                                        const std::vector<int64_t>& rows) const {
  if (draft_vocab_.empty()) return head_rows_forward(weights_.head, m.hc_head, m.norm, x_hc, rows);
  const std::vector<float> kept = head_rows_forward(draft_head_, m.hc_head, m.norm, x_hc, rows);
  const int64_t vocab = config_.vocab_size, n = int64_t(rows.size()), count = int64_t(draft_vocab_.size());
  std::vector<float> logits(size_t(n * vocab), -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < count; ++k)
      logits[size_t(i * vocab + draft_vocab_[size_t(k)])] = kept[size_t(i * count + k)];
  return logits;
}

void Model::set_draft_vocab(std::vector<int32_t> ids) {
  if (ids.empty()) {
    draft_vocab_.clear();
    decltype(draft_head_bytes_)().swap(draft_head_bytes_);  // frees the copy
    draft_head_ = Linear{};
    return;
  }
  if (!has_mtp()) throw Error("a draft vocabulary (--speculative-token-map) needs the checkpoint's MTP block");
  const Linear& head = weights_.head;
  if (head.format != WeightFormat::BF16 && head.format != WeightFormat::F32)
    throw Error(std::string("a draft vocabulary needs a BF16 or F32 LM head; this one is ") +
                weight_format_name(head.format));
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw Error("draft vocabulary: token id " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                  std::to_string(config_.vocab_size) + ")");
    if (i > 0 && ids[i] == ids[i - 1]) throw Error("draft vocabulary: token id " + std::to_string(ids[i]) + " repeats");
  }
  const int64_t row_bytes = head.cols * (head.format == WeightFormat::BF16 ? 2 : 4);
  std::vector<uint8_t, HugePageAllocator<uint8_t>> bytes(ids.size() * size_t(row_bytes));
  for (size_t i = 0; i < ids.size(); ++i)
    std::copy_n(head.data + ids[i] * row_bytes, row_bytes, bytes.begin() + int64_t(i) * row_bytes);
  draft_vocab_ = std::move(ids);
  draft_head_bytes_ = std::move(bytes);
  draft_head_ = head;
  draft_head_.rows = int64_t(draft_vocab_.size());
  draft_head_.data = draft_head_bytes_.data();
}

Model::TokenCost Model::token_cost() const {
  const ModelConfig& c = config_;
  TokenCost cost;
  auto add = [](const Linear& l, int64_t& bytes, int64_t& macs, int64_t times = 1) {
    bytes += times * l.weight_bytes();
    macs += times * l.rows * l.cols;
  };
  auto add_dense = [&](const Linear& l, int64_t& bytes, int64_t& macs, std::array<int64_t, 4>& weights) {
    add(l, bytes, macs);
    weights[size_t(l.format)] += l.rows * l.cols;
  };
  add_dense(weights_.head, cost.head_bytes, cost.head_macs, cost.head_weights);
  add_dense(weights_.hc_head.fn, cost.head_bytes, cost.head_macs, cost.head_weights);
  cost.mtp_head_bytes = cost.head_bytes;
  cost.mtp_head_macs = cost.head_macs;
  cost.mtp_head_weights = cost.head_weights;
  if (!draft_vocab_.empty()) {
    const Linear& head = weights_.head;
    cost.mtp_head_bytes += draft_head_.weight_bytes() - head.weight_bytes();
    cost.mtp_head_macs += (draft_head_.rows - head.rows) * head.cols;
    cost.mtp_head_weights[size_t(head.format)] += (draft_head_.rows - head.rows) * head.cols;
  }
  cost.other_bytes = weights_.embed.weight_bytes() / c.vocab_size;
  auto layer_cost = [&](const BlockWeights& b, const LayerLayout& layout) {
    const AttentionWeights& a = b.attn;
    LayerCost l;
    l.layout = layout;
    for (const Linear* w : {&b.hc_attn.fn, &b.hc_ffn.fn, &a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b})
      add_dense(*w, l.weight_bytes, l.linear_macs, l.dense_weights);
    if (a.has_compressor)
      for (const Linear* w : {&a.compressor.wkv, &a.compressor.wgate})
        add_dense(*w, l.compressor_bytes, l.compressor_macs, l.compressor_weights);
    if (a.has_indexer)
      for (const Linear* w :
           {&a.indexer.wq_b, &a.indexer.weights_proj, &a.indexer.compressor.wkv, &a.indexer.compressor.wgate})
        add_dense(*w, l.compressor_bytes, l.compressor_macs, l.compressor_weights);
    // V4.1: a KV source's index-key projection; an Engram layer's projection
    // of its 24 looked-up rows (the rows themselves: a few KB a token).
    if (a.has_compressor && !a.indexer.wk.empty())
      add_dense(a.indexer.wk, l.compressor_bytes, l.compressor_macs, l.compressor_weights);
    if (b.engram) {
      const int64_t before = l.weight_bytes;
      add_dense(b.engram->wkv, l.weight_bytes, l.linear_macs, l.dense_weights);
      l.weight_bytes += b.engram->wkv.cols + b.engram->wkv.cols / 32;
      l.engram_bytes = l.weight_bytes - before;
    }
    const MoeWeights& m = b.moe;
    for (const Linear* w : {&m.gate, &m.shared.w1, &m.shared.w2, &m.shared.w3})
      add_dense(*w, l.weight_bytes, l.linear_macs, l.dense_weights);
    const ExpertWeights& e = m.experts[0];
    for (const Linear* w : {&e.w1, &e.w2, &e.w3}) add(*w, l.weight_bytes, l.linear_macs, c.n_activated_experts);
    for (const Linear* w : {&e.w1, &e.w2, &e.w3}) {
      l.expert_bytes += w->weight_bytes();
      l.expert_weights += w->rows * w->cols;
    }
    cost.expert_format = e.w1.format;
    l.weight_bytes += l.compressor_bytes;
    l.linear_macs += l.compressor_macs;
    for (size_t f = 0; f < l.dense_weights.size(); ++f) l.dense_weights[f] += l.compressor_weights[f];
    return l;
  };
  for (size_t i = 0; i < size_t(c.n_layers); ++i) cost.layers.push_back(layer_cost(weights_.layers[i], layouts_[i]));
  for (size_t i = 0; i < weights_.mtp.size(); ++i) {
    const MtpWeights& m = weights_.mtp[i];
    LayerCost l = layer_cost(m.block, layouts_[size_t(c.n_layers) + i]);
    for (const Linear* w : {&m.e_proj, &m.h_proj, &m.hc_head.fn})
      add_dense(*w, l.weight_bytes, l.linear_macs, l.dense_weights);
    cost.mtp_layers.push_back(l);
  }
  if (weights_.dspark) {
    const DsparkWeights& d = *weights_.dspark;
    for (size_t i = 0; i < d.stages.size(); ++i)
      cost.dspark_layers.push_back(layer_cost(d.stages[i], layer_layout(c, c.n_layers + int64_t(i))));
    cost.dspark_main_proj_bytes = d.main_proj.weight_bytes();
    cost.dspark_markov_bytes = d.markov_w2.weight_bytes();
    cost.dspark_other_bytes = d.hc_head.fn.weight_bytes() + d.confidence.weight_bytes();
  }
  return cost;
}

void Model::prefault_weights() const {
  // Only what the forward pass reads: a checkpoint's unused tensors (a draft
  // head nobody runs, matrices expanded at load) stay out of the page cache.
  uint64_t sum = 0;
  for (const auto& [data, bytes] : weights_.mapped_ranges)
    for (int64_t i = 0; i < bytes; i += 4096) sum += data[i];
  volatile uint64_t sink = sum;
  (void)sink;
}

int64_t Model::decode_weight_bytes_per_token() const {
  const TokenCost cost = token_cost();
  int64_t bytes = cost.head_bytes + cost.other_bytes;
  for (const LayerCost& l : cost.layers) bytes += l.weight_bytes;
  return bytes;
}

int64_t Model::indexer_macs(const ModelConfig& c, const LayerLayout& layout, int64_t position) {
  if (!layout.has_indexer() && !layout.index_source) return 0;
  return c.index_n_heads * c.index_head_dim * layout.visible_rows(position);
}

int64_t Model::attention_macs(const ModelConfig& c, const LayerLayout& layout, int64_t position) {
  const int64_t window_rows = std::min(position + 1, c.window);
  int64_t compressed = layout.visible_rows(position);
  int64_t macs = indexer_macs(c, layout, position);
  if (layout.has_indexer() || layout.kind == LayerKind::Grouped) compressed = std::min(compressed, c.index_topk);
  // q.k and p.v over head_dim for every head.
  macs += 2 * c.n_heads * c.head_dim * (window_rows + compressed);
  return macs;
}

}  // namespace dsv4
