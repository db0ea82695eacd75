// Helpers shared by the model tests: golden files and run schedules.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/model.h"

namespace dsv4::test {

// gtest parameter name of a golden case ("tiny-flash-fp8" -> "tiny_flash_fp8").
inline std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

inline std::string model_dir(const std::string& name) { return std::string(DSV4_TEST_DATA) + "/models/" + name; }

inline std::vector<float> read_f32(const TensorStore& s, const std::string& name) {
  const TensorInfo& t = s.get(name);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, size_t(t.nbytes));
  return v;
}

inline std::vector<int32_t> read_i32(const TensorStore& s, const std::string& name) {
  const TensorInfo& t = s.get(name);
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, size_t(t.nbytes));
  return v;
}

struct RunResult {
  std::vector<float> logits;      // [n, V]
  std::vector<float> mtp_logits;  // [n, V], last row zero
};

// Prefills the first `prefill` tokens in chunks of `chunk`, then decodes one
// token at a time; the MTP block follows the same schedule.
inline RunResult run_schedule(const Model& model, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk,
                              bool mtp) {
  const int64_t n = int64_t(tokens.size()), V = model.config().vocab_size;
  const int64_t W = model.config().hc_mult * model.config().dim;
  RunResult r;
  r.logits.assign(size_t(n * V), 0.0f);
  std::vector<float> hc(size_t(n * W));
  SequenceState state = model.new_state();
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int64_t b = 0; b < prefill; b += chunk) pieces.push_back({b, std::min(chunk, prefill - b)});
  for (int64_t b = prefill; b < n; ++b) pieces.push_back({b, 1});
  for (auto [b, len] : pieces) model.forward(state, tokens.data() + b, len, r.logits.data() + b * V, hc.data() + b * W);
  if (mtp) {
    r.mtp_logits.assign(size_t(n * V), 0.0f);
    for (auto [b, len] : pieces) {
      len = std::min(len, n - 1 - b);
      if (len > 0) model.forward_mtp(state, hc.data() + b * W, tokens.data() + b + 1, len, r.mtp_logits.data() + b * V);
    }
  }
  return r;
}

struct ErrorStats {
  double median = 0, p99 = 0, max = 0, argmax_agreement = 0;
  int64_t worst_position = -1;
};

// Per-position max |a - b| over the vocabulary, summarised; positions where
// `skip` is true are left out (rounding flips that say nothing of the engine).
inline ErrorStats compare_rows(const float* a, const float* b, int64_t rows, int64_t V,
                               const std::vector<bool>& skip = {}) {
  std::vector<double> e;
  int64_t agree = 0, counted = 0;
  ErrorStats s;
  for (int64_t r = 0; r < rows; ++r) {
    if (!skip.empty() && skip[size_t(r)]) continue;
    double m = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(std::fabs(a[r * V + v] - b[r * V + v])));
    if (m > s.max) s.max = m, s.worst_position = r;
    e.push_back(m);
    const float* ra = a + r * V;
    const float* rb = b + r * V;
    agree += (std::max_element(ra, ra + V) - ra) == (std::max_element(rb, rb + V) - rb);
    ++counted;
  }
  std::sort(e.begin(), e.end());
  if (!e.empty()) {
    s.median = e[e.size() / 2];
    s.p99 = e[std::min(e.size() - 1, size_t(std::ceil(0.99 * double(e.size()))) - 1)];
  }
  s.argmax_agreement = counted ? double(agree) / double(counted) : 1.0;
  return s;
}

}  // namespace dsv4::test
