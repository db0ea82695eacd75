#include "bench_costs.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dsv4::tools {

// Multiply-adds of a prefill of n tokens from position 0: every layer's
// matrix products for every token, attention at each position, and the head
// for the last token only (the only logits a prefill needs).
int64_t prefill_macs(const ModelConfig& c, const Model::TokenCost& cost, int64_t n) {
  int64_t macs = cost.head_macs;
  for (const Model::LayerCost& l : cost.layers) {
    macs += n * l.linear_macs;
    for (int64_t p = 0; p < n; ++p) macs += Model::attention_macs(c, l.layout, p);
  }
  return macs;
}

namespace {

// The head a step reads: the main model's, or the MTP draft's (the same, or
// its draft vocabulary's rows).
struct HeadCost {
  int64_t bytes = 0, macs = 0;
  std::array<int64_t, 4> weights{};
};
HeadCost main_head(const Model::TokenCost& cost) { return {cost.head_bytes, cost.head_macs, cost.head_weights}; }
HeadCost mtp_head(const Model::TokenCost& cost) {
  return {cost.mtp_head_bytes, cost.mtp_head_macs, cost.mtp_head_weights};
}

// Multiply-adds of `tokens` rows through `layers` at `position` (each its own
// experts and attention) and of the head for `head_rows` of them.
double step_macs(const ModelConfig& c, const HeadCost& head, const std::vector<Model::LayerCost>& layers,
                 int64_t tokens, int64_t head_rows, int64_t position) {
  double macs = 0;
  for (const Model::LayerCost& l : layers)
    macs += double(l.linear_macs) + double(Model::attention_macs(c, l.layout, position));
  return double(tokens) * macs + double(head_rows) * double(head.macs);
}

}  // namespace

// Multiply-adds of one decode step of `batch` tokens at `position`: every
// token runs its own experts, attention and the head, whatever the batch.
double decode_step_macs(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t position) {
  return step_macs(c, main_head(cost), cost.layers, batch, batch, position);
}

// Routed experts a step of `batch` tokens picks at least once, with uniform
// routing (random weights): E * (1 - (1 - k/E)^b) per layer instead of k.
double expected_distinct_experts(const ModelConfig& c, int64_t batch) {
  const double e = double(c.n_routed_experts), k = double(c.n_activated_experts);
  return e * (1.0 - std::pow(1.0 - k / e, double(batch)));
}

namespace {

// Bytes a step of `tokens` tokens reads through `layers`: the LM and HC
// heads once, one embedding row per token, and per layer its weights plus
// every routed expert beyond the k that one token picks (uniform routing).
double step_bytes(const ModelConfig& c, const Model::TokenCost& cost, const HeadCost& head,
                  const std::vector<Model::LayerCost>& layers, int64_t tokens) {
  const double k = double(c.n_activated_experts), distinct = expected_distinct_experts(c, tokens);
  double bytes = double(head.bytes + tokens * cost.other_bytes);
  for (const Model::LayerCost& l : layers) bytes += double(l.weight_bytes) + (distinct - k) * double(l.expert_bytes);
  return bytes;
}

}  // namespace

double mtp_step_bytes(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch) {
  return step_bytes(c, cost, mtp_head(cost), cost.mtp_layers, batch);
}

double dspark_step_bytes(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t block) {
  // main_proj is read once per ring extension, the Markov projection once
  // per drafted position (the chain is sequential).
  return step_bytes(c, cost, main_head(cost), cost.dspark_layers, batch * block) +
         double(cost.dspark_main_proj_bytes + cost.dspark_other_bytes) +
         double(block) * double(cost.dspark_markov_bytes);
}

double decode_step_bytes(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch) {
  return step_bytes(c, cost, main_head(cost), cost.layers, batch);
}

double decoding_floor_seconds(const std::array<double, 4>& weights, double macs, const std::array<double, 4>& rates,
                              double fma_macs_per_s) {
  double seconds = 0, decoded = 0;
  for (size_t f = 0; f < weights.size(); ++f) {
    if (weights[f] <= 0 || rates[f] <= 0) continue;
    seconds += weights[f] / rates[f];
    decoded += weights[f];
  }
  return seconds + (fma_macs_per_s > 0 ? std::max(0.0, macs - decoded) / fma_macs_per_s : 0.0);
}

