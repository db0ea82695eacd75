// Sublayers of a DeepSeek-V4 block. Internal to the model; each works on a
// chunk of `n` consecutive tokens of one sequence starting at `start`.
#pragma once
#include <cstdint>

#include "io/config.h"
#include "model/ops.h"
#include "model/state.h"
#include "model/weights.h"

namespace dsv4 {

// Hyper-connections (mHC): collapse the hc_mult residual copies into one
// sublayer input, and expand the sublayer output back.
struct HcMix {
  std::vector<float> pre, post, comb;  // [n, hc], [n, hc], [n, hc, hc]
};
void hc_pre(const ModelConfig& c, const HyperConnectionWeights& w, const float* x_hc, int64_t n,
            float* y, HcMix* mix);
void hc_post(const ModelConfig& c, const HcMix& mix, const float* y, float* x_hc, int64_t n);
// HC head: collapse without Sinkhorn (output head and MTP head).
void hc_head_collapse(const ModelConfig& c, const HyperConnectionWeights& w, const float* x_hc,
                      int64_t n, float* y);

// Gated pooling compressor: feeds the tokens' projections through `state` and
// appends every completed row (normed, rotated at its first position and
// rounded like the reference) to `rows`.
void compressor_forward(const ModelConfig& c, const CompressorWeights& w, const RopeTable& rope,
                        bool indexer_keys, CompressorState& state, const float* x, int64_t start,
                        int64_t n, std::vector<float>& rows);

void attention_forward(const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       int64_t ratio, LayerState& state, const float* x, int64_t start, int64_t n,
                       float* out);

void moe_forward(const ModelConfig& c, const MoeWeights& w, const float* x, const int32_t* tokens,
                 int64_t n, float* out);

}  // namespace dsv4
