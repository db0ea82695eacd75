// `dsv4 bench --context N,...`: decode speed with long contexts. Each
// sequence starts from a synthetic decode state (model/synthetic_state.h:
// the rows N tokens leave, random values in their storage formats, no
// prefill), then decodes; printed beside what the step reads and computes
// for attention and the indexer against the weights, and the roofline of
// both.
#pragma once
#include <array>
#include <cstdint>
#include <fstream>
#include <functional>
#include <vector>

#include "kernels/timed_backend.h"
#include "model/model.h"

namespace dsv4::tools {

struct ContextBenchLimits {
  double bandwidth = 0;  // bytes/s
  double fma_flops = 0;  // the fp32 FMA ceiling (attention runs in fp32 lanes)
  // What the indexer's multiply-adds run at: the int8 dot-product ceiling
  // where its integer scores use VPDPBUSD, else the fp32 FMA ceiling.
  double indexer_flops = 0;
  // Weights/s each weight format is decoded at with one token from cache
  // (decode_rate.h), for the weight products' floor as the batch rows
  // print it (bench_costs.h, decode_step_serial_seconds).
  std::array<double, 4> one_token_rates{};
};

// Bytes of cached rows and multiply-adds of attention and indexer that one
// token at `position` reads and does in one layer (`macs` includes the
// indexer's `indexer_macs`).
struct ContextCost {
  double bytes = 0, macs = 0, indexer_macs = 0;
};
ContextCost context_cost(const ModelConfig& c, const LayerLayout& layout, int64_t position);

// Runs `work` with the model's kernels wrapped in `timed` (whose inner
// backend must be the model's), restoring them afterwards, also when `work`
// throws; returns the wall time of `work`.
double run_with_timed_backend(Model& model, TimedBackend& timed, const std::function<void()>& work);

void run_context_bench(Model& model, const std::vector<int64_t>& contexts, const std::vector<int64_t>& batches,
                       int64_t steps, const ContextBenchLimits& limits, std::ofstream& csv);

}  // namespace dsv4::tools