namespace {

// The weights of each WeightFormat a step of `tokens` rows through `layers`
// reads (each routed expert that one of them picks once, with uniform
// routing), and the multiply-adds it does with them (the head on
// `head_rows` of the rows).
struct FormatWork {
  std::array<double, 4> weights{}, macs{};
};
FormatWork format_work(const ModelConfig& c, const HeadCost& head, const std::vector<Model::LayerCost>& layers,
                       WeightFormat expert_format, int64_t tokens, int64_t head_rows) {
  const double distinct = expected_distinct_experts(c, tokens), k = double(c.n_activated_experts);
  FormatWork work;
  for (size_t f = 0; f < work.weights.size(); ++f) {
    work.weights[f] += double(head.weights[f]);
    work.macs[f] += double(head_rows) * double(head.weights[f]);
  }
  for (const Model::LayerCost& l : layers) {
    for (size_t f = 0; f < work.weights.size(); ++f) {
      work.weights[f] += double(l.dense_weights[f]);
      work.macs[f] += double(tokens) * double(l.dense_weights[f]);
    }
    work.weights[size_t(expert_format)] += distinct * double(l.expert_weights);
    work.macs[size_t(expert_format)] += double(tokens) * k * double(l.expert_weights);
  }
  return work;
}

}  // namespace

// The compute floor of a decode step: decoding_floor_seconds over the
// weights the step reads and all its multiply-adds. A kernel that decodes in
// registers cannot beat it; on a machine with few cores per GB/s it, not the
// bytes, bounds a batched step.
double decode_step_floor_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t position,
                                 const std::array<double, 4>& rates, double fma_macs_per_s) {
  const HeadCost head = main_head(cost);
  return decoding_floor_seconds(format_work(c, head, cost.layers, cost.expert_format, batch, batch).weights,
                                step_macs(c, head, cost.layers, batch, batch, position), rates, fma_macs_per_s);
}

namespace {

// Bytes per weight of each WeightFormat, block scales included: FP8 has one
// scale byte per 128 x 128 block, FP4 one per 32 weights (Linear::weight_bytes
// for shapes that divide into whole blocks, as the checkpoints' do).
constexpr std::array<double, 4> kBytesPerWeight = {4.0, 2.0, 1.0 + 1.0 / 16384, 0.5 + 1.0 / 32};

double serial_floor_seconds(const ModelConfig& c, const HeadCost& head, const std::vector<Model::LayerCost>& layers,
                            WeightFormat expert_format, int64_t tokens, int64_t head_rows, int64_t position,
                            double step_bytes_total, double bandwidth, const std::array<double, 4>& rates,
                            double fma_macs_per_s) {
  const auto [weights, macs] = format_work(c, head, layers, expert_format, tokens, head_rows);
  auto at_bandwidth = [&](double bytes) { return bandwidth > 0 ? bytes / bandwidth : 0.0; };
  double seconds = 0, format_bytes = 0, format_macs = 0;
  for (size_t f = 0; f < weights.size(); ++f) {
    if (weights[f] <= 0) continue;
    std::array<double, 4> only{};
    only[f] = weights[f];
    const double bytes = weights[f] * kBytesPerWeight[f];
    seconds += std::max(at_bandwidth(bytes), decoding_floor_seconds(only, macs[f], rates, fma_macs_per_s));
    format_bytes += bytes;
    format_macs += macs[f];
  }
  const double other_macs = step_macs(c, head, layers, tokens, head_rows, position) - format_macs;
  seconds += at_bandwidth(std::max(0.0, step_bytes_total - format_bytes));
  if (fma_macs_per_s > 0) seconds += std::max(0.0, other_macs) / fma_macs_per_s;
  return seconds;
}

}  // namespace

double decode_step_serial_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t position,
                                  double bandwidth, const std::array<double, 4>& rates, double fma_macs_per_s) {
  return verify_step_serial_seconds(c, cost, batch, batch, position, bandwidth, rates, fma_macs_per_s);
}

double verify_step_serial_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t tokens, int64_t head_rows,
                                  int64_t position, double bandwidth, const std::array<double, 4>& rates,
                                  double fma_macs_per_s) {
  return serial_floor_seconds(c, main_head(cost), cost.layers, cost.expert_format, tokens, head_rows, position,
                              decode_step_bytes(c, cost, tokens), bandwidth, rates, fma_macs_per_s);
}

double mtp_step_serial_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t tokens, int64_t head_rows,
                               int64_t position, double bandwidth, const std::array<double, 4>& rates,
                               double fma_macs_per_s) {
  return serial_floor_seconds(c, mtp_head(cost), cost.mtp_layers, cost.expert_format, tokens, head_rows, position,
                              mtp_step_bytes(c, cost, tokens), bandwidth, rates, fma_macs_per_s);
}

