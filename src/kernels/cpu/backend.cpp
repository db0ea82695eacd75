// The CPU backend: KernelBackend on one instruction-set path. Every path
// gives the scalar path's bits, so choosing one changes speed only.
#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4 {

namespace {

// `exact`: the exact numerics (kernels/cpu/exact_sums.h) for every sum.
class CpuBackend final : public KernelBackend {
 public:
  CpuBackend(KernelIsa isa, bool exact) : isa_(isa), exact_(exact) {}
  std::string name() const override {
    return std::string("cpu-") + kernel_isa_name(isa_) + (exact_ ? "-exact" : "");
  }
  bool exact() const override { return exact_; }

  void linear(const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin, int64_t row_end,
              int64_t y_stride) const override {
    if (exact_)
      linear_forward_exact(isa_, w, x, n, y, row_begin, row_end, y_stride);
    else
      linear_forward(isa_, w, x, n, y, row_begin, row_end, y_stride);
  }
  void linear_many(const LinearProduct* products, size_t count) const override {
    if (!exact_) return linear_forward_many(isa_, products, count);
    for (size_t i = 0; i < count; ++i) {
      const LinearProduct& p = products[i];
      linear_forward_exact(isa_, *p.w, p.x, p.n, p.y, p.row_begin, p.end(), p.stride(), p.input_stride());
    }
  }
  void embed(const Linear& table, const int32_t* ids, int64_t n, int64_t copies, float* out) const override {
    const int64_t dim = table.cols;
    for (int64_t t = 0; t < n; ++t) {
      float* first = out + t * copies * dim;
      linear_decode_row(table, ids[t], first);
      for (int64_t k = 1; k < copies; ++k) std::copy_n(first, dim, first + k * dim);
    }
  }

