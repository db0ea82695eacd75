// Attention cores on the CPU: sink attention over gathered keys, the
// lightning indexer's scoring and top-k, and the compressor's gated pooling.
// Work is split over (row, block of heads) or rows only; each output element
// has one fixed order of operations, so the split never changes a bit.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "core/scratch.h"
#include "core/threads.h"
#include "kernels/cpu/exact_sums.h"
#include "kernels/cpu/fp8_rows.h"
#include "kernels/cpu/indexer_fp4.h"
#include "kernels/cpu/linear_internal.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4::cpu {

namespace {

// acc[i] += w * key[i] in double, a product and a sum rounded each (no
// fusion), element by element: every path gives the scalar loop's bits.
DSV4_TARGET_AVX512 void add_weighted_key_avx512(double* acc, double w, const float* key, int64_t n) {
  const __m512d wv = _mm512_set1_pd(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm512_storeu_pd(acc + i, _mm512_add_pd(_mm512_loadu_pd(acc + i),
                                            _mm512_mul_pd(wv, _mm512_cvtps_pd(_mm256_loadu_ps(key + i)))));
  for (; i < n; ++i) acc[i] += w * double(key[i]);
}
DSV4_TARGET_AVX2 void add_weighted_key_avx2(double* acc, double w, const float* key, int64_t n) {
  const __m256d wv = _mm256_set1_pd(w);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_pd(acc + i, _mm256_add_pd(_mm256_loadu_pd(acc + i),
                                            _mm256_mul_pd(wv, _mm256_cvtps_pd(_mm_loadu_ps(key + i)))));
  for (; i < n; ++i) acc[i] += w * double(key[i]);
}
void add_weighted_key(KernelIsa isa, double* acc, double w, const float* key, int64_t n) {
  if (isa == KernelIsa::Avx512) return add_weighted_key_avx512(acc, w, key, n);
  if (isa == KernelIsa::Avx2) return add_weighted_key_avx2(acc, w, key, n);
  for (int64_t i = 0; i < n; ++i) acc[i] += w * double(key[i]);
}

// The exact numerics' attention of one row and head: scores as exact dots,
// the softmax and the weighted sum of the keys in double, one rounding per
// output value.
void sink_attention_exact(KernelIsa isa, const SinkAttention& a, int64_t t, int64_t h) {
  const int64_t hd = a.dim;
  const float* const* keys = a.keys + a.key_begin[t];
  const int64_t n_keys = a.key_begin[t + 1] - a.key_begin[t];
  const float* q = a.q + (t * a.heads + h) * hd;
  std::vector<double> weight(static_cast<size_t>(n_keys)), acc(static_cast<size_t>(hd), 0.0);
  double top = a.sink[h];
  for (int64_t j = 0; j < n_keys; ++j) {
    weight[size_t(j)] = dot_exact(q, keys[j], hd, isa) * double(a.scale);
    top = std::max(top, weight[size_t(j)]);
  }
  double denominator = std::exp(double(a.sink[h]) - top);
  for (double& w : weight) denominator += (w = std::exp(w - top));
  for (int64_t j = 0; j < n_keys; ++j) add_weighted_key(isa, acc.data(), weight[size_t(j)], keys[j], hd);
  float* out = a.out + (t * a.heads + h) * hd;
  for (int64_t i = 0; i < hd; ++i) out[i] = float(acc[size_t(i)] / denominator);
}

}  // namespace

namespace {

// Long rows of keys (a decode row at long context: 8,192 compressed rows of
// 512 floats, 16 MB, in a ratio-128 layer at 1M tokens) are taken a tile of
// keys at a time by all heads, so that each key is read from memory once
// for the scores and once for the weighted sums. Split by (row, block of
// heads), as short rows are, every block read every key again: about 200 MB
// a row at 1M tokens.
constexpr int64_t kAttentionKeyTile = 64;  // 64 keys of 512 floats: 128 KB, in L2

// The weighted sums take twice as many keys per tile (256 KB of decoded
// keys, still in L2): each call of the blocked sums loads its block of
// outputs, runs every key of the tile through it and stores it back, so a
// longer tile halves those loads and stores and the calls. On AMD Zen 5 the
// attention over one to four rows of 8,192 keys (1M tokens) ran 6-12%
// faster (docs/long_context.md, "Longer key tiles for the weighted sums").
// Each output value still gets its FMAs in key order: the same bits.
constexpr int64_t kSumKeyTile = 128;
static_assert(kSumKeyTile >= kAttentionKeyTile, "the key tile's scratch holds the longer of the two");

// Runs body(i) for i in [0, n) on `threads` threads (the caller's alone when
// 1: no parallel region, so that it can run inside one).
template <class Body>
void for_each_item(int threads, int64_t n, const Body& body) {
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// How many keys ahead key_tile asks for an FP8 key's bytes: the decoding
// is the first to read them, and on AMD Zen 5 four rows of 8,192 keys at
// 1M tokens went 7-8% faster asking 4-16 keys ahead than not at all
// (docs/long_context.md, "Cached rows decoded per key tile").
constexpr int64_t kFp8KeysAhead = 8;

// The keys [j0, j0 + count) of a row of n_keys as float pointers: a float
// key's own; an FP8 key (fp8, beside the keys, non-null) decoded into its
// row of the calling thread's key tile, values [d0, d1) only. Valid until
// the thread's next call.
const float* const* key_tile(KernelIsa isa, const float* const* keys, const Fp8Key* fp8, int64_t n_keys, int64_t j0,
                             int64_t count, int64_t dim, int64_t d0, int64_t d1, const float** pointers) {
  if (!fp8) return keys + j0;
  float* tile = thread_scratch_array<float>(ScratchSlot::AttentionKeyTile, kSumKeyTile * dim);
  for (int64_t j = 0; j < count; ++j) {
    pointers[j] = keys[j0 + j];
    if (pointers[j]) continue;
    if (j0 + j + kFp8KeysAhead < n_keys && !keys[j0 + j + kFp8KeysAhead]) {
      const Fp8Key& ahead = fp8[j0 + j + kFp8KeysAhead];
      prefetch_fp8_row(*ahead.rows, ahead.id, d0, d1);
    }
    const Fp8Key& key = fp8[j0 + j];
    decode_fp8_row(isa, *key.rows, key.id, d0, d1, tile + j * dim);
    pointers[j] = tile + j * dim;
  }
  return pointers;
}

// Row t, all heads: the scores tile by tile, the softmax of each head, then
// the weighted sums, one range of dims per thread, each going through the
// key tiles in order. Every score is dot_fixed's and every output value
// gets its FMAs in key order, so the bits are those of the per-head path.
// FP8 keys are decoded per tile, for the scores and again for the sums.
void attend_row(KernelIsa isa, const SinkAttention& a, int64_t t, int threads, float* probs) {
  const int64_t H = a.heads, hd = a.dim;
  const float* const* keys = a.keys + a.key_begin[t];
  const Fp8Key* fp8 = a.fp8_keys ? a.fp8_keys + a.key_begin[t] : nullptr;
  const int64_t n_keys = a.key_begin[t + 1] - a.key_begin[t];
  const float* q = a.q + t * H * hd;
  const int64_t tiles = (n_keys + kAttentionKeyTile - 1) / kAttentionKeyTile;
  for_each_item(threads, tiles, [&](int64_t tile) {
    const int64_t j0 = tile * kAttentionKeyTile, count = std::min(kAttentionKeyTile, n_keys - j0);
    const float* pointers[kAttentionKeyTile];
    dot_fixed_rows_strided(q, H, key_tile(isa, keys, fp8, n_keys, j0, count, hd, 0, hd, pointers), count, hd,
                           probs + j0, n_keys, isa);
  });
  for_each_item(threads, H, [&](int64_t h) {
    softmax_with_sink(probs + h * n_keys, n_keys, a.scale, a.sink[h], isa);
  });
  float* out = a.out + t * H * hd;
  // One contiguous range of dims per thread (whole 32-value blocks), so that
  // each thread streams its part of every key row in order.
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, hd / 32));
  for_each_item(int(parts), parts, [&](int64_t part) {
    const int64_t d0 = hd * part / parts / 32 * 32, d1 = part + 1 == parts ? hd : hd * (part + 1) / parts / 32 * 32;
    for (int64_t h = 0; h < H; ++h) std::fill(out + h * hd + d0, out + h * hd + d1, 0.0f);
    const float* pointers[kSumKeyTile];
    for (int64_t j0 = 0; j0 < n_keys; j0 += kSumKeyTile) {
      const int64_t count = std::min(kSumKeyTile, n_keys - j0);
      add_scaled_rows_range(out, hd, H, probs + j0, n_keys,
                            key_tile(isa, keys, fp8, n_keys, j0, count, hd, d0, d1, pointers), count, d0, d1, isa);
    }
  });
}

}  // namespace

