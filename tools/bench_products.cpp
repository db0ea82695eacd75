#include "bench_products.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench_costs.h"

namespace dsv4::tools {

double product_floor_seconds(const TimedBackend::ProductAccount& p, const MachineLimits& limits) {
  const double bytes = limits.bandwidth > 0 ? p.bytes / limits.bandwidth : 0.0;
  return std::max(bytes, decoding_floor_seconds(p.weights, p.macs, limits.one_token_rates, limits.fma_macs_per_s));
}

void print_products(const TimedBackend& timed, const char* phase, int64_t batch, int64_t tokens, double steps,
                    const char* per, std::ostream* csv, const MachineLimits* limits) {
  std::vector<std::pair<std::string, TimedBackend::ProductAccount>> kinds(timed.products().begin(),
                                                                          timed.products().end());
  std::sort(kinds.begin(), kinds.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::printf("  by product (%s, slowest first):", per);
  const char* separator = " ";
  for (const auto& [kind, p] : kinds) {
    std::printf("%s%s", separator, kind.c_str());
    if (kind.rfind("experts", 0) == 0 && p.passes > 0)
      std::printf(" (%.1f tokens per matrix)", double(p.tokens) / double(p.passes));
    std::printf(" %.2f ms, %.3f GB at %.1f GB/s", 1e3 * p.seconds / steps, p.bytes / steps / 1e9,
                p.seconds > 0 ? p.bytes / p.seconds / 1e9 : 0.0);
    if (limits && p.seconds > 0)
      std::printf(", %.0f%% of its floor", 100 * product_floor_seconds(p, *limits) / p.seconds);
    separator = "; ";
  }
  if (limits)
    std::printf(
        " (floor: the bytes at %.1f GB/s or each weight decoded at its one-token rate and the other "
        "multiply-adds at the FMA ceiling, whichever is longer)",
        limits->bandwidth / 1e9);
  std::printf("\n");
  if (!csv) return;
  for (const auto& [kind, p] : kinds) {
    std::string key = kind;
    for (char& ch : key) ch = ch == ' ' ? '_' : char(std::tolower(static_cast<unsigned char>(ch)));
    *csv << phase << "_product_" << key << "," << batch << "," << tokens << "," << p.seconds << ",,"
         << p.bytes / double(tokens) << "," << (p.seconds > 0 ? p.bytes / p.seconds / 1e9 : 0.0) << ",,,\n";
  }
}

}  // namespace dsv4::tools
