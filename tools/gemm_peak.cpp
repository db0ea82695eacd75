#include "gemm_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <functional>

#include "core/machine.h"

#ifdef DSV4_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace dsv4::tools {

std::vector<GemmPeak> measure_onednn_gemm_peaks() {
  std::vector<GemmPeak> peaks;
#ifdef DSV4_HAVE_ONEDNN
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const int64_t m = 2048, n = 2048, k = 2048;
  for (auto type : {memory::data_type::f32, memory::data_type::bf16}) {
    try {
      memory::desc a({m, k}, type, memory::format_tag::ab);
      memory::desc b({k, n}, type, memory::format_tag::any);  // weights pre-packed, as for a model
      memory::desc c({m, n}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
      memory ma(pd.src_desc(), eng), mb(pd.weights_desc(), eng), mc(pd.dst_desc(), eng);
      std::fill_n(static_cast<uint8_t*>(ma.get_data_handle()), pd.src_desc().get_size(), uint8_t(0x3c));
      std::fill_n(static_cast<uint8_t*>(mb.get_data_handle()), pd.weights_desc().get_size(), uint8_t(0x3c));
      dnnl::matmul mm(pd);
      double best = 0;
      for (int r = 0; r < 6; ++r) {  // the first run warms up
        const double t0 = now_seconds();
        mm.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
        stream.wait();
        if (r > 0) best = std::max(best, 2.0 * double(m * n * k) / (now_seconds() - t0));
      }
      peaks.push_back({std::string("oneDNN ") + (type == memory::data_type::f32 ? "f32" : "bf16") + " matmul 2048^3 (" +
                           pd.impl_info_str() + ")",
                       best});
    } catch (const dnnl::error&) {
      // This CPU has no kernel for the type: nothing to report for it.
    }
  }
#endif
  return peaks;
}

namespace {

template <int kChains>
__attribute__((target("avx512f"))) double fma_chains_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-9f);
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
  double s = 0;
  for (int c = 0; c < kChains; ++c) s += _mm512_reduce_add_ps(acc[c]);
  return s;
}

template <int kChains>
__attribute__((target("avx2,fma"))) double fma_chains_avx2(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(float(c));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-9f);
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
  alignas(32) float lanes[8];
  double s = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm256_store_ps(lanes, acc[c]);
    for (float v : lanes) s += v;
  }
  return s;
}

// Independent VPDPBUSD chains: 64 byte products added into 16 int32 lanes
// per instruction. The inputs come through volatile loads so that the
// compiler cannot fold the chain.
template <int kChains>
__attribute__((target("avx512f,avx512vnni"))) int64_t dot_chains_vnni(int64_t iters) {
  volatile int8_t one = 1;
  const __m512i a = _mm512_set1_epi8(one), b = _mm512_set1_epi8(one);
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  int64_t s = 0;
  for (int c = 0; c < kChains; ++c) s += _mm512_reduce_add_epi32(acc[c]);
  return s;
}

// The best of three runs of `chains` on every thread at once, in operations
// per second, each thread doing `ops_per_thread`; what `chains` returns is
// kept so that the compiler cannot drop the work.
double best_rate_on_all_threads(const std::function<double()>& chains, double ops_per_thread) {
  double best = 0;
  volatile double sink = 0;
  for (int r = 0; r < 3; ++r) {
    int threads = 1;
    const double t0 = now_seconds();
#pragma omp parallel
    {
      const double s = chains();
#pragma omp critical
      sink = sink + s;
#pragma omp single
      threads = omp_get_num_threads();
    }
    best = std::max(best, ops_per_thread * threads / (now_seconds() - t0));
  }
  return best;
}

}  // namespace

GemmPeak measure_int8_dot_peak() {
  const CpuFeatures f = detect_cpu_features();
  if (!f.avx512_vnni) return {"int8 dot products (no AVX512-VNNI)", 0};
  const int64_t iters = 10'000'000;
  constexpr int kChains = 12;
  // Two operations per byte product, 64 byte products per instruction.
  const double rate = best_rate_on_all_threads([&] { return double(dot_chains_vnni<kChains>(iters)); },
                                               2.0 * double(iters) * kChains * 64);
  return {"int8 dot products (VPDPBUSD chains, the ceiling of the indexer's integer scores)", rate};
}

GemmPeak measure_fp32_fma_peak() {
  const CpuFeatures f = detect_cpu_features();
  if (!f.avx2 || !f.fma) return {"fp32 FMA (no AVX2/FMA)", 0};
  const int lanes = f.avx512f ? 16 : 8;
  const int64_t iters = 20'000'000;
  constexpr int kChains = 12;  // covers 4-cycle latency on two FMA ports
  const double rate = best_rate_on_all_threads(
      [&] { return f.avx512f ? fma_chains_avx512<kChains>(iters) : fma_chains_avx2<kChains>(iters); },
      2.0 * double(iters) * kChains * lanes);
  return {std::string("fp32 FMA chains (") + (f.avx512f ? "AVX-512" : "AVX2") + ", the ceiling of dsv4's kernels)",
          rate};
}

}  // namespace dsv4::tools