  void rms_norm(float* x, int64_t rows, int64_t width, int64_t stride, const float* weight, float eps) const override {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows* width * 4))
    for (int64_t r = 0; r < rows; ++r) {
      if (exact_)
        cpu::rms_norm_exact(x + r * stride, weight, width, eps, isa_);
      else
        dsv4::rms_norm(x + r * stride, weight, width, eps, isa_);
    }
  }
  void rope(float* x, int64_t rows, int64_t stride, const int64_t* positions, int64_t rows_per_position,
            const RopeTable& table, bool inverse) const override {
    // The angles' cos and sin once per position (they cost more than the
    // rotation), then every row of that position rotated with them.
    const int64_t pairs = table.dim() / 2, groups = (rows + rows_per_position - 1) / rows_per_position;
#pragma omp parallel num_threads(threads_for(rows* table.dim() * 16))
    {
      std::vector<float> cosines(static_cast<size_t>(pairs)), sines(static_cast<size_t>(pairs));
#pragma omp for schedule(static)
      for (int64_t g = 0; g < groups; ++g) {
        table.angles(positions[g], inverse, cosines.data(), sines.data());
        for (int64_t r = g * rows_per_position; r < std::min(rows, (g + 1) * rows_per_position); ++r)
          rotate_pairs(x + r * stride, table.dim(), cosines.data(), sines.data(), isa_);
      }
    }
  }
  void hadamard(float* x, int64_t rows, int64_t width, int64_t stride) const override {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows* width * 8))
    for (int64_t r = 0; r < rows; ++r) hadamard_transform(x + r * stride, width);
  }
  void fp8_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const override {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows* width * 8))
    for (int64_t r = 0; r < rows; ++r) fp8_round_trip(x + r * stride, width, block);
  }
  void fp4_round(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block) const override {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows* width * 8))
    for (int64_t r = 0; r < rows; ++r) fp4_round_trip(x + r * stride, width, block);
  }
  void scale(float* x, int64_t n, float s) const override {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }
  void add(float* y, const float* x, int64_t n) const override {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }

  void decode_fp8_rows(const Fp8RowsView& rows, const int64_t* ids, int64_t count, float* out) const override {
    cpu::decode_fp8_rows(isa_, rows, ids, count, out);
  }
  void sink_attention(const SinkAttention& problem) const override { cpu::sink_attention(isa_, problem, exact_); }
  void indexer_select(const IndexerSelect& problem) const override { cpu::indexer_select(isa_, problem, exact_); }
  void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width,
                    float* out) const override {
    cpu::softmax_pool(kv, score, candidates, width, out);
  }
  std::vector<int32_t> top_k(const float* scores, int64_t n, int64_t k) const override {
    return top_k_indices(scores, n, k);
  }

  void hc_pre(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
              HcMix* mix) const override {
    cpu::hc_pre(isa_, shape, site, x_hc, n, y, mix, nullptr, exact_);
  }
  void hc_post(const HcShape& shape, const HcMix& mix, const float* y, float* x_hc, int64_t n) const override {
    cpu::hc_post(isa_, shape, mix, y, x_hc, n, exact_);
  }
  void hc_head(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y) const override {
    cpu::hc_head(isa_, shape, site, x_hc, n, y, exact_);
  }

  void hc_pre_lagged(const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, const float* pre, float* y,
                     HcMix* mix) const override {
    cpu::hc_pre(isa_, shape, site, x_hc, n, y, mix, pre, exact_);
  }
  void hc_collapse(const HcShape& shape, const float* pre, const float* x_hc, int64_t n, float* y) const override {
    cpu::hc_collapse(isa_, shape, pre, x_hc, n, y, exact_);
  }
  void engram_lookup(const EngramTable& table, const int64_t* ids, int64_t n, float* out) const override {
    cpu::engram_lookup(table, ids, n, out);
  }
  void engram_gate(const EngramGate& problem) const override { cpu::engram_gate(isa_, problem, exact_); }

  void moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias, const int32_t* hash_table,
                 const int32_t* tokens, float route_scale, int32_t* chosen, float* chosen_weights) const override {
    cpu::moe_route(scores, n, experts, k, bias, hash_table, tokens, route_scale, chosen, chosen_weights);
  }
  void experts(const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks, size_t count,
               float swiglu_limit, float* out) const override {
    cpu::experts(isa_, x, rows, dim, inter, tasks, count, swiglu_limit, out, exact_);
  }

 private:
  KernelIsa isa_;
  bool exact_;
};

const CpuBackend& cpu_backend(KernelIsa isa, bool exact) {
  static const CpuBackend scalar(KernelIsa::Scalar, false), avx2(KernelIsa::Avx2, false),
      avx512(KernelIsa::Avx512, false), scalar_exact(KernelIsa::Scalar, true), avx2_exact(KernelIsa::Avx2, true),
      avx512_exact(KernelIsa::Avx512, true);
  switch (isa) {
    case KernelIsa::Avx512: return exact ? avx512_exact : avx512;
    case KernelIsa::Avx2: return exact ? avx2_exact : avx2;
    default: return exact ? scalar_exact : scalar;
  }
}

}  // namespace

const KernelBackend& default_backend() { return cpu_backend(active_kernel_isa(), false); }
const KernelBackend& exact_backend() { return cpu_backend(active_kernel_isa(), true); }

const KernelBackend& backend_by_name(const std::string& name) {
  std::string isa_name = name.rfind("cpu-", 0) == 0 ? name.substr(4) : name;
  const bool exact = isa_name.size() > 6 && isa_name.compare(isa_name.size() - 6, 6, "-exact") == 0;
  if (exact) isa_name.resize(isa_name.size() - 6);
  KernelIsa isa;
  if (!parse_kernel_isa(isa_name, &isa))
    throw Error("unknown kernel backend '" + name +
                "' (cpu-scalar, cpu-avx2, cpu-avx512, each also with -exact for the exact numerics)");
  if (!kernel_isa_supported(isa)) throw Error("this CPU cannot run the " + name + " kernels");
  return cpu_backend(isa, exact);
}

}  // namespace dsv4
