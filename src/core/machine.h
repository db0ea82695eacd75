// Facts about the machine that benchmarks print beside their numbers: the
// measured memory read bandwidth (the decode roofline) and CPU features.
#pragma once
#include <cstdint>
#include <string>

namespace dsv4 {

// Streams a buffer much larger than the caches with all threads, as one
// stream and as four streams per thread, and returns the best of `repeats`
// runs of each, in bytes per second.
double measure_read_bandwidth(int64_t bytes = int64_t(1) << 30, int repeats = 5);

struct CpuFeatures {
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512_bf16 = false, avx512_vnni = false,
       amx_tile = false, amx_bf16 = false;
  std::string describe() const;
};
CpuFeatures detect_cpu_features();

double now_seconds();

// CPU seconds (user + system) of this process: all of it (/proc/self/stat,
// ended threads included), and of the live threads whose name starts with
// `prefix` (/proc/self/task; threads inherit their creator's name, so a
// thread named before it starts OpenMP work brings its compute threads
// along). Zeros where /proc is absent.
struct ThreadCpuSeconds {
  double total = 0, named = 0;
};
ThreadCpuSeconds thread_cpu_seconds(const char* prefix);
// Names the calling thread (at most 15 characters are kept).
void name_this_thread(const char* name);

}  // namespace dsv4