namespace {

// Whether long rows go whole to the threads: with plenty of rows (dynamic
// scheduling evens them out), or where handing the rows out in order, each
// to the least busy thread, ends within 10% of an even split of their keys
// (a decode batch of 2 or 4 sequences at the same long context on 2
// threads): a row split over the threads costs three barriers per row
// (docs/long_context.md, "Whole rows per thread"). Uneven rows (a long and
// a short sequence) are split, so no thread waits for another's long row.
bool whole_rows_balance(const SinkAttention& a, int threads) {
  if (threads <= 1 || a.rows >= 4 * threads) return true;
  if (a.rows < threads) return false;
  std::vector<int64_t> busy(size_t(threads), 0);
  int64_t total = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t keys = a.key_begin[r + 1] - a.key_begin[r];
    *std::min_element(busy.begin(), busy.end()) += keys;
    total += keys;
  }
  return double(*std::max_element(busy.begin(), busy.end())) * threads <= 1.1 * double(total);
}

}  // namespace

void sink_attention(KernelIsa isa, const SinkAttention& a, bool exact) {
  const int64_t H = a.heads, hd = a.dim;
  int64_t work = 0, longest = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    work += 2 * H * hd * (a.key_begin[r + 1] - a.key_begin[r]);
    longest = std::max(longest, a.key_begin[r + 1] - a.key_begin[r]);
  }
  if (a.fp8_keys)
    for (int64_t i = 0; i < a.key_begin[a.rows]; ++i)
      if (!a.keys[i] && a.fp8_keys[i].rows->width != hd)
        throw Error("sink attention: a stored FP8 key of width " + std::to_string(a.fp8_keys[i].rows->width) +
                    " where the keys have " + std::to_string(hd) + " values");
  if (a.fp8_keys && (exact || longest <= 4 * kAttentionKeyTile)) {
    // Short rows read each key once per block of heads, the exact numerics
    // once per head: their FP8 keys are decoded first, once each.
    const int64_t total = a.key_begin[a.rows];
    std::vector<const float*> keys(a.keys, a.keys + total);
    std::vector<int64_t> coded;
    for (int64_t i = 0; i < total; ++i)
      if (!keys[size_t(i)]) coded.push_back(i);
    ScratchArray<float> decoded(int64_t(coded.size()) * hd);
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(coded.size()) * hd * 2))
    for (size_t k = 0; k < coded.size(); ++k)
      decode_fp8_row(isa, *a.fp8_keys[coded[k]].rows, a.fp8_keys[coded[k]].id, 0, hd, decoded.data() + int64_t(k) * hd);
    for (size_t k = 0; k < coded.size(); ++k) keys[size_t(coded[k])] = decoded.data() + int64_t(k) * hd;
    SinkAttention plain = a;
    plain.keys = keys.data();
    plain.fp8_keys = nullptr;
    return sink_attention(isa, plain, exact);
  }
  if (exact) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(work * 4))
    for (int64_t item = 0; item < a.rows * H; ++item) sink_attention_exact(isa, a, item / H, item % H);
    return;
  }
  const int threads = threads_for(work);
  if (longest > 4 * kAttentionKeyTile) {
    // Long rows: whole rows, on a thread each, where that keeps the
    // threads evenly busy; else one row at a time split over the threads.
    if (whole_rows_balance(a, threads)) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
      for (int64_t t = 0; t < a.rows; ++t)
        attend_row(isa, a, t, 1,
                   thread_scratch_array<float>(ScratchSlot::AttentionScores,
                                               H * (a.key_begin[t + 1] - a.key_begin[t])));
    } else {
      float* probs = thread_scratch_array<float>(ScratchSlot::AttentionScores, H * longest);
      for (int64_t t = 0; t < a.rows; ++t) attend_row(isa, a, t, threads, probs);
    }
    return;
  }
  // Short rows (a prefill's window and selected rows; decoding at short
  // context): work items are a row and a block of heads, which share the
  // row's keys (the blocked kernels load each key once for up to 16 heads).
  const int64_t head_block = std::min<int64_t>(H, 16), blocks = (H + head_block - 1) / head_block;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < a.rows * blocks; ++item) {
    const int64_t t = item / blocks, h0 = item % blocks * head_block, heads = std::min(head_block, H - h0);
    const float* const* keys = a.keys + a.key_begin[t];
    const int64_t n_keys = a.key_begin[t + 1] - a.key_begin[t];
    // Scores, then per head the softmax with the sink, as probabilities.
    std::vector<float> probs(size_t(heads * n_keys));
    dot_fixed_rows(a.q + (t * H + h0) * hd, heads, keys, n_keys, hd, probs.data(), isa);
    for (int64_t h = 0; h < heads; ++h) softmax_with_sink(probs.data() + h * n_keys, n_keys, a.scale, a.sink[h0 + h], isa);
    float* oh = a.out + (t * H + h0) * hd;
    std::fill(oh, oh + heads * hd, 0.0f);
    add_scaled_rows(oh, heads, probs.data(), keys, n_keys, hd, isa);
  }
}

