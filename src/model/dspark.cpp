// DSpark, the block drafter of the refreshed checkpoints (V4-Flash-0731,
// V4-Pro-0813; docs/speculative.md). Three window-only stages read the main
// model's hidden states through their own rings of KV rows and draft a
// block of positions at once from [y, noise, noise, ...]: inside the block
// attention is bidirectional. A small Markov head then corrects the block's
// logits one position at a time with the previous pick, and a confidence
// head scores each pick.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/layers.h"
#include "model/model.h"

namespace dsv4 {

void Model::dspark_extend(SequenceState& state, const float* main_hidden, int64_t first, int64_t n) const {
  dspark_extend_batch({DsparkExtension{&state, main_hidden, first, n}});
}

void Model::dspark_extend_batch(const std::vector<DsparkExtension>& items) const {
  if (!has_dspark()) throw Error("this checkpoint has no DSpark head");
  const ModelConfig& c = config_;
  const DsparkWeights& d = *weights_.dspark;
  const KernelBackend& kb = *backend_;
  const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  // Only a window's worth of rows can stay in a ring.
  std::vector<float> hidden;
  std::vector<int64_t> positions;
  for (const DsparkExtension& it : items)
    for (int64_t t = std::max<int64_t>(0, it.n - c.window); t < it.n; ++t) {
      hidden.insert(hidden.end(), it.main_hidden + t * width, it.main_hidden + (t + 1) * width);
      positions.push_back(it.first + t);
    }
  const int64_t n = int64_t(positions.size());
  if (n > 0) {
    // main_x = RMSNorm(main_proj . main_hidden; main_norm)
    Buffer x = kb.buffer(n * c.dim);
    kb.linear(d.main_proj, hidden.data(), n, x.data());
    kb.rms_norm(x.data(), n, c.dim, c.dim, d.main_norm.data(), c.norm_eps);
    // Each stage keeps the window KV rows of main_x with its own wkv and
    // kv_norm, rotated at the main positions (plain RoPE: window-only).
    for (size_t s = 0; s < d.stages.size(); ++s) {
      Buffer kv = attention_kv_rows(kb, c, d.stages[s].attn, rope_window_, positions.data(), x.data(), n);
      int64_t row = 0;
      for (const DsparkExtension& it : items)
        for (int64_t t = std::max<int64_t>(0, it.n - c.window); t < it.n; ++t, ++row)
          it.state->dspark_rings[s].set((it.first + t) % c.window, kv.data() + row * c.head_dim);
    }
  }
  for (const DsparkExtension& it : items)
    if (it.n > 0) it.state->dspark_tokens = it.first + it.n;
}

// One stage over the draft rows of all items: a block whose attention sees
// the item's ring (positions p-window+1 .. p) and all of its draft rows.
void Model::dspark_stage(const BlockWeights& b, size_t index, const std::vector<DsparkDraftItem>& items, float* x_hc,
                         const int32_t* tokens, const int64_t* positions, int64_t n, float* lag_pre) const {
  const ModelConfig& c = config_;
  const KernelBackend& kb = *backend_;
  const int64_t hd = c.head_dim;
  block_forward_with(b, x_hc, tokens, n, [&](const float* y, float* out) {
    // V4's stages keep the per-head query norm of its attention (V4.1 has none).
    AttentionInputs in = attention_inputs(kb, c, b.attn, rope_window_, positions, y, n, !c.v41);
    const AttentionQueries& q = in.queries;
    const Buffer& kv = in.kv;
    std::vector<std::vector<float>> ring(items.size());
    std::vector<const float*> keys;
    std::vector<int64_t> key_begin;
    int64_t row0 = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const DsparkDraftItem& it = items[i];
      const int64_t last = it.state->dspark_tokens - 1, first = std::max<int64_t>(0, last - c.window + 1);
      ring[i].resize(size_t((last - first + 1) * hd));
      for (int64_t p = first; p <= last; ++p)
        it.state->dspark_rings[index].decode(p % c.window, ring[i].data() + (p - first) * hd);
      for (int64_t r = 0; r < it.block; ++r) {
        key_begin.push_back(int64_t(keys.size()));
        for (int64_t p = first; p <= last; ++p) keys.push_back(ring[i].data() + (p - first) * hd);
        for (int64_t k = 0; k < it.block; ++k) keys.push_back(kv.data() + (row0 + k) * hd);
      }
      row0 += it.block;
    }
    key_begin.push_back(int64_t(keys.size()));
    Buffer o = kb.buffer(n * c.n_heads * hd);
    kb.sink_attention({q.q.data(), n, c.n_heads, hd, keys.data(), key_begin.data(), b.attn.sink.data(),
                       1.0f / std::sqrt(float(hd)), o.data()});
    attention_output(kb, c, b.attn, rope_window_, positions, o.data(), n, out);
  }, lag_pre);
}

