// DeepSeek-V4 model: a loaded checkpoint and its forward pass.
//
// The API is narrow on purpose (ds4-style): callers own a SequenceState and
// feed tokens in order; the model never keeps per-request state itself.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "io/config.h"
#include "io/residency.h"
#include "io/safetensors.h"
#include "kernels/backend.h"
#include "model/engram.h"
#include "model/layer_kind.h"
#include "model/state.h"
#include "model/weights.h"

namespace dsv4 {

struct Segment;        // model/layers.h
struct GroupedShared;  // model/layers.h

// The check of token ids against a vocabulary: throws dsv4::Error naming
// the first id outside [0, vocab) as "<what> N is outside the vocabulary".
// The one implementation: the engine's validate_request runs it on a
// request, and the forward pass runs it on what it embeds as its own memory
// guard (an id past the table must never be read, whoever calls).
void check_token_ids(int64_t vocab, const int32_t* ids, int64_t n, const char* what = "token id");

// One sequence's share of a batched forward call.
struct BatchItem {
  SequenceState* state;
  const int32_t* tokens;  // n tokens at positions state->n_tokens ...
  int64_t n;
  float* logits = nullptr;    // [n, vocab] (or [vocab] with last_logits_only) or null
  float* final_hc = nullptr;  // [n, hc_mult, dim] or null
  // Only the last token's logits: what generation needs after a prefill
  // chunk; saves the vocabulary-sized head for the other rows.
  bool last_logits_only = false;
  // final_hc receives only the last `final_hc_rows` rows ([rows, hc_mult,
  // dim]; -1: all n). The MTP drafter needs just the window's worth of a
  // long prefill chunk.
  int64_t final_hc_rows = -1;
  // V4.1 bounded replay (Model::replay_layer): the layers from the replay
  // layer on run only on the positions from `replay_from` (earlier ones get
  // the replay layer's compressed rows only); -1: every layer on every row.
  // Rows before replay_from then have no logits or final state worth reading.
  int64_t replay_from = -1;
  // DSpark: the mean over HC copies of the outputs of the checkpoint's
  // target layers, concatenated ([rows, targets * dim]), of the last
  // `dspark_hidden_rows` rows (-1: all n), or null.
  float* dspark_hidden = nullptr;
  int64_t dspark_hidden_rows = -1;
};

// One sequence's share of a DSpark draft (see Model::dspark_draft).
struct DsparkDraftItem {
  SequenceState* state;         // its rings hold positions up to p = state->dspark_tokens - 1
  int32_t first_token;          // y: the token at p+1, sampled and not yet fed
  int64_t block;                // drafted positions p+1 .. p+block
  int32_t* ids;                 // [block + 1]: y, then the drafts (ids[i+1] predicts p+2+i)
  float* logits = nullptr;      // [block, vocab] with the Markov bias, or null
  float* confidence = nullptr;  // [block], or null
  // Picks draft i (ids[i + 1]) from position i's logits (Markov bias
  // included), which the next position's Markov bias then follows; null:
  // the highest logit (the lowest id on ties). The engine draws a
  // constrained sequence's drafts inside its grammar this way.
  std::function<int32_t(int64_t i, const float* logits)> choose;
};

// One sequence's share of a batched MTP call (see forward_mtp).
struct MtpBatchItem {
  SequenceState* state;
  const float* hc;
  const int32_t* next_tokens;
  int64_t n;
  float* logits;  // [n, vocab], [vocab] with last_logits_only, or null
  bool last_logits_only = false;
  // The MTP block's own final HC state of the last row ([hc_mult, dim]) or
  // null: a chained draft feeds it back as the next position's `hc`.
  float* last_hc = nullptr;
};

struct LoadOptions {
  // progress(done, total) while tensors are validated and bound.
  std::function<void(int64_t, int64_t)> progress;
  // Map the checkpoint files or copy the weights into huge-page memory
  // (io/residency.h); Auto decides by the memory available, counting
  // reserved_bytes (the caches the caller will allocate) beside them.
  LoadMode load_mode = LoadMode::Mmap;
  int64_t reserved_bytes = 0;
  // V4.1 Engram: the compressed id of every token id, derived from the
  // tokenizer (text/engram_token_map.h). Empty: read the token_map of an
  // engram_tokenizer.json beside config.json (the tiny test checkpoints).
  std::vector<int32_t> engram_token_map;
  // The kernels that run the forward pass (null: default_backend()).
  const KernelBackend* backend = nullptr;
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  // Whether the weights are mapped or copied, and why (for startup logs).
  const ResidencyChoice& residency() const { return residency_; }
  const ModelWeights& weights() const { return weights_; }
  // Layer kinds of the main layers, then the MTP layers.
  const std::vector<LayerLayout>& layouts() const { return layouts_; }
  const KernelBackend& backend() const { return *backend_; }
  // Switches the kernels (every backend gives the same bits; tests compare
  // them). Not while a forward pass runs.
  void set_backend(const KernelBackend& backend) { backend_ = &backend; }
  SequenceState new_state() const;

