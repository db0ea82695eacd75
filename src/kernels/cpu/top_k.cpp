// The float top-k of many scores (see top_k_indices in vector_ops.h): a
// threshold from block maxima, else a radix histogram.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <vector>

#include "core/scratch.h"
#include "kernels/cpu/isa.h"
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

DSV4_TARGET_AVX512 inline __m512i order_keys_avx512(__m512 scores) {
  const __m512i bits = _mm512_castps_si512(_mm512_add_ps(scores, _mm512_setzero_ps()));
  return _mm512_xor_si512(bits, _mm512_or_si512(_mm512_srai_epi32(bits, 31), _mm512_set1_epi32(int(0x80000000u))));
}

// ---- the threshold from block maxima

// Blocks of scores per id kept: the k-th largest of the blocks' maxima is a
// key that at least k scores reach (one in each of k blocks), so the k-th
// largest score is at or above it and only the scores at or above it need
// sorting out. With eight blocks per id the threshold sits near the k-th
// score: about k candidates for scores in random order (V4's 512 of 262,144
// rows at 1M tokens: blocks of 64).
constexpr int64_t kBlocksPerId = 8;

// The keys' maximum of each of `blocks` blocks of `width` scores into
// `maxima`; true when a score of those blocks is NaN.
bool block_maxima_scalar(const float* scores, int64_t width, int64_t blocks, uint32_t* maxima) {
  bool nan = false;
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t m = 0;
    for (int64_t i = b * width; i < (b + 1) * width; ++i) {
      nan |= std::isnan(scores[i]);
      m = std::max(m, order_key(scores[i]));
    }
    maxima[b] = m;
  }
  return nan;
}

// The same for a width of a multiple of 16.
DSV4_TARGET_AVX512 bool block_maxima_avx512(const float* scores, int64_t width, int64_t blocks, uint32_t* maxima) {
  __mmask16 nan = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i m = _mm512_setzero_si512();
    for (int64_t i = b * width; i < (b + 1) * width; i += 16) {
      const __m512 v = _mm512_loadu_ps(scores + i);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_max_epu32(m, order_keys_avx512(v));
    }
    maxima[b] = _mm512_reduce_max_epu32(m);
  }
  return nan != 0;
}

// The scores [first, n) whose key is at least `threshold`, as keys and ids
// in id order; returns their count. No score is NaN (top_k_by_threshold
// looked while taking the blocks' maxima).
int64_t keys_at_least_scalar(const float* scores, int64_t first, int64_t n, uint32_t threshold, uint32_t* keys,
                             int32_t* ids) {
  int64_t count = 0;
  for (int64_t i = first; i < n; ++i) {
    const uint32_t key = order_key(scores[i]);
    if (key >= threshold) keys[count] = key, ids[count] = int32_t(i), ++count;
  }
  return count;
}

// The same, 16 scores at a time (a compare and, where one passes, two
// compressing stores), the last n mod 16 as above.
DSV4_TARGET_AVX512 int64_t keys_at_least_avx512(const float* scores, int64_t n, uint32_t threshold, uint32_t* keys,
                                                int32_t* ids) {
  const __m512i bound = _mm512_set1_epi32(int(threshold)), step = _mm512_set1_epi32(16);
  __m512i id = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t count = 0, i = 0;
  for (; i + 16 <= n; i += 16, id = _mm512_add_epi32(id, step)) {
    const __m512i key = order_keys_avx512(_mm512_loadu_ps(scores + i));
    const __mmask16 pass = _mm512_cmp_epu32_mask(key, bound, _MM_CMPINT_NLT);
    if (pass) {
      _mm512_mask_compressstoreu_epi32(keys + count, pass, key);
      _mm512_mask_compressstoreu_epi32(ids + count, pass, id);
      count += std::popcount(unsigned(pass));
    }
  }
  return count + keys_at_least_scalar(scores, i, n, threshold, keys + count, ids + count);
}

// The ids of the k largest keys among `count` candidates (in id order) that
// hold every key at or above the k-th largest of all scores: those above
// it and, of those equal to it, the first in id order.
void take_top_k(const uint32_t* keys, const int32_t* ids, int64_t count, int64_t k, std::vector<int32_t>& out) {
  std::vector<uint32_t> sorted(keys, keys + count);
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<uint32_t>());
  const uint32_t kth = sorted[size_t(k - 1)];
  int64_t ties = k;
  for (int64_t i = 0; i < count; ++i) ties -= keys[i] > kth;
  out.clear();
  out.reserve(size_t(k));
  for (int64_t i = 0; i < count; ++i)
    if (keys[i] > kth || (keys[i] == kth && ties-- > 0)) out.push_back(ids[i]);
}

// 0: no NaN, the ids in `out`; 1: a score is NaN; 2: the threshold leaves
// more than an eighth of the scores (their order makes the blocks' maxima
// low: the histogram does better).
int top_k_by_threshold(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out, KernelIsa isa) {
  const bool avx512 = isa == KernelIsa::Avx512;
  int64_t width = std::max<int64_t>(1, n / (k * kBlocksPerId));
  if (avx512 && width >= 16) width = width / 16 * 16;
  const int64_t blocks = n / width;
  ScratchArray<uint32_t> maxima(blocks);
  const bool nan = (avx512 && width % 16 == 0 ? block_maxima_avx512(scores, width, blocks, maxima.data())
                                              : block_maxima_scalar(scores, width, blocks, maxima.data())) ||
                   std::any_of(scores + blocks * width, scores + n, [](float v) { return std::isnan(v); });
  if (nan) return 1;
  std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<uint32_t>());
  const uint32_t threshold = maxima[size_t(k - 1)];
  ScratchArray<uint32_t> keys(n);
  ScratchArray<int32_t> ids(n);
  const int64_t count = avx512 ? keys_at_least_avx512(scores, n, threshold, keys.data(), ids.data())
                               : keys_at_least_scalar(scores, 0, n, threshold, keys.data(), ids.data());
  if (count > n / 8) return 2;
  take_top_k(keys.data(), ids.data(), count, k, out);
  return 0;
}

// ---- the radix histogram

constexpr int kTopBits = 11;  // the first pass's bins: 2048 of 4 bytes
constexpr int kBins = 1 << kTopBits, kShift = 32 - kTopBits;
// Copies of the histogram that take the scores in turn: scores that fall in
// one bin (they cluster) would otherwise make each increment wait for the
// previous one's store.
constexpr int kCopies = 4;

// No score is NaN.
void top_k_by_histogram(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out) {
  // Pass 1: how many keys share each top-bits prefix.
  ScratchArray<uint32_t> hist(int64_t(kBins) * kCopies, 0u);
  int64_t i = 0;
  for (; i + kCopies <= n; i += kCopies)
    for (int c = 0; c < kCopies; ++c) ++hist[c * kBins + (order_key(scores[i + c]) >> kShift)];
  for (; i < n; ++i) ++hist[order_key(scores[i]) >> kShift];
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
}

}  // namespace

bool top_k_float_many(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out, KernelIsa isa) {
  const int outcome = top_k_by_threshold(scores, n, k, out, isa);
  if (outcome == 1) return false;
  if (outcome == 2) top_k_by_histogram(scores, n, k, out);
  return true;
}

}  // namespace dsv4
