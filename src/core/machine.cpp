#include "core/machine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace dsv4 {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double measure_read_bandwidth(int64_t bytes, int repeats) {
  const int64_t n = bytes / int64_t(sizeof(uint64_t));
  std::unique_ptr<uint64_t[]> buf(new uint64_t[size_t(n)]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = uint64_t(i);
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now_seconds();
    uint64_t total = 0;
#pragma omp parallel for schedule(static) reduction(^ : total)
    for (int64_t i = 0; i < n; i += 8) {
      // Eight independent lanes keep the loads in flight.
      uint64_t a = 0;
      for (int l = 0; l < 8 && i + l < n; ++l) a ^= buf[size_t(i + l)];
      total ^= a;
    }
    double dt = now_seconds() - t0;
    sink = sink ^ total;
    best = std::max(best, double(n * 8) / dt);
  }
  (void)sink;
  return best;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  unsigned eax, ebx, ecx, edx;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(1));
  f.avx512_bf16 = (eax >> 5) & 1;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  f.amx_bf16 = (edx >> 22) & 1;
  f.amx_tile = (edx >> 24) & 1;
#endif
  return f;
}

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512_bf16, "avx512_bf16");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "scalar" : s;
}

}  // namespace dsv4
