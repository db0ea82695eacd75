// The cost model behind `dsv4 bench`'s rooflines: multiply-adds and bytes of
// prefill and decode steps, the weight-decoding floor of a batched step, and
// the full V4-Flash layer schedule built from a slice's layer shapes.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "model/model.h"

namespace dsv4::tools {

int64_t prefill_macs(const ModelConfig& c, const Model::TokenCost& cost, int64_t n);
double decode_step_macs(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t position);
double expected_distinct_experts(const ModelConfig& c, int64_t batch);
double decode_step_bytes(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch);
// The compute floor of work that reads weights[f] weights of each format
// (WeightFormat) and does `macs` multiply-adds: each weight decoded once at
// the rate its format reaches with one token from cache (`rates`, weights/s;
// that includes one FMA lane per weight; a format without a rate is left to
// the FMAs), every other multiply-add (other tokens', attention) at the fp32
// FMA ceiling. The steps' floors below and each product kind's in `dsv4
// bench`'s splits (bench_products.h) are this.
double decoding_floor_seconds(const std::array<double, 4>& weights, double macs, const std::array<double, 4>& rates,
                              double fma_macs_per_s);
double decode_step_floor_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t position,
                                 const std::array<double, 4>& rates, double fma_macs_per_s);
// The floor of a step whose weight products run one after another, each on
// all cores, as the engine runs them (one product's output is the next one's
// input): per weight format, the longer of its bytes at `bandwidth` and its
// decoding floor (decoding_floor_seconds over that format's weights and
// multiply-adds), summed, plus the step's other bytes (embedding rows) at the
// bandwidth and its other multiply-adds (attention) at the FMA ceiling. Since
// max(a1 + a2, b1 + b2) <= max(a1, b1) + max(a2, b2), it is never below the
// bytes alone or the decoding alone, and above both where one format is
// bound by its bytes and another by its decoding, as a slice's BF16 head and
// its FP4 experts are at batch 1 (docs/kernels.md, "Products one after
// another").
double decode_step_serial_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t position,
                                  double bandwidth, const std::array<double, 4>& rates, double fma_macs_per_s);
// The same for a verify step of `tokens` rows whose LM head runs on
// `head_rows` of them (the engine skips the rows past a sequence's expected
// accept length where that pays: Engine::first_head_rows), and for one MTP
// block step of `tokens` rows whose head runs on `head_rows` of them.
double verify_step_serial_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t tokens, int64_t head_rows,
                                  int64_t position, double bandwidth, const std::array<double, 4>& rates,
                                  double fma_macs_per_s);
double mtp_step_serial_seconds(const ModelConfig& c, const Model::TokenCost& cost, int64_t tokens, int64_t head_rows,
                               int64_t position, double bandwidth, const std::array<double, 4>& rates,
                               double fma_macs_per_s);

// Bytes one MTP block step of `batch` tokens reads: the block (the experts
// its tokens pick) and the shared LM head.
double mtp_step_bytes(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch);

// Bytes of one DSpark draft for `batch` sequences of `block` positions: the
// stages (the experts of batch*block tokens), the shared head, main_proj
// for the rows the rings learn, and the Markov projection once per position.
double dspark_step_bytes(const ModelConfig& c, const Model::TokenCost& cost, int64_t batch, int64_t block);

struct FlashCost {
  std::string name;  // "43-layer V4-Flash" or "40-layer V4.1-Flash"
  int64_t decode_bytes = 0, prefill_macs = 0;
  Model::TokenCost cost;  // per layer, in the full schedule
};
// The released model's schedule built from a slice's layer shapes: V4-Flash
// from a CSA and an HCA layer, V4.1-Flash from a ratio-2 and a ratio-1 KV
// source. None when the slice lacks one of them.
std::optional<FlashCost> flash_schedule_cost(const ModelConfig& c, const Model::TokenCost& cost, int64_t prompt);

}  // namespace dsv4::tools
