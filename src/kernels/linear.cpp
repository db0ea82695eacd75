#include "kernels/linear.h"

namespace dsv4 {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::FP8_BLOCK128: return "FP8 (e4m3, 128x128 ue8m0 blocks)";
    case WeightFormat::FP4_BLOCK32: return "FP4 (e2m1, 1x32 ue8m0 blocks)";
  }
  return "?";
}

int64_t Linear::weight_bytes() const {
  switch (format) {
    case WeightFormat::F32: return rows * cols * 4;
    case WeightFormat::BF16: return rows * cols * 2;
    case WeightFormat::FP8_BLOCK128: return rows * cols + ((rows + 127) / 128) * scale_cols;
    case WeightFormat::FP4_BLOCK32: return rows * cols / 2 + rows * scale_cols;
  }
  return 0;
}

}  // namespace dsv4
