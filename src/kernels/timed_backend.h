// A backend that times another: every operation is forwarded to the inner
// backend and its wall time added to the operation's account. `dsv4 bench`
// runs one prefill through it to report where a step's time goes (the
// weight products against the rest: attention, indexer, compressor,
// hyper-connections, norms...). The bits are the inner backend's.
//
// Operations are timed from the calling thread (the model calls the backend
// from one thread; each operation parallelises inside), so the accounts add
// up to the time spent inside the backend; the rest of a step is the model
// code between operations.
#pragma once
#include <array>
#include <map>
#include <string>

#include "kernels/backend.h"

namespace dsv4 {

// What a timed operation is counted as.
enum class OpAccount {
  Linear,       // linear, linear_many, embed: the weight products
  Experts,      // the routed and shared experts (their products and SwiGLU)
  Attention,    // sink attention, decode_fp8_rows (its cached keys)
  Indexer,      // the lightning indexer's scores and top-k, top_k
  Compressor,   // the compressor's gated pooling
  HyperConn,    // hc_pre, hc_post, hc_head, hc_pre_lagged, hc_collapse
  Elementwise,  // norms, rope, Hadamard, FP8/FP4 round trips, scale, add
  Routing,      // moe_route
  Engram,       // engram_lookup, engram_gate
};
constexpr int kOpAccounts = 9;
const char* op_account_name(OpAccount account);
// A short identifier (CSV columns): linear, experts, attention, ...
const char* op_account_key(OpAccount account);

class TimedBackend : public KernelBackend {
 public:
  explicit TimedBackend(const KernelBackend& inner) : inner_(inner) {}

  struct Account {
    double seconds = 0;
    int64_t calls = 0;
  };
  const Account& account(OpAccount a) const { return accounts_[size_t(a)]; }
  double total_seconds() const;
  void reset() {
    accounts_ = {};
    products_.clear();
  }

  // The weight products again, by kind, to show which of them keeps a step
  // from its roofline: a product is named by its weight format and token
  // count ("FP8 x4"), the experts of a MoE call by their routed matrices'
  // format ("experts FP4"; their shared expert's bytes are counted with
  // them). Bytes are one pass over the rows used, scales included; `tokens`
  // adds up the tokens of every matrix pass, so tokens / passes is the mean
  // number of tokens an expert matrix was read for. `weights` counts one
  // pass's weights by format (WeightFormat), `macs` the multiply-adds (each
  // pass's weights times its tokens): what a product's compute floor needs.
  struct ProductAccount {
    double seconds = 0;
    double bytes = 0;
    int64_t calls = 0;
    int64_t passes = 0;
    int64_t tokens = 0;
    std::array<double, 4> weights{};
    double macs = 0;
  };
  const std::map<std::string, ProductAccount>& products() const { return products_; }

  std::string name() const override { return inner_.name(); }
  bool exact() const override { return inner_.exact(); }
  Buffer buffer(int64_t floats) const override { return inner_.buffer(floats); }

  void linear(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin, int64_t row_end,
              int64_t y_stride) const override;
  void linear_many(const LinearProduct* products, size_t count) const override;
  void embed(const Linear& table, const int32_t* ids, int64_t n, int64_t copies, float* out) const override;
  void rms_norm(float* x, int64_t rows, int64_t width, int64_t stride, const float* weight,
                float eps) const override;
  void rope(float* x, int64_t rows, int64_t stride, const int64_t* positions, int64_t rows_per_position,
            const RopeTable& table, bool inverse) const override;
  void hadamard(float* x, int64_t rows, int64_t width, int64_t stride) const override;
  void fp8_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const override;
  void fp4_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const override;
  void scale(float* x, int64_t n, float s) const override;
  void add(float* y, const float* x, int64_t n) const override;
  void decode_fp8_rows(const Fp8RowsView& rows, const int64_t* ids, int64_t count, float* out) const override;
  void sink_attention(const SinkAttention& problem) const override;
  void indexer_select(const IndexerSelect& problem) const override;
  void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width,
                    float* out) const override;
  std::vector<int32_t> top_k(const float* scores, int64_t n, int64_t k) const override;
  void hc_pre(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
              HcMix* mix) const override;
  void hc_post(const HcShape& shape, const HcMix& mix, const float* y, float* x_hc, int64_t n) const override;
  void hc_head(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y) const override;
  void hc_pre_lagged(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, const float* pre,
                     float* y, HcMix* mix) const override;
  void hc_collapse(const HcShape& shape, const float* pre, const float* x_hc, int64_t n, float* y) const override;
  void engram_lookup(const EngramTable& table, const int64_t* ids, int64_t n, float* out) const override;
  void engram_gate(const EngramGate& problem) const override;
  void moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias, const int32_t* hash_table,
                 const int32_t* tokens, float route_scale, int32_t* chosen, float* chosen_weights) const override;
  void experts(const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks, size_t count,
               float swiglu_limit, float* out) const override;

 private:
  const KernelBackend& inner_;
  mutable std::array<Account, kOpAccounts> accounts_{};
  mutable std::map<std::string, ProductAccount> products_;
  template <class F>
  decltype(auto) timed(OpAccount a, F&& f) const;
};

}  // namespace dsv4