void Model::dspark_draft(const std::vector<DsparkDraftItem>& items) const {
  if (!has_dspark()) throw Error("this checkpoint has no DSpark head");
  const ModelConfig& c = config_;
  const DsparkWeights& d = *weights_.dspark;
  const KernelBackend& kb = *backend_;
  const int64_t D = c.dim, V = c.vocab_size, rank = c.dspark_markov_rank;
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  int64_t longest = 0;
  for (const DsparkDraftItem& it : items) {
    if (it.block < 1) throw Error("a DSpark block needs at least one position");
    if (it.state->dspark_tokens < 1) throw Error("DSpark drafts after a position its rings hold");
    check_token_ids(V, &it.first_token, 1);
    const int64_t p = it.state->dspark_tokens - 1;
    for (int64_t j = 0; j < it.block; ++j) {
      tokens.push_back(j == 0 ? it.first_token : int32_t(c.dspark_noise_token_id));
      positions.push_back(p + 1 + j);
    }
    longest = std::max(longest, it.block);
  }
  const int64_t n = int64_t(tokens.size());
  if (n == 0) return;
  Buffer x_hc = kb.buffer(n * c.hc_mult * D);
  kb.embed(weights_.embed, tokens.data(), n, c.hc_mult, x_hc.data());
  // V4.1's stages chain the lagged pre, starting one-hot on copy 0.
  std::vector<float> lag_pre;
  if (c.v41) {
    lag_pre.assign(size_t(n * c.hc_mult), 0.0f);
    for (int64_t r = 0; r < n; ++r) lag_pre[size_t(r * c.hc_mult)] = 1.0f;
  }
  for (size_t s = 0; s < d.stages.size(); ++s)
    dspark_stage(d.stages[s], s, items, x_hc.data(), tokens.data(), positions.data(), n,
                 c.v41 ? lag_pre.data() : nullptr);
  // Collapse (V4: the HC head; V4.1: the last stage's FFN pre), then the
  // shared head on the normed rows; the confidence head reads the rows
  // before the norm.
  Buffer x = kb.buffer(n * D), normed = kb.buffer(n * D);
  if (c.v41)
    kb.hc_collapse(hc_shape(c), lag_pre.data(), x_hc.data(), n, x.data());
  else
    kb.hc_head(hc_shape(c), hc_site(d.hc_head), x_hc.data(), n, x.data());
  std::copy_n(x.data(), n * D, normed.data());
  kb.rms_norm(normed.data(), n, D, D, d.norm.data(), c.norm_eps);
  std::vector<float> logits(size_t(n * V));
  kb.linear(weights_.head, normed.data(), n, logits.data());

  // The Markov chain, position by position for all items at once:
  // logits_i += W2 . W1[out_i]; out_{i+1} = argmax (first index on ties),
  // or the item's own choice.
  std::vector<int64_t> row_of(items.size());
  for (size_t i = 0, r = 0; i < items.size(); r += size_t(items[i].block), ++i) {
    row_of[i] = int64_t(r);
    items[i].ids[0] = items[i].first_token;
  }
  for (int64_t step = 0; step < longest; ++step) {
    std::vector<size_t> active;
    std::vector<int32_t> previous;
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].block > step) active.push_back(i), previous.push_back(items[i].ids[step]);
    const int64_t m = int64_t(active.size());
    Buffer embedded = kb.buffer(m * rank), bias = kb.buffer(m * V), joined = kb.buffer(m * (D + rank)),
           score = kb.buffer(m);
    kb.embed(d.markov_w1, previous.data(), m, 1, embedded.data());
    kb.linear(d.markov_w2, embedded.data(), m, bias.data());
    for (int64_t a = 0; a < m; ++a) {
      const DsparkDraftItem& it = items[active[size_t(a)]];
      const int64_t row = row_of[active[size_t(a)]] + step;
      float* out = logits.data() + row * V;
      kb.add(out, bias.data() + a * V, V);
      it.ids[step + 1] = it.choose ? it.choose(step, out) : int32_t(std::max_element(out, out + V) - out);
      check_token_ids(V, &it.ids[step + 1], 1);
      if (it.logits) std::copy_n(out, V, it.logits + step * V);
      std::copy_n(x.data() + row * D, D, joined.data() + a * (D + rank));
      std::copy_n(embedded.data() + a * rank, rank, joined.data() + a * (D + rank) + D);
    }
    kb.linear(d.confidence, joined.data(), m, score.data());
    for (int64_t a = 0; a < m; ++a)
      if (items[active[size_t(a)]].confidence) items[active[size_t(a)]].confidence[step] = score.data()[a];
  }
}

}  // namespace dsv4
