#include "bench_context.h"

#include <algorithm>
#include <cstdio>

#include "bench_costs.h"
#include "core/machine.h"
#include "kernels/timed_backend.h"
#include "model/synthetic_state.h"

namespace dsv4::tools {

ContextCost context_cost(const ModelConfig& c, const LayerLayout& layout, int64_t position) {
  ContextCost cost;
  cost.macs = double(Model::attention_macs(c, layout, position));
  cost.indexer_macs = double(Model::indexer_macs(c, layout, position));
  // Row sizes in storage (model/cache_rows.h): FP8 codes + a scale per
  // block + fp32 rotated dims (V4 KV rows; V4.1 windows: FP8 over the whole
  // row in 32-blocks); FP4 nibbles + a scale byte per block.
  const double nope = double(c.nope_dim()), hd = double(c.head_dim);
  const double kv_row = c.v41 ? hd + hd / 32 : nope + nope / 64 + 4 * double(c.rope_dim);
  const double fp4_row = hd / 2 + hd / 16, key_row = double(c.index_head_dim) / 2 + double(c.index_head_dim) / 32;
  const double window = double(std::min(position + 1, c.window)), visible = double(layout.visible_rows(position));
  cost.bytes = window * kv_row;
  if (layout.has_indexer()) {
    cost.bytes += visible * key_row + std::min(visible, double(c.index_topk)) * kv_row;
  } else if (layout.kind == LayerKind::Grouped) {
    if (layout.index_source) cost.bytes += visible * key_row;
    cost.bytes += std::min(visible, double(c.index_topk)) * fp4_row;
  } else if (layout.compresses()) {
    cost.bytes += visible * kv_row;
  }
  return cost;
}

double run_with_timed_backend(Model& model, TimedBackend& timed, const std::function<void()>& work) {
  struct Restore {
    Model& model;
    const KernelBackend& inner;
    ~Restore() { model.set_backend(inner); }
  } restore{model, model.backend()};
  model.set_backend(timed);
  const double t0 = now_seconds();
  work();
  return now_seconds() - t0;
}

namespace {

struct ContextRoofline {
  double seconds = 0;  // the longest of the three below
  double bytes_seconds = 0, compute_seconds = 0;
  // The operations one after another: the weight products at the floor the
  // batch rows print for them (each weight format at the longer of its
  // bytes and its decoding; position 1, so no attention in it), then
  // attention and the indexer at the longer of their rows' bytes and their
  // multiply-adds at the ceilings. Without this term a batch's roofline
  // here was the bytes alone, above the batch rows'.
  double weights_seconds = 0, context_seconds = 0;
};

// The roofline of a step that reads `bytes` (weights and cached rows) and
// does `flops` (`indexer_flops` of them the indexer's, at its own ceiling,
// the rest at the fp32 FMA ceiling), against `m`; `indexer_ceiling` zero:
// the indexer at the FMA ceiling too.
ContextRoofline context_roofline(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, double bytes,
                                 double flops, double indexer_flops, double context_bytes, double context_flops,
                                 const MachineLimits& m, double indexer_ceiling) {
  const double fma = m.fma_flops(), indexer = indexer_ceiling > 0 ? indexer_ceiling : fma;
  auto at_ceilings = [&](double total) { return (total - indexer_flops) / fma + indexer_flops / indexer; };
  ContextRoofline r;
  r.bytes_seconds = bytes / m.bandwidth;
  r.compute_seconds = at_ceilings(flops);
  r.weights_seconds = decode_step_serial_seconds(c, cost, batch, 1, m.bandwidth, m.one_token_rates, fma / 2);
  r.context_seconds = std::max(context_bytes / m.bandwidth, at_ceilings(context_flops));
  r.seconds = std::max({r.bytes_seconds, r.compute_seconds, r.weights_seconds + r.context_seconds});
  return r;
}

}  // namespace

void run_context_bench(Model& model, const std::vector<int64_t>& contexts, const std::vector<int64_t>& batches,
                       int64_t steps, const ContextBenchLimits& limits, std::ofstream& csv) {
  const ModelConfig& c = model.config();
  const Model::TokenCost cost = model.token_cost();
  std::printf(
      "long contexts: each sequence starts from a synthetic decode state of N tokens (its window, compressed rows "
      "and indexer keys filled with random values in their storage formats; nothing is prefilled), then decodes 4 "
      "warm-up steps and %lld timed ones\n",
      (long long)steps);
  for (int64_t context : contexts) {
    ContextCost per_token;
    for (const Model::LayerCost& l : cost.layers) {
      const ContextCost lc = context_cost(c, l.layout, context);
      per_token.bytes += lc.bytes;
      per_token.macs += lc.macs;
      per_token.indexer_macs += lc.indexer_macs;
    }
    double build = now_seconds();
    const SequenceState base = synthetic_context_state(c, context, uint64_t(context));
    build = now_seconds() - build;
    std::printf(
        "context %7lld: per token, attention + indexer read %.1f MB of cached rows and do %.2f G multiply-adds (%.2f G "
        "of them the indexer's); "
        "the weights are %.3f GB (state built in %.1f s, %.0f MB per sequence)\n",
        (long long)context, per_token.bytes / 1e6, per_token.macs / 1e9, per_token.indexer_macs / 1e9,
        double(model.decode_weight_bytes_per_token()) / 1e9, build, double(base.memory_bytes()) / 1e6);
    for (int64_t batch : batches) {
      std::vector<SequenceState> states;
      // Warm-up steps before the timed ones: the first touch of the scratch
      // buffers, and the first compressed rows appended to each copied state
      // (a copy's row arrays have no spare capacity, so that append moves
      // them: hundreds of MB per sequence at 1M tokens, once per doubling in
      // an engine, but in every step of a short timed run here). Four steps
      // complete a ratio-4 row; a ratio-128 row needs more than the run
      // lasts (the contexts are multiples of 128).
      constexpr int64_t kWarmSteps = 4;
      std::vector<int32_t> tokens(size_t(batch * (kWarmSteps + steps + 1)));
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919 + 17) % uint64_t(c.vocab_size));
      std::vector<float> logits(size_t(batch * c.vocab_size));
      auto step = [&](int64_t s) {
        std::vector<BatchItem> items;
        for (int64_t b = 0; b < batch; ++b)
          items.push_back({&states[size_t(b)], &tokens[size_t(s * batch + b)], 1, logits.data() + b * c.vocab_size});
        model.forward_batch(items);
      };
      // Each run from fresh copies of the state, its timed steps bracketed
      // by two reads of the limits, as the batch rows' runs are: on a shared
      // machine the bandwidth and the cores' speed move by a third within
      // minutes, so a run is set against the limits of its own moment (the
      // better of the two reads), and the run-wide best is printed beside
      // it. The best of `repeat` runs counts, with the limits read around it.
      double dt = 0;
      MachineLimits here;
      std::vector<double> times;
      for (int r = 0; r < std::max(1, limits.repeat); ++r) {
        states.assign(size_t(batch), base);
        for (int64_t s = 0; s < kWarmSteps; ++s) step(s);
        double t = 0;
        const MachineLimits around = read_limits_around(
            *limits.best, [] { return read_machine_limits(1); },
            [&] {
              const double t0 = now_seconds();
              for (int64_t s = kWarmSteps; s < kWarmSteps + steps; ++s) step(s);
              t = (now_seconds() - t0) / double(steps);
            });
        times.push_back(t);
        if (dt == 0 || t < dt) dt = t, here = around;
      }
      if (times.size() > 1) {
        std::printf("  batch %2lld: %zu runs,", (long long)batch, times.size());
        for (double t : times) std::printf(" %.2f", 1e3 * t);
        std::printf(" ms/step; the best counts\n");
      }
      // One more step with every backend operation timed: where it goes.
      TimedBackend timed(model.backend());
      const double timed_step = run_with_timed_backend(model, timed, [&] { step(kWarmSteps + steps); });
      const double weights = decode_step_bytes(c, cost, batch);
      const double bytes = weights + double(batch) * per_token.bytes;
      const double flops = 2.0 * decode_step_macs(c, cost, batch, context);
      const double indexer_flops = 2.0 * double(batch) * per_token.indexer_macs;
      const double context_flops = 2.0 * double(batch) * per_token.macs;
      const ContextRoofline roof =
          context_roofline(c, cost, batch, bytes, flops, indexer_flops, double(batch) * per_token.bytes, context_flops,
                           here, limits.indexer_flops);
      const ContextRoofline best =
          context_roofline(c, cost, batch, bytes, flops, indexer_flops, double(batch) * per_token.bytes, context_flops,
                           *limits.best, limits.indexer_flops);
      const double attention = timed.account(OpAccount::Attention).seconds,
                   indexer = timed.account(OpAccount::Indexer).seconds,
                   products = timed.account(OpAccount::Linear).seconds + timed.account(OpAccount::Experts).seconds;
      const double outside = timed_step - timed.total_seconds();
      std::printf(
          "  batch %2lld: %8.2f ms/step %8.2f tokens/s = %5.1f%% of the roofline %.2f tokens/s at the limits around "
          "this run [%s] (%.1f%% of the %.2f at the run-wide best limits) (%.0f MB: %.1f ms at the bandwidth; %.1f "
          "GFLOP: %.1f ms at the compute ceilings; one after another, the weight products %.1f ms + attention and "
          "indexer %.1f ms); one more step timed per operation (%.1f ms): weight products %.0f%%, attention %.0f%%, "
          "indexer + top-k %.0f%%, model code between operations %.0f%%\n",
          (long long)batch, 1e3 * dt, double(batch) / dt, 100 * roof.seconds / dt, double(batch) / roof.seconds,
          here.text().c_str(), 100 * best.seconds / dt, double(batch) / best.seconds, bytes / 1e6,
          1e3 * roof.bytes_seconds, flops / 1e9, 1e3 * roof.compute_seconds, 1e3 * roof.weights_seconds,
          1e3 * roof.context_seconds, 1e3 * timed_step, 100 * products / timed_step, 100 * attention / timed_step,
          100 * indexer / timed_step, 100 * outside / timed_step);
      if (csv)
        csv << "decode_context_" << context << "," << batch << "," << batch * steps << "," << dt * double(steps) << ","
            << double(batch) / dt << "," << per_token.bytes << ",,," << flops / 1e9 << ",\n";
    }
  }
}

}  // namespace dsv4::tools
