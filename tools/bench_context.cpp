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
      std::vector<SequenceState> states(size_t(batch), base);
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
      for (int64_t s = 0; s < kWarmSteps; ++s) step(s);
      const double t0 = now_seconds();
      for (int64_t s = kWarmSteps; s < kWarmSteps + steps; ++s) step(s);
      const double dt = (now_seconds() - t0) / double(steps);
      // One more step with every backend operation timed: where it goes.
      TimedBackend timed(model.backend());
      const double timed_step = run_with_timed_backend(model, timed, [&] { step(kWarmSteps + steps); });
      const double weights = decode_step_bytes(c, cost, batch);
      const double bytes = weights + double(batch) * per_token.bytes;
      const double flops = 2.0 * decode_step_macs(c, cost, batch, context);
      // The indexer's share of the FLOPs at its own ceiling, the rest at
      // the fp32 FMA ceiling.
      const double indexer_flops = 2.0 * double(batch) * per_token.indexer_macs;
      auto at_ceilings = [&](double total_flops) {
        return (total_flops - indexer_flops) / limits.fma_flops + indexer_flops / limits.indexer_flops;
      };
      const double compute_seconds = at_ceilings(flops);
      // The operations run one after another: the weight products at the
      // floor the batch rows print for them (each weight format at the
      // longer of its bytes and its decoding; position 1, so no attention
      // in it), then attention and the indexer at the longer of their rows'
      // bytes and their multiply-adds at the ceilings. Without this term a
      // batch's roofline here was the bytes alone, above the batch rows'.
      const double weights_seconds =
          decode_step_serial_seconds(c, cost, batch, 1, limits.bandwidth, limits.one_token_rates, limits.fma_flops / 2);
      const double context_flops = 2.0 * double(batch) * per_token.macs;
      const double context_seconds =
          std::max(double(batch) * per_token.bytes / limits.bandwidth, at_ceilings(context_flops));
      const double serial_seconds = weights_seconds + context_seconds;
      const double roof_seconds = std::max({bytes / limits.bandwidth, compute_seconds, serial_seconds});
      const double attention = timed.account(OpAccount::Attention).seconds,
                   indexer = timed.account(OpAccount::Indexer).seconds,
                   products = timed.account(OpAccount::Linear).seconds + timed.account(OpAccount::Experts).seconds;
      const double outside = timed_step - timed.total_seconds();
      std::printf(
          "  batch %2lld: %8.2f ms/step %8.2f tokens/s = %5.1f%% of the roofline %.2f tokens/s (%.0f MB: %.1f ms at "
          "the bandwidth; %.1f GFLOP: %.1f ms at the compute ceilings; one after another, the weight products %.1f ms "
          "+ attention and indexer %.1f ms); one more step timed per operation (%.1f ms): weight products %.0f%%, "
          "attention %.0f%%, indexer + top-k %.0f%%, model code between operations %.0f%%\n",
          (long long)batch, 1e3 * dt, double(batch) / dt, 100 * roof_seconds / dt, double(batch) / roof_seconds,
          bytes / 1e6, 1e3 * bytes / limits.bandwidth, flops / 1e9, 1e3 * compute_seconds, 1e3 * weights_seconds,
          1e3 * context_seconds, 1e3 * timed_step, 100 * products / timed_step, 100 * attention / timed_step,
          100 * indexer / timed_step, 100 * outside / timed_step);
      if (csv)
        csv << "decode_context_" << context << "," << batch << "," << batch * steps << "," << dt * double(steps) << ","
            << double(batch) / dt << "," << per_token.bytes << ",,," << flops / 1e9 << ",\n";
    }
  }
}

}  // namespace dsv4::tools
