// V4.1's Engram on the CPU: the lookup of hashed rows in an FP8 table and
// the gated add of the projected value into every residual copy
// (docs/v41.md). The row decode is exact (e4m3 times a power of two fits
// bf16 and fp32); the gate follows one fixed order per token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/cpu/exact_sums.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4::cpu {

void engram_lookup(const EngramTable& table, const int64_t* ids, int64_t n, float* out) {
  const int64_t dim = table.dim, blocks = dim / 32;
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = table.data + ids[t] * dim;
    const uint8_t* scale = table.scale + ids[t] * blocks;
    float* o = out + t * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = e4m3_to_float(row[i]) * e8m0_to_float(scale[i / 32]);
  }
}

void engram_gate(KernelIsa isa, const EngramGate& g, bool exact) {
  const int64_t D = g.dim, H = g.copies;
  const float inv_sqrt_dim = 1.0f / std::sqrt(float(D));
#pragma omp parallel for schedule(static) num_threads(threads_for(g.n* H * D * 4))
  for (int64_t t = 0; t < g.n; ++t) {
    std::vector<float> weighted(static_cast<size_t>(D));
    const float* key_row = g.key + t * g.key_stride;
    const float* value = g.value + t * g.key_stride;
    float gates[16];
    for (int64_t c = 0; c < H; ++c) {
      const float* x = g.x_hc + (t * H + c) * D;
      const float* key = key_row + c * D;
      const float* w = g.weight + c * D;
      for (int64_t d = 0; d < D; ++d) weighted[size_t(d)] = x[d] * w[d];
      float scaled;
      if (exact) {
        const double rstd = 1.0 / std::sqrt(sum_of_squares_exact(x, D, isa) / double(D) + g.eps) /
                            std::sqrt(sum_of_squares_exact(key, D, isa) / double(D) + g.eps);
        scaled = float(dot_exact(weighted.data(), key, D, isa) * rstd / std::sqrt(double(D)));
      } else {
        const float dot = dot_fixed(weighted.data(), key, D, isa);
        const float rstd = (1.0f / std::sqrt(sum_of_squares(x, D, isa) / float(D) + g.eps)) *
                           (1.0f / std::sqrt(sum_of_squares(key, D, isa) / float(D) + g.eps));
        scaled = dot * rstd * inv_sqrt_dim;
      }
      const float root = std::sqrt(std::max(std::fabs(scaled), g.clamp));
      gates[c] = 1.0f / (1.0f + std::exp(-(scaled >= 0.0f ? root : -root)));
    }
    // Every copy's gate reads the copy before the add.
    for (int64_t c = 0; c < H; ++c) {
      float* x = g.x_hc + (t * H + c) * D;
      for (int64_t d = 0; d < D; ++d) x[d] += gates[c] * value[d];
    }
  }
}

}  // namespace dsv4::cpu