namespace {

// Level one of V4.1's two-level top-k over one query's scores: block maxima,
// the newest block pinned, the best `keep` blocks (ties: lower block).
template <typename T>
std::vector<uint8_t> candidate_mask(const ScratchArray<T>& scores, int64_t keep, int64_t block_size) {
  const int64_t visible = scores.size();
  std::vector<uint8_t> mask(static_cast<size_t>(visible), 0);
  if (visible == 0) return mask;
  const int64_t blocks = (visible + block_size - 1) / block_size;
  std::vector<T> block_max(static_cast<size_t>(blocks), -INFINITY);
  for (int64_t i = 0; i < visible; ++i)
    block_max[size_t(i / block_size)] = std::max(block_max[size_t(i / block_size)], scores[size_t(i)]);
  block_max[size_t(blocks - 1)] = INFINITY;
  for (int32_t b : top_k_indices(block_max.data(), blocks, keep))
    for (int64_t i = b * block_size; i < std::min(visible, (b + 1) * block_size); ++i) mask[size_t(i)] = 1;
  return mask;
}

}  // namespace

namespace {

// FP4 key rows are decoded a tile at a time (32 KB of floats, in L1/L2)
// right before they are scored, instead of the whole sequence's keys into
// memory every step (134 MB at 1M tokens of context).
constexpr int64_t kKeyTile = 64;

// Rows [first, first + count) of `keys` as floats (e2m1 code times the
// block's scale, computed in float as the state's own decoder does).
DSV4_TARGET_AVX512 void decode_fp4_rows_avx512(const Fp4RowsView& keys, int64_t first, int64_t count, float* out) {
  const linear_detail::E2m1Tables& tables = linear_detail::e2m1_tables();
  const int64_t blocks = keys.width / keys.block;
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t r = first; r < first + count; ++r, out += keys.width) {
    const uint8_t* nibbles = keys.nibbles + r * (keys.width / 2);
    const uint8_t* scales = keys.scales + r * blocks;
    for (int64_t i = 0; i < keys.width; i += 32) {
      const __m512 table = _mm512_load_ps(tables.values[scales[i / keys.block]]);
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(nibbles + i / 2)));
      const __m512 even = _mm512_permutexvar_ps(b, table), odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
      _mm512_storeu_ps(out + i, _mm512_permutex2var_ps(even, lo, odd));
      _mm512_storeu_ps(out + i + 16, _mm512_permutex2var_ps(even, hi, odd));
    }
  }
}

