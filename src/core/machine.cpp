#include "core/machine.h"

#include <immintrin.h>
#include <omp.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <sstream>
#include <string>

#include "core/aligned.h"
#include "core/threads.h"

namespace dsv4 {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void name_this_thread(const char* name) {
  char shortened[16] = {};
  std::strncpy(shortened, name, sizeof shortened - 1);
  pthread_setname_np(pthread_self(), shortened);
}

namespace {

// utime + stime of a /proc stat file ("pid (comm) state ..." with utime and
// stime the 14th and 15th fields; comm may hold spaces, so fields count
// from its last ')'), in seconds; false if unreadable.
bool read_stat_cpu(const std::filesystem::path& stat, std::string& comm, double& seconds) {
  std::ifstream in(stat);
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open || close + 2 > line.size()) return false;
  comm = line.substr(open + 1, close - open - 1);
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) stime = std::strtod(field.c_str(), nullptr);
  }
  seconds = (utime + stime) / double(sysconf(_SC_CLK_TCK));
  return true;
}

}  // namespace

ThreadCpuSeconds thread_cpu_seconds(const char* prefix) {
  ThreadCpuSeconds out;
  std::string comm;
  // The process's own counters include threads that have ended (a
  // connection's handler); the named threads are read one by one.
  read_stat_cpu("/proc/self/stat", comm, out.total);
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    double seconds = 0;
    if (read_stat_cpu(task.path() / "stat", comm, seconds) && comm.rfind(prefix, 0) == 0) out.named += seconds;
  }
  return out;
}

namespace {

// Each reader sums its own contiguous share of the buffer through four
// independent vector accumulators, the widest loads the CPU has: narrower
// loads leave the cores short of the memory system's read rate (scalar
// 64-bit loads reach only ~70% of it on the development machine), and the
// roofline has to be what the hardware can actually deliver.
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, int64_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 256 <= bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  return uint64_t(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
}

// The same read as four streams, each thread's share cut in four and read
// 128 bytes from each in turn: a matrix kernel walks four or more rows at
// once, and on the development VM this pattern reads 10-15% faster than one
// stream (31 against 27 GB/s), so the roofline takes the better of the two.
__attribute__((target("avx512f"))) uint64_t read4_avx512(const uint8_t* p, int64_t bytes) {
  const int64_t part = bytes / 4;  // a multiple of 128
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= part; i += 128) {
    a0 = _mm512_add_epi64(a0, _mm512_add_epi64(_mm512_load_si512(p + i), _mm512_load_si512(p + i + 64)));
    a1 = _mm512_add_epi64(a1, _mm512_add_epi64(_mm512_load_si512(p + part + i), _mm512_load_si512(p + part + i + 64)));
    a2 = _mm512_add_epi64(
        a2, _mm512_add_epi64(_mm512_load_si512(p + 2 * part + i), _mm512_load_si512(p + 2 * part + i + 64)));
    a3 = _mm512_add_epi64(
        a3, _mm512_add_epi64(_mm512_load_si512(p + 3 * part + i), _mm512_load_si512(p + 3 * part + i + 64)));
  }
  return uint64_t(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
}

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, int64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i*)(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i*)(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i*)(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i*)(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256((__m256i*)lanes, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t read_scalar(const uint8_t* p, int64_t bytes) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a[8] = {};
  for (int64_t i = 0; i + 8 <= bytes / 8; i += 8)
    for (int l = 0; l < 8; ++l) a[l] += q[i + l];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

}  // namespace

double measure_read_bandwidth(int64_t bytes, int repeats) {
  bytes &= ~int64_t(4095);
  // In 2 MB pages, as the copied weights are: the reads stream the same way
  // from either (measured within noise on AMD Zen 5), but the first touch of
  // 1 GB in 4 KB pages took 1.6-1.8 s on a paravirtualized VM against
  // 0.05-0.2 s, and the speculative bench reads the limits around every run.
  std::size_t allocated = size_t(bytes);
  uint8_t* raw = nullptr;
  try {
    raw = static_cast<uint8_t*>(allocate_huge_pages(allocated));
  } catch (const std::bad_alloc&) {
    return 0;
  }
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(raw, &std::free);
  const CpuFeatures f = detect_cpu_features();
  auto read = f.avx512f ? read_avx512 : f.avx2 ? read_avx2 : read_scalar;
  const int threads = compute_threads();
#pragma omp parallel num_threads(threads)
  {
    // Touch the pages from the threads that will read them.
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t share = (bytes / nt) & ~int64_t(511);
    std::memset(raw + id * share, id + 1, size_t(share));
  }
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r)
    for (auto pass : {read, f.avx512f ? read4_avx512 : read}) {
      uint64_t total = 0;
      int64_t read_bytes = 0;
      const double t0 = now_seconds();
#pragma omp parallel reduction(+ : total, read_bytes) num_threads(threads)
      {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t share = (bytes / nt) & ~int64_t(511);  // whole 128-byte steps of four streams
        total += pass(raw + id * share, share);
        read_bytes += share;
      }
      const double dt = now_seconds() - t0;
      sink = sink + total;
      best = std::max(best, double(read_bytes) / dt);
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
  f.avx512_vnni = (ecx >> 11) & 1;
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
  add(avx512_vnni, "avx512_vnni");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "scalar" : s;
}

}  // namespace dsv4
