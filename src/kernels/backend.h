// The kernel backend: every operation of the forward pass that computes on
// tensors, behind one table, so that the model code (src/model) says *what*
// to compute and a backend says *how*. The CPU backend (kernels/cpu) is one
// implementation per instruction set; a GPU backend implements the same
// table and the model does not change.
//
// The contract every implementation keeps: the same bits as the scalar CPU
// reference for every operation (the reduction orders are spelled out at
// each operation and in kernels/linear.h), so that a token's logits depend on
// neither the backend, nor its batch, nor its chunking, nor the thread count.
//
// Buffers are host arrays on the CPU backend (see Buffer); a backend that
// keeps tensors elsewhere will hand out its own memory through buffer().
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/scratch.h"
#include "kernels/linear.h"
#include "kernels/rope.h"

namespace dsv4 {

// An activation array of the backend (pooled, not zero-filled).
using Buffer = ScratchArray<float>;

// The hyper-connection weights of one mixing site (before attention, before
// the MoE, or the head's collapse).
struct HcSite {
  const Linear* fn = nullptr;    // [mix, hc_mult * dim], fp32
  const float* base = nullptr;   // [mix]
  const float* scale = nullptr;  // [3] for blocks, [1] for heads
};
// Shape and constants of the hyper-connections.
struct HcShape {
  int64_t copies = 0;  // hc_mult
  int64_t dim = 0;
  int64_t sinkhorn_iters = 0;
  float eps = 0, norm_eps = 0;
};
// The per-token mixing weights one hc_pre computes for its hc_post.
struct HcMix {
  std::vector<float> pre, post, comb;  // [n, copies], [n, copies], [n, copies, copies]
};

// Cached KV rows as a decode state stores them (model/cache_rows.h): the
// first `nope` values of a row as e4m3 codes with one ue8m0 scale per
// `block`, the rest (the RoPE dims) as floats.
struct Fp8RowsView {
  const uint8_t* codes = nullptr;   // [rows, nope]
  const uint8_t* scales = nullptr;  // [rows, ceil(nope / block)]
  const float* rope = nullptr;      // [rows, width - nope]
  int64_t width = 0, nope = 0, block = 64;
};

// A key that the attention reads from a decode state's cached FP8 rows: row
// `id` of `rows`.
struct Fp8Key {
  const Fp8RowsView* rows = nullptr;
  int64_t id = 0;
};

// Sink attention over gathered keys (K = V). Row r's keys are
// keys[key_begin[r] .. key_begin[r+1]) in the order they are visited; its
// output for head h is sum_j p_j k_j with p the softmax over the scaled
// scores and the head's sink logit (the sink takes probability mass but has
// no value). Scores are dot_fixed products, the softmax is taken in key
// order with one exp per key, and values are accumulated key by key.
struct SinkAttention {
  const float* q = nullptr;  // [rows, heads, dim]
  int64_t rows = 0, heads = 0, dim = 0;
  const float* const* keys = nullptr;
  const int64_t* key_begin = nullptr;  // [rows + 1]
  const float* sink = nullptr;         // [heads]
  float scale = 1;
  float* out = nullptr;  // [rows, heads, dim]
  // Optional, beside keys: where keys[i] is null, the key is fp8_keys[i],
  // decoded by the backend where it reads it. Long rows decode a tile of
  // keys at a time into cache-sized memory, twice (for the scores and for
  // the weighted sums), instead of writing every row's floats to memory
  // first: at 1M tokens of context 17 MB a sequence and step
  // (docs/long_context.md, "Cached rows decoded per key tile").
  const Fp8Key* fp8_keys = nullptr;
};

// Rows of FP4 e2m1 values, two to a byte (the even index in the low
// nibble), with one ue8m0 scale byte per `block` values: the indexer keys as
// a decode state stores them (model/cache_rows.h). The backend decodes
// them as it scores, a tile at a time.
struct Fp4RowsView {
  const uint8_t* nibbles = nullptr;  // [rows, width / 2]
  const uint8_t* scales = nullptr;   // [rows, width / block]
  int64_t width = 0, block = 32;
};

// The lightning indexer's choice for each query row: score every compressed
// row it can see, score_i = sum_h relu(q_h . k_i) * w_h (heads in order), and
// keep the top_k (ties to the lower id), returned in ascending id order.
struct IndexerSelect {
  const float* q = nullptr;             // [rows, heads, dim]
  const float* head_weights = nullptr;  // [rows, heads]
  int64_t rows = 0, heads = 0, dim = 0;
  const Fp4RowsView* keys = nullptr;  // row r: its sequence's index keys (at least visible[r] rows of dim)
  const int64_t* visible = nullptr;    // [rows]
  int64_t top_k = 0;
  std::vector<std::vector<int32_t>>* selected = nullptr;  // [rows], filled
  // V4.1's two-level top-k. At the candidate source (candidates != null):
  // the scores are max-pooled over blocks of candidate_block_size rows, the
  // block of the newest visible row is always kept, and the best
  // candidate_blocks blocks (ties: lower block) become the row's candidate
  // mask ([visible[r]] bytes, 1 = candidate). At a later index source
  // (allowed != null): only rows whose allowed[r][i] is 1 compete.
  int64_t candidate_blocks = 0, candidate_block_size = 0;
  std::vector<std::vector<uint8_t>>* candidates = nullptr;
  const uint8_t* const* allowed = nullptr;
};

// An Engram table: FP8 e4m3 rows with one e8m0 scale per 32 values.
struct EngramTable {
  const uint8_t* data = nullptr;   // [rows, dim]
  const uint8_t* scale = nullptr;  // [rows, dim / 32]
  int64_t rows = 0, dim = 0;
};

// The Engram gate of n tokens: for each copy c,
// dot_c = sum_d x[c,d] * weight[c,d] * key[c,d] * rsqrt(mean x[c]^2 + eps) * rsqrt(mean key[c]^2 + eps) / sqrt(dim),
// gate_c = sigmoid(sign(dot_c) sqrt(max(|dot_c|, clamp))), x[c] += gate_c * value.
// Sums in index order (dot_fixed), one rounding per operation.
struct EngramGate {
  float* x_hc = nullptr;          // [n, copies, dim]
  const float* key = nullptr;     // [n, copies, dim] ...
  int64_t key_stride = 0;         // ... rows key_stride apart (key and value of a token are one row)
  const float* value = nullptr;   // [n, dim], rows key_stride apart
  const float* weight = nullptr;  // [copies, dim]: q_weight * k_weight
  int64_t n = 0, copies = 0, dim = 0;
  float eps = 0, clamp = 1e-6f;
};

// One expert applied to some rows of the MoE input.
struct ExpertTask {
  const Linear *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;  // gate, down, up
  const int64_t* rows = nullptr;                             // rows of x, in order
  const float* weights = nullptr;                            // per row, or null: unweighted (the shared expert)
  int64_t count = 0;
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  // "cpu-avx512", "cpu-avx2", "cpu-scalar", ... ("-exact": exact numerics)
  virtual std::string name() const = 0;
  // The exact numerics: every sum in double with exact products, one
  // rounding per result (kernels/cpu/exact_sums.h), so that results stay
  // within a few units of the last place of the exact value. Slower; what
  // V4.1's reference data need (docs/v41.md). Its own fixed orders, so the
  // bits differ from the fast numerics' but not between its paths.
  virtual bool exact() const { return false; }

