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

// Rows of one sequence inside a batch of rows: rows [row0, row0+n) of every
// activation matrix belong to positions start .. start+n-1 of that sequence.
struct Segment {
  LayerState* state;
  int64_t start;
  int64_t row0;
  int64_t n;
};

// Gated pooling compressor, in two steps: the projections of all rows of a
// batch at once, then, per sequence, the tokens pushed in order through the
// partial-window state; every completed row (normed, rotated at its first
// position, rounded like the reference) is appended to `rows`.
struct CompressorProjections {
  std::vector<float> kv, score;  // [n_rows, slot_width]
};
CompressorProjections compressor_project(const CompressorWeights& w, const float* x, int64_t n_rows);
void compressor_push(const ModelConfig& c, const CompressorWeights& w, const RopeTable& rope,
                     bool indexer_keys, CompressorState& state, const CompressorProjections& proj,
                     int64_t row0, int64_t start, int64_t n, std::vector<float>& rows);

// Attention over a batch of rows from one or more sequences.
void attention_forward(const ModelConfig& c, const AttentionWeights& w, const RopeTable& rope,
                       int64_t ratio, const std::vector<Segment>& segments, const float* x,
                       int64_t n_rows, float* out);

void moe_forward(const ModelConfig& c, const MoeWeights& w, const float* x, const int32_t* tokens,
                 int64_t n, float* out);

}  // namespace dsv4
