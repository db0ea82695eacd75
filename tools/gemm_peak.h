// The machine's compute roofline for `dsv4 bench`: the best matrix-product
// throughput it reaches, measured in the same run with oneDNN (the reference
// GEMM library for x86 CPUs), beside the double-precision FMA ceiling of
// dsv4's exact kernels.
#pragma once
#include <string>
#include <vector>

namespace dsv4::tools {

struct GemmPeak {
  std::string name;   // e.g. "oneDNN f32 matmul 2048^3 (brg:avx512_core)"
  double flops = 0;   // best measured FLOP/s
};

// oneDNN f32 and bf16 matmuls (empty when dsv4 was built without oneDNN).
std::vector<GemmPeak> measure_onednn_gemm_peaks();
// Independent double FMA chains on every thread: what a kernel that sums in
// double can do at most.
GemmPeak measure_fp64_fma_peak();

}  // namespace dsv4::tools