void decode_fp4_rows(KernelIsa isa, const Fp4RowsView& keys, int64_t first, int64_t count, float* out) {
  if (isa == KernelIsa::Avx512 && keys.width % 32 == 0 && keys.block % 32 == 0)
    return decode_fp4_rows_avx512(keys, first, count, out);
  const int64_t blocks = keys.width / keys.block;
  for (int64_t r = first; r < first + count; ++r, out += keys.width)
    for (int64_t i = 0; i < keys.width; ++i) {
      const uint8_t byte = keys.nibbles[r * (keys.width / 2) + i / 2];
      out[i] = e2m1_to_float(uint8_t(i % 2 ? byte >> 4 : byte & 15)) * e8m0_to_float(keys.scales[r * blocks + i / keys.block]);
    }
}

// scores[i] = sum over h in order of max(d[h][i], 0) * w[h] (a product and
// a sum rounded each), 16 keys per register: the scalar loop's bits. With
// the heads summed one key at a time this loop was a third of the
// indexer's decode time at 1M tokens (a chain of dependent additions).
// Returns how many keys it did. max(0, d) keeps d when d is NaN or -0, as
// std::max(d, 0.0f) does.
DSV4_TARGET_AVX512 int64_t weighted_relu_sums_avx512(const float* d, int64_t heads, int64_t count, const float* w,
                                                     float* scores) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m512 sum = zero;
    for (int64_t h = 0; h < heads; ++h)
      sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_max_ps(zero, _mm512_loadu_ps(d + h * count + i)),
                                             _mm512_set1_ps(w[h])));
    _mm512_storeu_ps(scores + i, sum);
  }
  return i;
}

