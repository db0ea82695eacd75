// Weight matrices in their checkpoint formats and the products with them.
//
// Every output element y[t][o] is produced by one call of the same dot-product
// routine with a fixed reduction order, and threads only split the (t, o)
// space. So a token's result does not depend on the batch it is in, on the
// chunk size or on the thread count: a product promise of this engine.
#pragma once
#include <cstdint>
#include <string>

namespace dsv4 {

enum class WeightFormat {
  F32,
  BF16,
  FP8_BLOCK128,  // e4m3 values, one ue8m0 scale per 128x128 block
  FP4_BLOCK32,   // e2m1 nibbles packed two per byte, one ue8m0 scale per 1x32
};

const char* weight_format_name(WeightFormat format);

struct Linear {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;  // ue8m0 bytes, layout depends on format
  int64_t scale_cols = 0;          // second dimension of the scale tensor
  // The reference rounds the input through FP8 (1x128 blocks) before every
  // FP8/FP4 weight product, except the bf16-dequantized wo_a.
  bool quantize_input = false;

  bool empty() const { return data == nullptr; }
  int64_t weight_bytes() const;  // bytes read for one full pass over the weight
};

// y[o] = sum_i W[o][i] * x[i] for one row o, fixed reduction order.
float linear_dot(const Linear& w, int64_t row, const float* x);
// Scalar reference: dequantize each weight and sum left to right in double.
double linear_dot_reference(const Linear& w, int64_t row, const float* x);

// Y[t][o] = W[o] . X[t] for rows [row_begin, row_end) of W, n tokens.
// X is [n, cols] (rounded through FP8 first when w.quantize_input), Y is
// [n, y_stride] and receives columns 0 .. row_end-row_begin-1.
void linear_forward(const Linear& w, const float* x, int64_t n, float* y,
                    int64_t row_begin = 0, int64_t row_end = -1, int64_t y_stride = -1);

// Decodes one weight row to floats (embedding lookups, tests).
void linear_decode_row(const Linear& w, int64_t row, float* out);

}  // namespace dsv4
