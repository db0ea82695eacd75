#include "machine_limits.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "core/machine.h"
#include "decode_rate.h"
#include "gemm_peak.h"
#include "kernels/linear.h"

namespace dsv4::tools {

void MachineLimits::keep_best(const MachineLimits& read) {
  bandwidth = std::max(bandwidth, read.bandwidth);
  for (size_t f = 0; f < one_token_rates.size(); ++f)
    one_token_rates[f] = std::max(one_token_rates[f], read.one_token_rates[f]);
  if (read.fma_macs_per_s > fma_macs_per_s) {
    fma_macs_per_s = read.fma_macs_per_s;
    fma_name = read.fma_name;
  }
}

std::string MachineLimits::text() const {
  char text[160];
  std::snprintf(text, sizeof text, "%.1f, %.0f, %.1f/%.1f/%.1f", bandwidth / 1e9, fma_flops() / 1e9,
                one_token_rates[size_t(WeightFormat::BF16)] / 1e9,
                one_token_rates[size_t(WeightFormat::FP8_BLOCK128)] / 1e9,
                one_token_rates[size_t(WeightFormat::FP4_BLOCK32)] / 1e9);
  return text;
}

MachineLimits read_machine_limits(int bandwidth_repeats) {
  MachineLimits m;
  m.bandwidth = measure_read_bandwidth(int64_t(1) << 30, bandwidth_repeats);
  const GemmPeak fma = measure_fp32_fma_peak();
  m.fma_macs_per_s = fma.flops / 2;
  m.fma_name = fma.name;
  m.one_token_rates = measure_one_token_weight_rates();
  return m;
}

MachineLimits read_limits_around(MachineLimits& best, const std::function<MachineLimits()>& read,
                                 const std::function<void()>& run) {
  MachineLimits around = read();
  run();
  const MachineLimits after = read();
  around.keep_best(after);
  best.keep_best(around);
  return around;
}

}  // namespace dsv4::tools
