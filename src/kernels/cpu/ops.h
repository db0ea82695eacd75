// The CPU implementations behind KernelBackend (kernels/backend.h), each for
// an explicit instruction-set path. The backend object (kernels/cpu/backend.cpp)
// binds the path; these are its building blocks and what the kernel tests
// call to compare paths.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace dsv4::cpu {

// `exact`: the exact numerics (exact_sums.h) for the sums of every function
// that takes the flag: the same bits on every instruction-set path too.
void hc_pre(KernelIsa isa, const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
            HcMix* mix, const float* collapse_pre = nullptr, bool exact = false);
void hc_collapse(KernelIsa isa, const HcShape& shape, const float* pre, const float* x_hc, int64_t n, float* y,
                 bool exact = false);
void hc_post(KernelIsa isa, const HcShape& shape, const HcMix& mix, const float* y, float* x_hc, int64_t n,
             bool exact = false);
void hc_head(KernelIsa isa, const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
             bool exact = false);

void sink_attention(KernelIsa isa, const SinkAttention& problem, bool exact = false);
void decode_fp8_rows(KernelIsa isa, const Fp8RowsView& rows, const int64_t* ids, int64_t count, float* out);
void indexer_select(KernelIsa isa, const IndexerSelect& problem, bool exact = false);
// The fast numerics' scores of query row `row` against its visible keys, as
// indexer_select computes them before the top-k (for tests of their bits).
void indexer_row_scores(KernelIsa isa, const IndexerSelect& problem, int64_t row, float* scores);
void engram_lookup(const EngramTable& table, const int64_t* ids, int64_t n, float* out);
void engram_gate(KernelIsa isa, const EngramGate& problem, bool exact = false);
// x <- w * x / sqrt(mean(x^2) + eps) with the mean in double and one
// rounding per element (the exact numerics' norm).
void rms_norm_exact(float* x, const float* w, int64_t n, float eps, KernelIsa isa);
void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width, float* out);

void moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias, const int32_t* hash_table,
               const int32_t* tokens, float route_scale, int32_t* chosen, float* chosen_weights);
void experts(KernelIsa isa, const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks,
             size_t count, float swiglu_limit, float* out, bool exact = false);

}  // namespace dsv4::cpu
