// Weight matrices with random codes in the checkpoint formats, owning their
// bytes: the kernel tests, the kernel microbenchmarks and the decoding rates
// that `dsv4 bench` measures all multiply with the same kind of matrix.
#pragma once
#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/linear.h"

namespace dsv4 {

struct RandomLinear {
  // Codes drawn uniformly (the e4m3 NaN codes excluded: a checkpoint never
  // holds a NaN weight); F32 and BF16 values of either sign between 2^-7
  // and 2^8; ue8m0 block scales 2^(s - 127) with s drawn from
  // [scale_min, scale_min + scale_spread). Real checkpoints' scales lie
  // there too, far from the extremes that take other decoding paths.
  RandomLinear(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed, int scale_min = 120,
               int scale_spread = 10);
  RandomLinear(RandomLinear&&) = default;  // the bytes move with `linear`'s pointers
  RandomLinear& operator=(RandomLinear&&) = default;
  RandomLinear(const RandomLinear&) = delete;

  // In huge pages, as the loader keeps weights: products that stream many
  // rows would otherwise also measure TLB misses the engine does not have.
  std::vector<uint8_t, HugePageAllocator<uint8_t>> data;
  std::vector<uint8_t> scale;
  Linear linear;
};

}  // namespace dsv4
