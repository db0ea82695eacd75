#include "kernels/timed_backend.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace dsv4 {

const char* op_account_name(OpAccount account) {
  switch (account) {
    case OpAccount::Linear: return "weight products";
    case OpAccount::Experts: return "experts (products + SwiGLU)";
    case OpAccount::Attention: return "sink attention (+ cached rows decoded)";
    case OpAccount::Indexer: return "indexer + top-k";
    case OpAccount::Compressor: return "compressor pooling";
    case OpAccount::HyperConn: return "hyper-connections";
    case OpAccount::Elementwise: return "norms, RoPE, Hadamard, FP8/FP4 rounding";
    case OpAccount::Routing: return "MoE routing";
    case OpAccount::Engram: return "Engram";
  }
  return "?";
}

const char* op_account_key(OpAccount account) {
  static const char* const keys[kOpAccounts] = {"linear",     "experts",           "attention",
                                                 "indexer",    "compressor",        "hyper_connections",
                                                 "elementwise", "routing",          "engram"};
  return keys[int(account)];
}

double TimedBackend::total_seconds() const {
  double s = 0;
  for (const Account& a : accounts_) s += a.seconds;
  return s;
}

namespace {

const char* short_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::FP8_BLOCK128: return "FP8";
    case WeightFormat::FP4_BLOCK32: return "FP4";
  }
  return "?";
}

// "FP8 x4": a product's format and token count.
std::string product_kind(const LinearProduct& product) {
  return std::string(short_format_name(product.w->format)) + " x" + std::to_string(product.n);
}

// One pass over the product's rows: their bytes (scales included, in
// proportion), weights and multiply-adds.
void add_pass(TimedBackend::ProductAccount& p, const LinearProduct& product) {
  const Linear& w = *product.w;
  const int64_t rows = product.rows();
  p.bytes += w.rows > 0 ? double(w.weight_bytes()) * double(rows) / double(w.rows) : 0.0;
  const double weights = double(rows) * double(w.cols);
  p.weights[size_t(w.format)] += weights;
  p.macs += weights * double(product.n);
  ++p.passes;
  p.tokens += product.n;
}

}  // namespace

template <class F>
decltype(auto) TimedBackend::timed(OpAccount a, F&& f) const {
  struct Stop {
    Account& account;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Stop() {
      account.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++account.calls;
    }
  } stop{accounts_[size_t(a)]};
  return f();
}

void TimedBackend::linear(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin, int64_t row_end,
                          int64_t y_stride) const {
  const double before = accounts_[size_t(OpAccount::Linear)].seconds;
  timed(OpAccount::Linear, [&] { inner_.linear(w, x, n, y, row_begin, row_end, y_stride); });
  const LinearProduct product{&w, x, n, y, row_begin, row_end, y_stride};
  ProductAccount& p = products_[product_kind(product)];
  p.seconds += accounts_[size_t(OpAccount::Linear)].seconds - before;
  ++p.calls;
  add_pass(p, product);
}
// Products of one kind (a grouped projection's slices) are counted as that
// kind; a mix by its formats in order of appearance, joined, with the token
// count where they share it ("FP8+BF16 x1": a layer's products of its
// input in one batch).
void TimedBackend::linear_many(const LinearProduct* products, size_t count) const {
  const double before = accounts_[size_t(OpAccount::Linear)].seconds;
  timed(OpAccount::Linear, [&] { inner_.linear_many(products, count); });
  std::vector<WeightFormat> formats;
  bool one_count = true;
  for (size_t i = 0; i < count; ++i) {
    if (std::find(formats.begin(), formats.end(), products[i].w->format) == formats.end())
      formats.push_back(products[i].w->format);
    one_count = one_count && products[i].n == products[0].n;
  }
  std::string kind;
  for (WeightFormat f : formats) kind += (kind.empty() ? "" : "+") + std::string(short_format_name(f));
  kind += one_count && count > 0 ? " x" + std::to_string(products[0].n) : " (several token counts)";
  ProductAccount& p = products_[kind];
  p.seconds += accounts_[size_t(OpAccount::Linear)].seconds - before;
  ++p.calls;
  for (size_t i = 0; i < count; ++i) add_pass(p, products[i]);
}
void TimedBackend::embed(const Linear& table, const int32_t* ids, int64_t n, int64_t copies, float* out) const {
  timed(OpAccount::Linear, [&] { inner_.embed(table, ids, n, copies, out); });
}
void TimedBackend::rms_norm(float* x, int64_t rows, int64_t width, int64_t stride, const float* weight,
                            float eps) const {
  timed(OpAccount::Elementwise, [&] { inner_.rms_norm(x, rows, width, stride, weight, eps); });
}
void TimedBackend::rope(float* x, int64_t rows, int64_t stride, const int64_t* positions, int64_t rows_per_position,
                        const RopeTable& table, bool inverse) const {
  timed(OpAccount::Elementwise, [&] { inner_.rope(x, rows, stride, positions, rows_per_position, table, inverse); });
}
void TimedBackend::hadamard(float* x, int64_t rows, int64_t width, int64_t stride) const {
  timed(OpAccount::Elementwise, [&] { inner_.hadamard(x, rows, width, stride); });
}
void TimedBackend::fp8_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const {
  timed(OpAccount::Elementwise, [&] { inner_.fp8_round(x, rows, width, stride, block); });
}
void TimedBackend::fp4_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const {
  timed(OpAccount::Elementwise, [&] { inner_.fp4_round(x, rows, width, stride, block); });
}
void TimedBackend::scale(float* x, int64_t n, float s) const {
  timed(OpAccount::Elementwise, [&] { inner_.scale(x, n, s); });
}
void TimedBackend::add(float* y, const float* x, int64_t n) const {
  timed(OpAccount::Elementwise, [&] { inner_.add(y, x, n); });
}
void TimedBackend::decode_fp8_rows(const Fp8RowsView& rows, const int64_t* ids, int64_t count, float* out) const {
  timed(OpAccount::Attention, [&] { inner_.decode_fp8_rows(rows, ids, count, out); });
}