// Scores of rows [first, first + count) of query row r's keys (fast: the
// fp32 dot rows, the head sum in fp32; exact: dot_exact and the head sum in
// double). Each score depends only on its key, so tiles may run anywhere.
template <typename T>
void score_tile(KernelIsa isa, const IndexerSelect& p, int64_t r, int64_t first, int64_t count, bool exact,
                T* scores) {
  const int64_t heads = p.heads, hd = p.dim;
  const float* weights = p.head_weights + r * heads;
  float* keys = thread_scratch_array<float>(ScratchSlot::IndexerKeys, kKeyTile * hd);
  decode_fp4_rows(isa, p.keys[r], first, count, keys);
  if (exact) {
    for (int64_t i = 0; i < count; ++i) {
      double s = 0.0;
      for (int64_t h = 0; h < heads; ++h)
        s += std::max(dot_exact(p.q + (r * heads + h) * hd, keys + i * hd, hd, isa), 0.0) * double(weights[h]);
      scores[i] = T(s);
    }
    return;
  }
  const float* rows_of_keys[kKeyTile];
  for (int64_t i = 0; i < count; ++i) rows_of_keys[i] = keys + i * hd;
  float dots[kKeyTile * 128];
  float* d = heads * count <= kKeyTile * 128 ? dots : thread_scratch_array<float>(ScratchSlot::IndexerDots, heads * count);
  dot_fixed_rows(p.q + r * heads * hd, heads, rows_of_keys, count, hd, d, isa);
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>)
    if (isa == KernelIsa::Avx512) i = weighted_relu_sums_avx512(d, heads, count, weights, scores);
  for (; i < count; ++i) {
    float s = 0.0f;
    for (int64_t h = 0; h < heads; ++h) s += std::max(d[size_t(h * count + i)], 0.0f) * weights[h];
    scores[i] = T(s);
  }
}

// One query row: scores of its visible rows, tile by tile (on `threads`
// threads where the row is alone: a decode step's one row per sequence),
// then the selection.
// Scores of query row r's visible keys [first, first + count): the integer
// FP4 scores where the query is on the FP4 grid (`fp4`, fast numerics),
// score_tile otherwise.
template <typename T>
void score_keys(KernelIsa isa, const IndexerSelect& p, int64_t r, const Fp4Query* fp4, int64_t first, int64_t count,
                bool exact, T* scores) {
  if constexpr (std::is_same_v<T, float>)
    if (fp4) return fp4_scores(isa, *fp4, p.head_weights + r * p.heads, p.keys[r], first, count, scores);
  score_tile(isa, p, r, first, count, exact, scores);
}

// The integer form of query row r where the fast numerics can use it.
bool row_fp4_query(KernelIsa isa, const IndexerSelect& p, int64_t r, bool exact, Fp4Query& out) {
  return !exact && p.keys[r].block == 32 && fp4_query(p.q + r * p.heads * p.dim, p.heads, p.dim, out, isa);
}

