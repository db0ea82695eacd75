// The first read of memory made read-only (docs/loading.md, "The first read
// after write protection"): the loader copies each checkpoint file into
// huge-page memory and then mprotects it. Each iteration maps a fresh
// region advised to huge pages, fills it, optionally makes it read-only and
// optionally reads one byte of each 2 MB page (touch_huge_pages, what the
// loader does), and then times one pass of reads over the whole region (its
// first), in 4 MB blocks in a shuffled order, like experts picked by a
// router. The second pass's rate is the `second_GBps` counter.
//
//   BM_FirstRead/<mprotect>/<touch>
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/aligned.h"

namespace {

constexpr std::size_t kRegion = std::size_t(512) << 20, kBlock = std::size_t(4) << 20;

// One pass over the blocks in `order`; the seconds it took.
double read_pass(const uint8_t* p, const std::vector<std::size_t>& order, uint64_t& sink) {
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t b : order) {
    const auto* words = reinterpret_cast<const uint64_t*>(p + b * kBlock);
    uint64_t sum = 0;
    for (std::size_t i = 0; i < kBlock / 8; ++i) sum ^= words[i];
    sink += sum;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_FirstRead(benchmark::State& state) {
  const bool protect = state.range(0) != 0, touch = state.range(1) != 0;
  std::vector<std::size_t> order(kRegion / kBlock);
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  uint64_t sink = 0;
  double second = 0;
  for (auto _ : state) {
    void* mapped = mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      return;
    }
    auto* p = static_cast<uint8_t*>(mapped);
    madvise(p, kRegion, MADV_HUGEPAGE);
    std::memset(p, 1, kRegion);
    if (protect) mprotect(p, kRegion, PROT_READ);
    if (touch) dsv4::touch_huge_pages(p, kRegion);
    state.SetIterationTime(read_pass(p, order, sink));
    second += read_pass(p, order, sink);
    munmap(p, kRegion);
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kRegion));
  state.counters["second_GBps"] = double(state.iterations()) * double(kRegion) / second / 1e9;
  state.SetLabel(std::string(protect ? "mprotect" : "no mprotect") + (touch ? ", pages touched" : ""));
}
BENCHMARK(BM_FirstRead)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(8);

}  // namespace

BENCHMARK_MAIN();
