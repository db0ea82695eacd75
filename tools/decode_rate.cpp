#include "decode_rate.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/machine.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/random_linear.h"

namespace dsv4::tools {

namespace {

// A 4 MB matrix of `format`, 4096 columns wide (random codes, scales near
// those of real checkpoints), rounding its input through FP8 as the model's
// FP8 and FP4 products do. Past a core's L2, in L3: with 1 MB matrices (128
// to 512 rows) the rates read 18-25% lower than with 4 MB ones (a small
// product's fixed costs, its input prepared and its streams started, weigh
// more), and the one-token products of a decode step, 2-33 MB from DRAM,
// ran faster than that "floor" (docs/kernels.md, "The one-token rates'
// matrices").
RandomLinear resident_matrix(WeightFormat format, uint32_t seed) {
  const int64_t cols = 4096;
  const int64_t row_bytes = format == WeightFormat::F32            ? 4 * cols
                            : format == WeightFormat::BF16         ? 2 * cols
                            : format == WeightFormat::FP8_BLOCK128 ? cols
                                                                   : cols / 2;
  RandomLinear m(format, (int64_t(4) << 20) / row_bytes, cols, seed);
  m.linear.quantize_input = format == WeightFormat::FP8_BLOCK128 || format == WeightFormat::FP4_BLOCK32;
  return m;
}

}  // namespace

std::array<double, 4> measure_one_token_weight_rates() {
  std::array<double, 4> rates{};
  for (WeightFormat format :
       {WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8_BLOCK128, WeightFormat::FP4_BLOCK32}) {
    double best = 0, weights = 0, seconds = 0;
    // Each thread runs its own matrix (single-threaded products: no team
    // start-up per product), so that every core works from its own cache.
#pragma omp parallel
    {
      const RandomLinear m = resident_matrix(format, 11u + uint32_t(omp_get_thread_num()));
      std::vector<float> x(size_t(m.linear.cols)), y(size_t(m.linear.rows));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.25f;
      linear_forward(m.linear, x.data(), 1, y.data());  // into the cache
      for (int round = 0; round < 3; ++round) {
#pragma omp single
        weights = 0, seconds = 0;
        // (the single's barrier starts the threads together)
        const double t0 = now_seconds();
        const int calls = 16;
        for (int c = 0; c < calls; ++c) linear_forward(m.linear, x.data(), 1, y.data());
        const double dt = now_seconds() - t0;
#pragma omp critical
        {
          weights += double(calls) * double(m.linear.rows * m.linear.cols);
          seconds = std::max(seconds, dt);
        }
#pragma omp barrier
#pragma omp single
        best = std::max(best, weights / seconds);
      }
    }
    rates[size_t(format)] = best;
  }
  return rates;
}

}  // namespace dsv4::tools
