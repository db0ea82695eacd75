// The exact numerics' weight products (kernels/cpu/linear.h,
// linear_forward_exact): rows decoded once into floats, inputs rounded as
// the reference rounds them and converted to double once per token, each
// output one dot_exact. Threads split the rows only.
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/cpu/exact_sums.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_internal.h"

namespace dsv4 {

using namespace linear_detail;

void linear_forward_exact(KernelIsa isa, const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin,
                          int64_t row_end, int64_t y_stride, int64_t x_stride) {
  if (row_end < 0) row_end = w.rows;
  const int64_t out = row_end - row_begin, cols = w.cols;
  if (y_stride < 0) y_stride = out;
  if (x_stride < 0) x_stride = cols;
  if (cols % 16) throw Error("linear input width " + std::to_string(cols) + " is not a multiple of 16");
  std::vector<double> xd(static_cast<size_t>(n * cols));
  {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t t = 0; t < n; ++t) {
      to_storage_order(w, x + t * x_stride, row.data());
      if (w.quantize_input) fp8_round_trip(row.data(), cols, w.input_block);
      for (int64_t i = 0; i < cols; ++i) xd[size_t(t * cols + i)] = row[size_t(i)];
    }
  }
#pragma omp parallel num_threads(threads_for(out* cols * std::max<int64_t>(n, 1) * 4))
  {
    std::vector<float> weights(static_cast<size_t>(cols));
    std::vector<double> sums(static_cast<size_t>(n));
#pragma omp for schedule(dynamic, 8)
    for (int64_t o = 0; o < out; ++o) {
      switch (isa) {
        case KernelIsa::Avx512: decode_row_avx512(w, row_begin + o, weights.data()); break;
        case KernelIsa::Avx2: decode_row_avx2(w, row_begin + o, weights.data()); break;
        default:
          for (int64_t i = 0; i < cols; i += 16) decode16_storage(w, row_begin + o, i, weights.data() + i);
      }
      dot_exact_tokens(weights.data(), xd.data(), cols, n, sums.data(), isa);
      for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = float(sums[size_t(t)]);
    }
  }
}

}  // namespace dsv4
