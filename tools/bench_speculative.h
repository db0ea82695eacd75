// `dsv4 bench --speculative EAGLE|NGRAM`: see bench_speculative.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "machine_limits.h"
#include "model/model.h"

namespace dsv4::tools {

struct SpeculativeBenchArgs {
  std::string algorithm;
  std::vector<double> accept_lens = {2, 3, 4};
  std::vector<int64_t> batches = {1};
  int64_t drafts = 3, decode = 32;
  // Every request's prompt. Past the model's window (128 tokens) a run also
  // pays what longer contexts add: attention over the whole window, the
  // compressed rows, and the draft rows kept and trimmed beyond it.
  int64_t prompt = 16;
  // Tokens of each request of the gate's runs in turn (the warm-ups keep
  // `decode`): past the gate's probe intervals for its steady state.
  int64_t gate_decode = 32;
  bool split = true;  // one more run per accept length, its kernels timed per phase (draft, verify)
  // Rounds of the batch's runs (plain, then each accept length forced and
  // gated), one after another; each case's best round counts.
  int repeat = 1;
};

void run_speculative_bench(const std::shared_ptr<Model>& model, const SpeculativeBenchArgs& args,
                           const MachineLimits& limits, std::ostream* csv);

}  // namespace dsv4::tools
