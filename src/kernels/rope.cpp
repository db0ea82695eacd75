#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dsv4 {

RopeTable::RopeTable(const RopeParams& c) {
  const int64_t dim = c.dim;
  const float base = float(c.base);
  freqs_.resize(size_t(dim / 2));
  // fp32 throughout, like the reference's precompute_freqs_cis.
  for (int64_t j = 0; j < dim / 2; ++j) freqs_[size_t(j)] = 1.0f / std::pow(base, float(2 * j) / float(dim));
  if (c.original_seq_len > 0) {
    auto correction_dim = [&](double rotations) {
      return double(dim) * std::log(double(c.original_seq_len) / (rotations * 2 * M_PI)) / (2 * std::log(double(base)));
    };
    double low = std::max(std::floor(correction_dim(c.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(c.beta_slow)), double(dim - 1));
    if (low == high) high += 0.001;
    const float factor = float(c.factor);
    for (int64_t j = 0; j < dim / 2; ++j) {
      float ramp = (float(j) - float(low)) / (float(high) - float(low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      float f = freqs_[size_t(j)];
      freqs_[size_t(j)] = f / factor * (1.0f - smooth) + f * smooth;
    }
  }
}

void RopeTable::angles(int64_t pos, bool inverse, float* cos, float* sin) const {
  for (size_t j = 0; j < freqs_.size(); ++j) {
    const float angle = float(pos) * freqs_[j];
    cos[j] = std::cos(angle);
    sin[j] = inverse ? -std::sin(angle) : std::sin(angle);
  }
}

void RopeTable::apply(float* x, int64_t pos, bool inverse) const {
  std::vector<float> cos(freqs_.size()), sin(freqs_.size());
  angles(pos, inverse, cos.data(), sin.data());
  for (size_t j = 0; j < freqs_.size(); ++j) {
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * cos[j] - b * sin[j];
    x[2 * j + 1] = a * sin[j] + b * cos[j];
  }
}

}  // namespace dsv4
