// The machine limits that `dsv4 bench` sets its decode rates against: read
// bandwidth, how fast the cores turn each weight format into fp32 lanes
// (decode_rate.h) and the fp32 FMA ceiling. Both the plain decode runs
// (bench_command.cpp) and the speculative rounds (bench_speculative.cpp)
// read them several times in one run and keep the best of each: on a shared
// machine a short read can land in a slow moment, and a limit read low would
// flatter every percentage set against it.
#pragma once
#include <array>
#include <functional>
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

// `run` bracketed by two reads of the limits (`read` just before it and just
// after): returns the better of each limit over the two reads, the limits of
// the run's own moment, and raises `best`, the run-wide best, by both. On a
// shared machine the bandwidth and the cores' speed move by a third within
// minutes, together, so a run is set against the limits read around it.
// The callers differ in how they read (the speculative bench places its
// OpenMP team again first).
MachineLimits read_limits_around(MachineLimits& best, const std::function<MachineLimits()>& read,
                                 const std::function<void()>& run);

}  // namespace dsv4::tools