  virtual Buffer buffer(int64_t floats) const { return Buffer(floats); }

  // ---- weight-format products (kernels/linear.h's reduction contract)
  // Y[t][o] = W[o] . X[t] for rows [row_begin, row_end) of W; Y is
  // [n, y_stride] (y_stride < 0: the row count).
  virtual void linear(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin = 0, int64_t row_end = -1,
                      int64_t y_stride = -1) const = 0;
  // Several independent products, each with the bits linear() gives it.
  virtual void linear_many(const LinearProduct* products, size_t count) const = 0;
  // out[t * copies + k] = row ids[t] of the table, decoded (embeddings).
  virtual void embed(const Linear& table, const int32_t* ids, int64_t n, int64_t copies, float* out) const = 0;

  // ---- per-row operations on `rows` rows of `width` values, `stride` apart
  // x <- w * x / sqrt(mean(x^2) + eps) (w null: unweighted); mean(x^2) is a
  // dot_fixed of the row with itself.
  virtual void rms_norm(float* x, int64_t rows, int64_t width, int64_t stride, const float* weight,
                        float eps) const = 0;
  // Rotates the table's dims at x + row * stride for each row; row r is at
  // positions[r / rows_per_position].
  virtual void rope(float* x, int64_t rows, int64_t stride, const int64_t* positions, int64_t rows_per_position,
                    const RopeTable& table, bool inverse) const = 0;
  // Walsh-Hadamard transform scaled by width^-1/2 (width a power of two).
  virtual void hadamard(float* x, int64_t rows, int64_t width, int64_t stride) const = 0;
  // The reference's activation round trips through FP8 (e4m3) / FP4 (e2m1)
  // with ue8m0 block scales, over the first `width` values of each row.
  virtual void fp8_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const = 0;
  virtual void fp4_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const = 0;
  // x[i] *= s.
  virtual void scale(float* x, int64_t n, float s) const = 0;
  // y[i] += x[i] (one rounding each, no fusion).
  virtual void add(float* y, const float* x, int64_t n) const = 0;

