// The machine limits that `dsv4 bench` sets its decode rates against: read
// bandwidth, how fast the cores turn each weight format into fp32 lanes
// (decode_rate.h) and the fp32 FMA ceiling. Both the plain decode runs
// (bench_command.cpp) and the speculative rounds (bench_speculative.cpp)
// read them several times in one run and keep the best of each: on a shared
// machine a short read can land in a slow moment, and a limit read low would
// flatter every percentage set against it.
#pragma once
#include <array>
#include <string>

namespace dsv4::tools {

struct MachineLimits {
  double bandwidth = 0;                     // bytes/s read
  std::array<double, 4> one_token_rates{};  // weights/s decoded per format (decode_rate.h)
  double fma_macs_per_s = 0;                // fp32 FMA ceiling, multiply-adds/s
  std::string fma_name;                     // what measured the FMA ceiling

  // Each limit becomes the higher of this one's and `read`'s.
  void keep_best(const MachineLimits& read);
  double fma_flops() const { return 2 * fma_macs_per_s; }
  // "GB/s, FMA GFLOP/s, BF16/FP8/FP4 G weights/s", for one-line reports.
  std::string text() const;
};

// One read of the three limits, on the calling thread's OpenMP team as it is
// placed now: the bandwidth over 1 GiB, best of `bandwidth_repeats` passes,
// then the fp32 FMA chains, then the one-token rates.
MachineLimits read_machine_limits(int bandwidth_repeats);

}  // namespace dsv4::tools
