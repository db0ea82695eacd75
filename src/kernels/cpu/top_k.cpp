// The float top-k by a radix histogram (see top_k_indices in vector_ops.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <vector>

#include "core/scratch.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4 {

namespace {

// A key per score whose unsigned order is the scores' order: larger score,
// larger key (negative scores' bits inverted, positive ones' sign bit set).
// -0 and +0 compare equal as floats, so they need one key: adding +0 turns
// -0 into +0 and leaves every other score as it is. No branches: the
// indexer's scores take both signs at random.
inline uint32_t order_key(float score) {
  const uint32_t bits = std::bit_cast<uint32_t>(score + 0.0f);
  const uint32_t negative = uint32_t(int32_t(bits) >> 31);
  return bits ^ (negative | 0x80000000u);
}

constexpr int kTopBits = 11;  // the first pass's bins: 2048 of 4 bytes
constexpr int kBins = 1 << kTopBits, kShift = 32 - kTopBits;
// Copies of the histogram that take the scores in turn: scores that fall in
// one bin (they cluster) would otherwise make each increment wait for the
// previous one's store.
constexpr int kCopies = 4;

}  // namespace

bool top_k_float_by_histogram(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out) {
  // Pass 1: how many keys share each top-bits prefix (and whether any
  // score is NaN, which the caller's comparison-based path handles).
  ScratchArray<uint32_t> hist(int64_t(kBins) * kCopies, 0u);
  bool nan = false;
  int64_t i = 0;
  for (; i + kCopies <= n; i += kCopies)
    for (int c = 0; c < kCopies; ++c) {
      nan |= std::isnan(scores[i + c]);
      ++hist[c * kBins + (order_key(scores[i + c]) >> kShift)];
    }
  for (; i < n; ++i) {
    nan |= std::isnan(scores[i]);
    ++hist[order_key(scores[i]) >> kShift];
  }
  if (nan) return false;
  // The bin that holds the k-th largest key, and how many keys lie above it.
  int64_t above = 0;
  int bin = kBins - 1;
  for (;; --bin) {
    int64_t count = 0;
    for (int c = 0; c < kCopies; ++c) count += hist[c * kBins + bin];
    if (above + count >= k) break;
    above += count;
  }
  // Pass 2: that bin's keys; the (k - above)-th largest of them is the k-th.
  std::vector<uint32_t> in_bin;
  for (i = 0; i < n; ++i) {
    const uint32_t key = order_key(scores[i]);
    if (int(key >> kShift) == bin) in_bin.push_back(key);
  }
  const int64_t rank = k - above;  // 1 .. in_bin.size()
  std::nth_element(in_bin.begin(), in_bin.begin() + (rank - 1), in_bin.end(), std::greater<uint32_t>());
  const uint32_t kth = in_bin[size_t(rank - 1)];
  int64_t greater = above;
  for (uint32_t key : in_bin) greater += key > kth;
  // Pass 3: in index order, every key above the k-th and, of those equal to
  // it, the first k - greater.
  int64_t ties = k - greater;
  out.clear();
  out.reserve(size_t(k));
  for (i = 0; i < n; ++i) {
    const uint32_t key = order_key(scores[i]);
    if (key > kth || (key == kth && ties-- > 0)) out.push_back(int32_t(i));
  }
  return true;
}

}  // namespace dsv4