  // Processes `n` tokens at positions state.n_tokens ... state.n_tokens+n-1.
  // logits: [n, vocab] or null; final_hc: [n, hc_mult, dim] or null (MTP input).
  // The result for a token does not depend on n or on how earlier tokens were
  // chunked.
  void forward(SequenceState& state, const int32_t* tokens, int64_t n, float* logits, float* final_hc = nullptr) const;
  // Several sequences in one pass: every weight is read once for all their
  // tokens. Each sequence gets exactly the bits it would get alone.
  void forward_batch(const std::vector<BatchItem>& items) const;
  // The LM head alone on rows of the final HC state that forward_batch
  // handed out (BatchItem::final_hc): logits [n, vocab], the bits
  // forward_batch gives those rows. A verify step asks for its rows' logits
  // a few at a time this way (docs/speculative.md, "The verify step's
  // head"). V4.1 collapses its rows with a lagged pre that final_hc does not
  // carry: there it throws (head_from_final_hc() is false).
  void head_logits(const float* final_hc, int64_t n, float* logits) const;
  bool head_from_final_hc() const { return !config_.v41; }

  // MTP block over positions state.mtp_tokens ... +n-1: row i uses the main
  // model's final HC state of that position (hc [n, hc_mult, dim]) and the
  // token that follows it (next_tokens), and predicts the token after that.
  void forward_mtp(SequenceState& state, const float* hc, const int32_t* next_tokens, int64_t n, float* logits) const;
  void forward_mtp_batch(const std::vector<MtpBatchItem>& items) const;
  bool has_mtp() const { return !weights_.mtp.empty(); }
  // EAGLE's draft vocabulary (SGLang's --speculative-token-map, FR-Spec):
  // the MTP block's logits are computed for these token ids only, from a
  // copy of their LM head rows, and are -infinity for every other token, so
  // a draft step reads ids/vocab of the head. Drafts are verified by the
  // main model with its whole head, so the output does not change; a draft
  // outside the vocabulary is never proposed. Needs an MTP block and a BF16
  // or F32 head; ids in [0, vocab), no repeats (any order). An empty list
  // restores the whole head. Call before an engine runs the model.
  void set_draft_vocab(std::vector<int32_t> ids);
  const std::vector<int32_t>& draft_vocab() const { return draft_vocab_; }
  // V4.1 bounded replay (SGLang's --enable-decoder-swa-bounded-replay):
  // the first layer of the late half, the ratio-1 KV source whose compressed
  // rows (one per token) every later layer attends; -1 when the model has
  // none (V4). See BatchItem::replay_from and docs/v41.md.
  int64_t replay_layer() const { return replay_layer_; }
  // V4.1: the Engram addressing (empty without Engram layers).
  const EngramHasher& engram_hasher() const { return engram_; }

  // DSpark head (model/dspark.cpp; docs/speculative.md). dspark_extend
  // writes the stages' ring rows of positions first .. first+n-1 from the
  // main model's target-layer states (BatchItem::dspark_hidden rows);
  // dspark_draft drafts a block after the last position the rings hold,
  // greedily (temperature 0). The state is not changed by a draft.
  bool has_dspark() const { return weights_.dspark.has_value(); }
  void dspark_extend(SequenceState& state, const float* main_hidden, int64_t first, int64_t n) const;
  // Several sequences at once: every weight is read once for all their rows.
  struct DsparkExtension {
    SequenceState* state;
    const float* main_hidden;  // [n, targets * dim]
    int64_t first, n;
  };
  void dspark_extend_batch(const std::vector<DsparkExtension>& items) const;
  void dspark_draft(const std::vector<DsparkDraftItem>& items) const;

  // Observer of the HC residual state: called with layer index 0 after the
  // embedding and l+1 after main layer l, for a chunk of n tokens at `start`.
  using HcObserver = std::function<void(int64_t index, const float* x_hc, int64_t start, int64_t n)>;
  void set_hc_observer(HcObserver observer) { hc_observer_ = std::move(observer); }
  // V4.1: called with layer l after the Engram add that precedes block l.
  void set_engram_observer(HcObserver observer) { engram_observer_ = std::move(observer); }

  // Bytes of weights one decode step reads for a single token: everything but
  // the embedding table (one row) and the unselected routed experts.
  int64_t decode_weight_bytes_per_token() const;
  // Touches every page of the mapped weights the forward pass reads.
  void prefault_weights() const;