// Costs of the official V4-Flash schedule, compress_ratios [0,0] + [4,128]*20
// + [4] (window, window, then CSA and HCA alternating, then CSA), built from
// this model's CSA and HCA layers (a window-only layer is an HCA layer
// without its compressor).
namespace {

// A layer without its compressor / indexer weights (and its Engram), as a
// layer of the same shapes that reuses another's rows, or a window-only one.
Model::LayerCost without_compressor(Model::LayerCost l) {
  l.weight_bytes -= l.compressor_bytes + l.engram_bytes;
  l.linear_macs -= l.compressor_macs;
  l.compressor_bytes = l.compressor_macs = l.engram_bytes = 0;
  for (size_t f = 0; f < l.dense_weights.size(); ++f) l.dense_weights[f] -= l.compressor_weights[f];
  l.compressor_weights = {};
  return l;
}

// A full schedule's totals.
FlashCost schedule_cost(const char* name, const ModelConfig& c, const Model::TokenCost& full, int64_t prompt) {
  FlashCost out;
  out.name = name;
  out.decode_bytes = full.head_bytes + full.other_bytes;
  for (const Model::LayerCost& l : full.layers) out.decode_bytes += l.weight_bytes;
  out.prefill_macs = prefill_macs(c, full, prompt);
  out.cost = full;
  return out;
}

// The released V4.1-Flash: [0,0] + [2]*18 + [1]*20; KV sources 2, 8, 14,
// 20; re-indexing layers 24, 28, 32, 36 (counted as the ratio-1 source: a
// few MB of compressor weights too many); Engram before layers 1 and 14.
std::optional<FlashCost> v41_schedule_cost(const ModelConfig& c, const Model::TokenCost& cost, int64_t prompt) {
  const Model::LayerCost *source2 = nullptr, *source1 = nullptr;
  int64_t engram_bytes = 0;
  for (size_t i = 0; i < cost.layers.size(); ++i) {
    const Model::LayerCost& l = cost.layers[i];
    const bool source = l.layout.kind == LayerKind::Grouped && l.layout.kv_group == int64_t(i);
    if (source && l.layout.ratio == 2 && !source2) source2 = &l;
    if (source && l.layout.ratio == 1 && !source1) source1 = &l;
    engram_bytes = std::max(engram_bytes, l.engram_bytes);
  }
  if (!source2 || !source1) return std::nullopt;
  auto with_engram = [&](Model::LayerCost l) {
    l.weight_bytes += engram_bytes;
    l.engram_bytes = engram_bytes;
    return l;
  };
  auto stripped = [](const Model::LayerCost* l, const LayerLayout& layout) {
    Model::LayerCost out = without_compressor(*l);
    out.layout = layout;
    return out;
  };
  Model::LayerCost window = stripped(source2, LayerLayout{}), consumer2 = stripped(source2, source2->layout),
                   consumer1 = stripped(source1, source1->layout);
  Model::LayerCost src2 = *source2, src1 = *source1;
  src2.weight_bytes -= src2.engram_bytes;
  src1.weight_bytes -= src1.engram_bytes;
  src2.engram_bytes = src1.engram_bytes = 0;
  Model::TokenCost full = cost;
  full.layers.clear();
  for (int64_t l = 0; l < 40; ++l) {
    Model::LayerCost layer = l < 2                                    ? window
                             : l < 20                                 ? ((l - 2) % 6 == 0 ? src2 : consumer2)
                             : (l == 20 || (l >= 24 && l % 4 == 0)) ? src1
                                                                    : consumer1;
    full.layers.push_back(l == 1 || l == 14 ? with_engram(layer) : layer);
  }
  return schedule_cost("40-layer V4.1-Flash", c, full, prompt);
}

}  // namespace

std::optional<FlashCost> flash_schedule_cost(const ModelConfig& c, const Model::TokenCost& cost, int64_t prompt) {
  if (c.v41) return v41_schedule_cost(c, cost, prompt);
  const Model::LayerCost* by_kind[2] = {nullptr, nullptr};  // CSA, HCA
  for (const Model::LayerCost& l : cost.layers) {
    if (l.layout.kind == LayerKind::CompressedIndexed && !by_kind[0]) by_kind[0] = &l;
    if (l.layout.kind == LayerKind::Compressed && l.layout.ratio == 128 && !by_kind[1]) by_kind[1] = &l;
  }
  if (!by_kind[0] || !by_kind[1]) return std::nullopt;
  Model::LayerCost window = without_compressor(*by_kind[1]);
  window.layout = LayerLayout{};
  Model::TokenCost flash = cost;
  flash.layers = {window, window};
  for (int i = 0; i < 20; ++i) flash.layers.insert(flash.layers.end(), {*by_kind[0], *by_kind[1]});
  flash.layers.push_back(*by_kind[0]);
  return schedule_cost("43-layer V4-Flash", c, flash, prompt);
}

}  // namespace dsv4::tools
