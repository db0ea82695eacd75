#include "decode_rate.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/aligned.h"
#include "core/machine.h"
#include "kernels/cpu/linear.h"

namespace dsv4::tools {

namespace {

// A 1 MB matrix of `format`, 4096 columns wide, with random codes (no e4m3
// NaN codes) and scales near those of real checkpoints.
struct ResidentMatrix {
  AlignedVector<uint8_t> data, scale;
  Linear linear;
  ResidentMatrix(WeightFormat format, uint32_t seed) {
    const int64_t cols = 4096;
    const int64_t row_bytes = format == WeightFormat::F32    ? 4 * cols
                              : format == WeightFormat::BF16 ? 2 * cols
                              : format == WeightFormat::FP8_BLOCK128 ? cols
                                                                     : cols / 2;
    const int64_t rows = (int64_t(1) << 20) / row_bytes;
    linear.format = format;
    linear.rows = rows;
    linear.cols = cols;
    data.resize(size_t(rows * row_bytes));
    std::mt19937 rng(seed);
    for (auto& b : data) b = uint8_t(rng());
    if (format == WeightFormat::F32 || format == WeightFormat::BF16) {
      // Small finite values: the exponent byte of each word or dword pinned.
      const int64_t width = format == WeightFormat::F32 ? 4 : 2;
      for (size_t i = size_t(width - 1); i < data.size(); i += size_t(width)) data[i] = uint8_t(0x3c | (data[i] & 0x80));
    }
    if (format == WeightFormat::FP8_BLOCK128) {
      for (auto& b : data)
        if ((b & 0x7f) == 0x7f) b = 0x7e & b;
      linear.scale_cols = cols / 128;
      scale.assign(size_t((rows + 127) / 128 * linear.scale_cols), uint8_t(119));
      linear.quantize_input = true;
    }
    if (format == WeightFormat::FP4_BLOCK32) {
      linear.scale_cols = cols / 32;
      scale.assign(size_t(rows * linear.scale_cols), uint8_t(121));
      linear.quantize_input = true;
    }
    linear.data = data.data();
    linear.scale = scale.empty() ? nullptr : scale.data();
  }
};

}  // namespace

std::array<double, 4> measure_one_token_weight_rates() {
  std::array<double, 4> rates{};
  for (WeightFormat format :
       {WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8_BLOCK128, WeightFormat::FP4_BLOCK32}) {
    double best = 0;
    for (int round = 0; round < 3; ++round) {
      double weights = 0, seconds = 0;
      // Each thread runs its own matrix (single-threaded products: no team
      // start-up per product), so that every core works from its own L2.
#pragma omp parallel
      {
        const ResidentMatrix m(format, 11u + uint32_t(omp_get_thread_num()));
        std::vector<float> x(size_t(m.linear.cols)), y(size_t(m.linear.rows));
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.25f;
        linear_forward(m.linear, x.data(), 1, y.data());  // into L2
#pragma omp barrier
        const double t0 = now_seconds();
        const int calls = 64;
        for (int c = 0; c < calls; ++c) linear_forward(m.linear, x.data(), 1, y.data());
        const double dt = now_seconds() - t0;
#pragma omp critical
        {
          weights += double(calls) * double(m.linear.rows * m.linear.cols);
          seconds = std::max(seconds, dt);
        }
      }
      best = std::max(best, weights / seconds);
    }
    rates[size_t(format)] = best;
  }
  return rates;
}

}  // namespace dsv4::tools
