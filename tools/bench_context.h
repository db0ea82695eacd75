// `dsv4 bench --context N,...`: decode speed with long contexts. Each
// sequence starts from a synthetic decode state (model/synthetic_state.h:
// the rows N tokens leave, random values in their storage formats, no
// prefill), then decodes; printed beside what the step reads and computes
// for attention and the indexer against the weights, and the roofline of
// both.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <vector>

#include "kernels/timed_backend.h"
#include "machine_limits.h"
#include "model/model.h"

namespace dsv4::tools {

// What the context rows set their steps against. The bandwidth, the FMA
// ceiling and the one-token rates are read again around every context run
// (read_limits_around, as the batch rows do) and `best` keeps the run-wide
// best of each; the indexer's ceiling is the one read at startup.
struct ContextBenchLimits {
  MachineLimits* best = nullptr;  // the run-wide best limits, raised by every read
  // What the indexer's multiply-adds run at: the int8 dot-product ceiling
  // where its integer scores use VPDPBUSD, else zero (the fp32 FMA ceiling
  // of the same read then stands in).
  double indexer_flops = 0;
  int repeat = 1;  // each row's best of this many runs (--repeat)
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