  // What one token costs in weight bytes read and matrix-product
  // multiply-adds, split so that benchmarks can report FLOP/s and scale the
  // numbers to other layer counts. `compressor_*` is the part of a layer that
  // only compressed layers have (compressors and indexer).
  struct LayerCost {
    LayerLayout layout;
    int64_t weight_bytes = 0, linear_macs = 0;
    int64_t compressor_bytes = 0, compressor_macs = 0;
    int64_t expert_bytes = 0;    // one routed expert (weight_bytes has n_activated of them)
    int64_t expert_weights = 0;  // its weights (multiply-adds per token)
    // Weights of every matrix but the routed experts, by WeightFormat (what
    // a decode step decodes once whatever its batch), and the part of them
    // that belongs to the compressors and the indexer.
    std::array<int64_t, 4> dense_weights{}, compressor_weights{};
    int64_t engram_bytes = 0;  // V4.1 Engram layers: the projection of the looked-up rows (in weight_bytes)
  };
  struct TokenCost {
    int64_t head_bytes = 0, head_macs = 0;  // LM head and HC head
    int64_t other_bytes = 0;                // one embedding row
    std::vector<LayerCost> layers;          // main layers
    // MTP blocks (with their input projections and HC head; the LM head
    // they share is head_bytes).
    std::vector<LayerCost> mtp_layers;
    // DSpark stages, and the head's other weights: main_proj (read when the
    // rings learn rows), the Markov projection W2 (read once per drafted
    // position: the chain is sequential) and the rest (HC head, confidence).
    std::vector<LayerCost> dspark_layers;
    int64_t dspark_main_proj_bytes = 0, dspark_markov_bytes = 0, dspark_other_bytes = 0;
    std::array<int64_t, 4> head_weights{};  // by WeightFormat
    // The head as an MTP draft step reads it: the same, or with a draft
    // vocabulary its rows only.
    int64_t mtp_head_bytes = 0, mtp_head_macs = 0;
    std::array<int64_t, 4> mtp_head_weights{};
    WeightFormat expert_format = WeightFormat::F32;
  };
  TokenCost token_cost() const;
  // Attention multiply-adds of one token at `position` in one layer of that
  // layout (scores and values over the window and the selected compressed
  // rows, plus the indexer's scores on CSA layers).
  static int64_t attention_macs(const ModelConfig& config, const LayerLayout& layout, int64_t position);
  // The indexer's share of attention_macs: its scores of every visible
  // compressed row (0 on layers without an indexer).
  static int64_t indexer_macs(const ModelConfig& config, const LayerLayout& layout, int64_t position);

 private:
  Model() = default;
  // lag_pre: V4.1's lagged pre ([n_rows, hc_mult]): the attention collapses
  // with it, and it returns the FFN's mix for the next block (null: V4).
  void block_forward(const BlockWeights& block, const std::vector<Segment>& segments, float* x_hc,
                     const int32_t* tokens, int64_t n_rows, GroupedShared& shared, float* lag_pre = nullptr) const;
  // A block whose attention is `attention(y, out)` over the normed rows
  // (the main layers' attention, or a DSpark stage's block attention).
  void block_forward_with(const BlockWeights& block, float* x_hc, const int32_t* tokens, int64_t n,
                          const std::function<void(const float* y, float* out)>& attention,
                          float* lag_pre = nullptr) const;
  // Bounded replay at the replay layer: the compressed rows (and index
  // keys) of the rows that skip the late layers.
  void replay_compress(const BlockWeights& block, const std::vector<Segment>& segments, const float* x_hc,
                       const float* lag_pre, int64_t n) const;
  // V4.1's Engram before block `layer`: hash_ids [n, columns] of its table.
  void engram_forward(const EngramWeights& engram, const int64_t* hash_ids, float* x_hc, int64_t n) const;
  void dspark_stage(const BlockWeights& stage, size_t index, const std::vector<DsparkDraftItem>& items, float* x_hc,
                    const int32_t* tokens, const int64_t* positions, int64_t n, float* lag_pre) const;
  // `head` (the LM head, or the draft vocabulary's rows of it) on the listed
  // rows of x_hc only: [rows, head.rows] logits. V4.1 (lag_pre not null):
  // the rows collapse with their lagged pre instead of an HC head.
  std::vector<float> head_rows_forward(const Linear& head, const HyperConnectionWeights& hc_head,
                                       const std::vector<float>& norm, const float* x_hc,
                                       const std::vector<int64_t>& rows, const float* lag_pre = nullptr) const;
  void head_forward(const Linear& head, const HyperConnectionWeights& hc_head, const std::vector<float>& norm,
                    const float* x_hc, int64_t n, float* logits) const;
  // The MTP block's head on the listed rows: [rows, vocab] logits, with a
  // draft vocabulary its tokens' only (the other logits -infinity).
  std::vector<float> mtp_head_rows(const MtpWeights& m, const float* x_hc, const std::vector<int64_t>& rows) const;

  ModelConfig config_;
  std::vector<LayerLayout> layouts_;
  const KernelBackend* backend_ = nullptr;
  TensorStore store_;
  ResidencyChoice residency_;
  ModelWeights weights_;
  RopeTable rope_window_, rope_compressed_;
  HcObserver hc_observer_, engram_observer_;
  EngramHasher engram_;
  int64_t replay_layer_ = -1;
  std::vector<int32_t> draft_vocab_;  // sorted
  std::vector<uint8_t, HugePageAllocator<uint8_t>> draft_head_bytes_;  // streamed like the weights
  Linear draft_head_;  // the head's rows of draft_vocab_, in draft_head_bytes_
};

}  // namespace dsv4
