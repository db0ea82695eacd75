// The machine's compute roofline for `dsv4 bench`: the best matrix-product
// throughput it reaches, measured in the same run with oneDNN (the reference
// GEMM library for x86 CPUs), beside the fp32 FMA ceiling of the cores (dsv4's
// kernels multiply-add in fp32 lanes).
#pragma once
#include <string>
#include <vector>

namespace dsv4::tools {

struct GemmPeak {
  std::string name;  // e.g. "oneDNN f32 matmul 2048^3 (brg:avx512_core)"
  double flops = 0;  // best measured FLOP/s
};

// oneDNN f32 and bf16 matmuls (empty when dsv4 was built without oneDNN).
std::vector<GemmPeak> measure_onednn_gemm_peaks();
// Independent fp32 FMA chains on every thread: what any fp32 kernel can do
// at most.
GemmPeak measure_fp32_fma_peak();
// Independent AVX512-VNNI int8 dot-product chains on every thread, counted
// as 2 operations per byte product (flops = 0 without AVX512-VNNI): what the
// indexer's integer scores can do at most.
GemmPeak measure_int8_dot_peak();

}  // namespace dsv4::tools
