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

void hc_pre(KernelIsa isa, const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y,
            HcMix* mix);
void hc_post(KernelIsa isa, const HcShape& shape, const HcMix& mix, const float* y, float* x_hc, int64_t n);
void hc_head(KernelIsa isa, const HcShape& shape, const HcSite& site, const float* x_hc, int64_t n, float* y);

void sink_attention(KernelIsa isa, const SinkAttention& problem);
void indexer_select(KernelIsa isa, const IndexerSelect& problem);
void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width, float* out);

void moe_route(float* scores, int64_t n, int64_t experts, int64_t k, const float* bias, const int32_t* hash_table,
               const int32_t* tokens, float route_scale, int32_t* chosen, float* chosen_weights);
void experts(KernelIsa isa, const float* x, int64_t rows, int64_t dim, int64_t inter, const ExpertTask* tasks,
             size_t count, float swiglu_limit, float* out);

}  // namespace dsv4::cpu
