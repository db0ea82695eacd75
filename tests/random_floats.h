// Random inputs shared by the kernel tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace dsv4::test {

// n standard-normal floats from std::mt19937(seed).
inline std::vector<float> normal_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

}  // namespace dsv4::test