template <typename T>
void select_row(KernelIsa isa, const IndexerSelect& p, int64_t r, bool exact, int threads) {
  const int64_t visible = p.visible[r];
  // From the pool, 64-byte aligned: a fresh 1 MB vector (1M tokens) was a
  // new mapping, page faults and zeroing every step, and its start 16 bytes
  // into a cache line put every tile's last 16 scores on a line that the
  // next tile, on the other thread, wrote too.
  ScratchArray<T> scores(visible);
  const int64_t tiles = (visible + kKeyTile - 1) / kKeyTile;
  Fp4Query query;
  const Fp4Query* fp4 = row_fp4_query(isa, p, r, exact, query) ? &query : nullptr;
  // About eight runs of tiles per thread, each a contiguous stretch of
  // keys: with runs of four tiles (1,024 runs at 1M tokens) two threads
  // scored 262,144 keys in 5.9 ms, with runs of 64 in 4.7 (docs/long_context.md,
  // "Runs of key tiles, the scores' buffer and the top-k").
  const int64_t run = std::max<int64_t>(4, tiles / (8 * std::max(threads, 1)));
#pragma omp parallel for schedule(dynamic, run) num_threads(threads) if (threads > 1)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t first = tile * kKeyTile;
    score_keys(isa, p, r, fp4, first, std::min(kKeyTile, visible - first), exact, scores.data() + first);
  }
  if (p.candidates) (*p.candidates)[size_t(r)] = candidate_mask(scores, p.candidate_blocks, p.candidate_block_size);
  if (p.allowed && p.allowed[r]) {
    // Only the allowed rows compete; their ids map back through `ids`.
    std::vector<int32_t> ids;
    std::vector<T> kept;
    for (int64_t i = 0; i < visible; ++i)
      if (p.allowed[r][i]) ids.push_back(int32_t(i)), kept.push_back(scores[size_t(i)]);
    std::vector<int32_t> picked = top_k_indices(kept.data(), int64_t(kept.size()), p.top_k);
    for (int32_t& i : picked) i = ids[size_t(i)];
    (*p.selected)[size_t(r)] = std::move(picked);
  } else {
    (*p.selected)[size_t(r)] = top_k_indices(scores.data(), visible, p.top_k);
  }
}

}  // namespace

void indexer_row_scores(KernelIsa isa, const IndexerSelect& p, int64_t row, float* scores) {
  Fp4Query query;
  const Fp4Query* fp4 = row_fp4_query(isa, p, row, false, query) ? &query : nullptr;
  for (int64_t first = 0; first < p.visible[row]; first += kKeyTile)
    score_keys(isa, p, row, fp4, first, std::min(kKeyTile, p.visible[row] - first), false, scores + first);
}

void indexer_select(KernelIsa isa, const IndexerSelect& p, bool exact) {
  int64_t work = 0;
  for (int64_t r = 0; r < p.rows; ++r) work += p.visible[r] * p.heads * p.dim;
  p.selected->assign(size_t(p.rows), {});
  if (p.candidates) p.candidates->assign(size_t(p.rows), {});
  // Rows in parallel when there are enough of them (prefill); otherwise
  // each row's key tiles (decode), one row after another. Either way each
  // score has one order. The two are separate loops, not one loop whose
  // parallel region is switched off by an `if`: a parallel region inside
  // that inactive one is a nested region, for which the OpenMP runtime
  // starts fresh, unpinned threads on every call instead of using the
  // pool's (at 1M tokens of context that doubled the indexer's time).
  const int threads = threads_for(work);
  auto select = [&](int64_t r, int row_threads) {
    if (exact)
      select_row<double>(isa, p, r, true, row_threads);
    else
      select_row<float>(isa, p, r, false, row_threads);
  };
  if (p.rows >= threads) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t r = 0; r < p.rows; ++r) select(r, 1);
  } else {
    for (int64_t r = 0; r < p.rows; ++r) select(r, threads);
  }
}

void softmax_pool(const float* const* kv, const float* const* score, int64_t candidates, int64_t width, float* out) {
  std::vector<float> weights(static_cast<size_t>(candidates));
  for (int64_t ch = 0; ch < width; ++ch) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < candidates; ++s) mx = std::max(mx, score[s][ch]);
    float sum = 0.0f;
    for (int64_t s = 0; s < candidates; ++s) sum += (weights[size_t(s)] = std::exp(score[s][ch] - mx));
    float acc = 0.0f;
    for (int64_t s = 0; s < candidates; ++s) acc += kv[s][ch] * (weights[size_t(s)] / sum);
    out[ch] = acc;
  }
}

}  // namespace dsv4::cpu