void TimedBackend::sink_attention(const SinkAttention& problem) const {
  timed(OpAccount::Attention, [&] { inner_.sink_attention(problem); });
}
void TimedBackend::indexer_select(const IndexerSelect& problem) const {
  timed(OpAccount::Indexer, [&] { inner_.indexer_select(problem); });
}
void TimedBackend::softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width,
                                float* out) const {
  timed(OpAccount::Compressor, [&] { inner_.softmax_pool(kv, score, candidates, width, out); });
}
std::vector<int32_t> TimedBackend::top_k(const float* scores, int64_t n, int64_t k) const {
  return timed(OpAccount::Indexer, [&] { return inner_.top_k(scores, n, k); });
}
void TimedBackend::hc_pre(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
                          HcMix* mix) const {
  timed(OpAccount::HyperConn, [&] { inner_.hc_pre(shape, site, x_hc, n, y, mix); });
}
void TimedBackend::hc_post(const HcShape& shape, const HcMix& mix, const float* y, float* x_hc, int64_t n) const {
  timed(OpAccount::HyperConn, [&] { inner_.hc_post(shape, mix, y, x_hc, n); });
}
void TimedBackend::hc_head(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y) const {
  timed(OpAccount::HyperConn, [&] { inner_.hc_head(shape, site, x_hc, n, y); });
}
void TimedBackend::hc_pre_lagged(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n,
                                 const float* pre, float* y, HcMix* mix) const {
  timed(OpAccount::HyperConn, [&] { inner_.hc_pre_lagged(shape, site, x_hc, n, pre, y, mix); });
}
void TimedBackend::hc_collapse(const HcShape& shape, const float* pre, const float* x_hc, int64_t n,
                               float* y) const {
  timed(OpAccount::HyperConn, [&] { inner_.hc_collapse(shape, pre, x_hc, n, y); });
}
void TimedBackend::engram_lookup(const EngramTable& table, const int64_t* ids, int64_t n, float* out) const {
  timed(OpAccount::Engram, [&] { inner_.engram_lookup(table, ids, n, out); });
}
void TimedBackend::engram_gate(const EngramGate& problem) const {
  timed(OpAccount::Engram, [&] { inner_.engram_gate(problem); });
}
void TimedBackend::moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias,
                             const int32_t* hash_table, const int32_t* tokens, float route_scale, int32_t* chosen,
                             float* chosen_weights) const {
  timed(OpAccount::Routing, [&] {
    inner_.moe_route(scores, n, experts, k, bias, hash_table, tokens, route_scale, chosen, chosen_weights);
  });
}
void TimedBackend::experts(const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks,
                           size_t count, float swiglu_limit, float* out) const {
  const double before = accounts_[size_t(OpAccount::Experts)].seconds;
  timed(OpAccount::Experts, [&] { inner_.experts(x, rows, dim, inter, tasks, count, swiglu_limit, out); });
  // Named by the routed experts' format (tasks with weights); the shared
  // expert (no weights) is only named when it runs alone.
  const ExpertTask* named = nullptr;
  for (size_t i = 0; i < count && !named; ++i)
    if (tasks[i].weights && tasks[i].count > 0) named = &tasks[i];
  for (size_t i = 0; i < count && !named; ++i)
    if (tasks[i].count > 0) named = &tasks[i];
  if (!named) return;
  ProductAccount& p = products_[std::string("experts ") + short_format_name(named->w1->format)];
  p.seconds += accounts_[size_t(OpAccount::Experts)].seconds - before;
  ++p.calls;
  for (size_t i = 0; i < count; ++i) {
    const ExpertTask& t = tasks[i];
    if (t.count == 0) continue;
    for (const Linear* w : {t.w1, t.w2, t.w3}) add_pass(p, LinearProduct{w, nullptr, t.count, nullptr});
  }
}

}  // namespace dsv4
