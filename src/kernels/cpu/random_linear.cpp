#include "kernels/cpu/random_linear.h"

#include <random>
#include <string>

#include "core/error.h"

namespace dsv4 {

RandomLinear::RandomLinear(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed, int scale_min,
                           int scale_spread) {
  if (rows <= 0 || cols <= 0 || scale_spread <= 0 || scale_min < 0 || scale_min + scale_spread > 255)
    throw Error("random weights: bad shape or scale range");
  std::mt19937 rng(seed);
  linear.format = format;
  linear.rows = rows;
  linear.cols = cols;
  // The top 16 bits of a float: sign, exponent 120..135, 7 random mantissa bits.
  auto high_half = [&] { return uint16_t((rng() & 0x8000u) | uint32_t(120 + rng() % 16) << 7 | (rng() & 0x7fu)); };
  auto draw_scales = [&](size_t count) {
    scale.resize(count);
    for (auto& s : scale) s = uint8_t(scale_min + int(rng() % uint32_t(scale_spread)));
  };
  switch (format) {
    case WeightFormat::F32:
      data.resize(size_t(rows * cols * 4));
      for (size_t i = 0; i < data.size(); i += 4) {
        const uint32_t bits = uint32_t(high_half()) << 16 | (rng() & 0xffffu);
        for (int b = 0; b < 4; ++b) data[i + size_t(b)] = uint8_t(bits >> (8 * b));
      }
      break;
    case WeightFormat::BF16:
      data.resize(size_t(rows * cols * 2));
      for (size_t i = 0; i < data.size(); i += 2) {
        const uint16_t bits = high_half();
        data[i] = uint8_t(bits), data[i + 1] = uint8_t(bits >> 8);
      }
      break;
    case WeightFormat::FP8_BLOCK128:
      data.resize(size_t(rows * cols));
      for (auto& b : data) {
        b = uint8_t(rng());
        if ((b & 0x7f) == 0x7f) b &= 0xfe;
      }
      linear.scale_cols = (cols + 127) / 128;
      draw_scales(size_t((rows + 127) / 128 * linear.scale_cols));
      break;
    case WeightFormat::FP4_BLOCK32:
      if (cols % 32 != 0)
        throw Error("random FP4 weights: " + std::to_string(cols) + " columns are not whole 32-wide scale blocks");
      data.resize(size_t(rows * cols / 2));
      for (auto& b : data) b = uint8_t(rng());
      linear.scale_cols = cols / 32;
      draw_scales(size_t(rows * linear.scale_cols));
      break;
  }
  linear.data = data.data();
  linear.scale = scale.empty() ? nullptr : scale.data();
}

}  // namespace dsv4