  // ---- attention cores
  // out row k <- row ids[k] of `rows` as floats (code value times its
  // block's scale, one float multiply; the RoPE dims copied).
  virtual void decode_fp8_rows(const Fp8RowsView& rows, const int64_t* ids, int64_t count, float* out) const = 0;
  virtual void sink_attention(const SinkAttention& problem) const = 0;
  virtual void indexer_select(const IndexerSelect& problem) const = 0;
  // The compressor's gated pooling of one window: out[ch] = sum_s kv_s[ch] *
  // softmax_s(score_s[ch]) over the candidates, in candidate order.
  virtual void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width,
                            float* out) const = 0;
  // Indices of the k largest of n scores (ties: lower index), ascending.
  virtual std::vector<int32_t> top_k(const float* scores, int64_t n, int64_t k) const = 0;

  // ---- hyper-connections
  // Collapses each token's copies into one sublayer input y [n, dim] and
  // returns the mixing weights for hc_post (Sinkhorn-normalised comb).
  virtual void hc_pre(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
                      HcMix* mix) const = 0;
  // x[k] <- post[k] * y + sum_j comb[j][k] * x[j] for every token.
  virtual void hc_post(const HcShape& shape, const HcMix& mix, const float* y, float* x_hc, int64_t n) const = 0;
  // The head's collapse (sigmoid pre weights, no Sinkhorn).
  virtual void hc_head(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y) const = 0;
  // V4.1's lagged pre: the mixing weights of this site (for hc_post, and
  // mix->pre for the next sublayer), but the collapse into y with `pre`
  // ([n, copies], what the previous sublayer's mix computed).
  virtual void hc_pre_lagged(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, const float* pre,
                             float* y, HcMix* mix) const = 0;
  // y = sum_k pre[k] * x[k] per token (the collapse of hc_pre alone).
  virtual void hc_collapse(const HcShape& shape, const float* pre, const float* x_hc, int64_t n, float* y) const = 0;

  // ---- Engram (V4.1's n-gram hash memory)
  // out[t] = the table rows ids[t], decoded (e4m3 values times their
  // per-32 e8m0 scale).
  virtual void engram_lookup(const EngramTable& table, const int64_t* ids, int64_t n, float* out) const = 0;
  // x[c] += gate_c * value per token and copy (see EngramGate).
  virtual void engram_gate(const EngramGate& problem) const = 0;

  // ---- mixture of experts
  // Router: scores = sqrt(softplus(logits)) in place ([n, experts]); picks k
  // experts per token, by score + bias (bias may be null) or from
  // hash_table[token] ([vocab, k], when not null); weights are the picked
  // scores normalised to sum 1, times route_scale.
  virtual void moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias,
                         const int32_t* hash_table, const int32_t* tokens, float route_scale, int32_t* chosen,
                         float* chosen_weights) const = 0;
  // Runs the experts (clamped SwiGLU: silu(min(a, L)) * clamp(b, -L, L) *
  // weight; limit <= 0: no clamp) and writes out[r] = the sum of every task's
  // output for row r, in task order (out has rows x dim, zeroed here).
  virtual void experts(const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks, size_t count,
                       float swiglu_limit, float* out) const = 0;
};

// The process's backend: the CPU path chosen at start (DSV4_KERNELS or the
// CPU's best, see kernels/cpu/isa.h).
const KernelBackend& default_backend();
// The same path with the exact numerics.
const KernelBackend& exact_backend();
// A backend by name ("cpu-scalar", "cpu-avx2", "cpu-avx512", or "scalar",
// "avx2", "avx512", each also with "-exact"); throws Error for an unknown or
// unsupported one.
const KernelBackend& backend_by_name(const std::string& name);

}  // namespace dsv4
