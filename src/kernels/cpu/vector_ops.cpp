#include "kernels/cpu/vector_ops.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "kernels/cpu/exact_sums.h"
#include "kernels/cpu/ops.h"

namespace dsv4 {

// dot_fixed and add_scaled use fused multiply-adds (one rounding each): the
// attention then runs at the FMA rate, where a separate multiply and add
// halved it (10% of a prefill). The AVX-512, AVX2 and scalar paths (chosen
// like the matrix kernels, see active_kernel_isa) do the same FMAs in the
// same lanes, so they give the same bits. Written with intrinsics because
// GCC does not vectorize std::fma loops.
namespace {

DSV4_TARGET_AVX512 void fma_lanes_avx512(const float* a, const float* b, int64_t n16, float* acc) {
  __m512 v = _mm512_loadu_ps(acc);
  for (int64_t i = 0; i < n16; i += 16) v = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), v);
  _mm512_storeu_ps(acc, v);
}

DSV4_TARGET_AVX2 void fma_lanes_avx2(const float* a, const float* b, int64_t n16, float* acc) {
  __m256 lo = _mm256_loadu_ps(acc), hi = _mm256_loadu_ps(acc + 8);
  for (int64_t i = 0; i < n16; i += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
  }
  _mm256_storeu_ps(acc, lo);
  _mm256_storeu_ps(acc + 8, hi);
}

DSV4_TARGET_AVX512 void add_scaled_avx512(float* y, float a, const float* x, int64_t n16) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n16; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
}

DSV4_TARGET_AVX2 void add_scaled_avx2(float* y, float a, const float* x, int64_t n8) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n8; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}

}  // namespace

float dot_fixed(const float* a, const float* b, int64_t n, KernelIsa isa) {
  float acc[16] = {};
  const int64_t n16 = n / 16 * 16;
  switch (isa) {
    case KernelIsa::Avx512: fma_lanes_avx512(a, b, n16, acc); break;
    case KernelIsa::Avx2: fma_lanes_avx2(a, b, n16, acc); break;
    default:
      for (int64_t i = 0; i < n16; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  }
  for (int64_t i = n16, l = 0; i < n; ++i, ++l) acc[l] = std::fma(a[i], b[i], acc[l]);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

void rms_norm(float* x, const float* w, int64_t n, float eps, KernelIsa isa) {
  float inv = 1.0f / std::sqrt(sum_of_squares(x, n, isa) / float(n) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) x[i] = w[i] * (x[i] * inv);
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  }
}

void add_scaled(float* y, float a, const float* x, int64_t n, KernelIsa isa) {
  int64_t i = 0;
  switch (isa) {
    case KernelIsa::Avx512:
      i = n / 16 * 16;
      add_scaled_avx512(y, a, x, i);
      break;
    case KernelIsa::Avx2:
      i = n / 8 * 8;
      add_scaled_avx2(y, a, x, i);
      break;
    default: break;
  }
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// ---- attention over many heads: the same bits as dot_fixed / add_scaled
// per pair, with register blocks that load each key once for several heads.

namespace {

// dot_fixed's fold (l += l + 8, then + 4, + 2, + 1) of 16 registers at once:
// each level adds the same pairs of lanes as the one-register fold, packing
// two registers' halves into one, so 15 additions and 30 shuffles replace 16
// separate folds (a quarter of the instructions of a 512-wide dot). Lane
// 4m + L of the result is the fold of v[4L + m].
DSV4_TARGET_AVX512 __attribute__((always_inline)) inline __m512 fold_fixed_16(const __m512 v[16]) {
  __m512 eight[8], four[4], two[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // lanes 0-7: v[2i] folded to 8, 8-15: v[2i + 1]
    eight[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // 128-bit lane m: v[4i + m] folded to 4
    four[i] = _mm512_add_ps(_mm512_shuffle_f32x4(eight[2 * i], eight[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(eight[2 * i], eight[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {  // 128-bit lane L: v[8i + L], v[8i + 4 + L] folded to 2
    const __m512d a = _mm512_castps_pd(four[2 * i]), b = _mm512_castps_pd(four[2 * i + 1]);
    two[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(two[0], two[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(two[0], two[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Four heads against four keys: 16 accumulators, each lane summing
// q[i] * k[i] (fused multiply-add) for i = l mod 16 in increasing i; then
// the 16 folds at once (fold_fixed_16), 4 floats stored per head.
DSV4_TARGET_AVX512 void dot_fixed_4x4(const float* q, int64_t q_stride, const float* const* keys, int64_t dim,
                                      float* scores, int64_t score_stride) {
  // acc[4 * j + h]: fold_fixed_16 then leaves score (h, j) in lane 4h + j.
  __m512 acc[16];
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    __m512 k[4];
    for (int j = 0; j < 4; ++j) k[j] = _mm512_loadu_ps(keys[j] + i);
    for (int h = 0; h < 4; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + h * q_stride + i);
      for (int j = 0; j < 4; ++j) acc[4 * j + h] = _mm512_fmadd_ps(qv, k[j], acc[4 * j + h]);
    }
  }
  const __m512 folded = fold_fixed_16(acc);
  _mm_storeu_ps(scores, _mm512_castps512_ps128(folded));
  _mm_storeu_ps(scores + score_stride, _mm512_extractf32x4_ps(folded, 1));
  _mm_storeu_ps(scores + 2 * score_stride, _mm512_extractf32x4_ps(folded, 2));
  _mm_storeu_ps(scores + 3 * score_stride, _mm512_extractf32x4_ps(folded, 3));
}

// out[h][d] += p[h][j] * key_j[d] for j in order, HB heads, V x 16 dims at
// d: each key load serves HB FMAs and each broadcast weight V.
template <int HB, int V>
DSV4_TARGET_AVX512 void add_scaled_block(float* out, int64_t out_stride, const float* p, int64_t p_stride,
                                         const float* const* keys, int64_t n_keys, int64_t d) {
  __m512 acc[HB][V];
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) acc[h][v] = _mm512_loadu_ps(out + h * out_stride + d + 16 * v);
  for (int64_t j = 0; j < n_keys; ++j) {
    __m512 k[V];
    for (int v = 0; v < V; ++v) k[v] = _mm512_loadu_ps(keys[j] + d + 16 * v);
    for (int h = 0; h < HB; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * p_stride + j]);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm512_fmadd_ps(ph, k[v], acc[h][v]);
    }
  }
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + h * out_stride + d + 16 * v, acc[h][v]);
}

template <int V>
DSV4_TARGET_AVX512 void add_scaled_heads(int64_t heads, float* out, int64_t out_stride, const float* p,
                                         int64_t p_stride, const float* const* keys, int64_t n_keys, int64_t d) {
  switch (heads) {
    case 6: add_scaled_block<6, V>(out, out_stride, p, p_stride, keys, n_keys, d); break;
    case 5: add_scaled_block<5, V>(out, out_stride, p, p_stride, keys, n_keys, d); break;
    case 4: add_scaled_block<4, V>(out, out_stride, p, p_stride, keys, n_keys, d); break;
    case 3: add_scaled_block<3, V>(out, out_stride, p, p_stride, keys, n_keys, d); break;
    case 2: add_scaled_block<2, V>(out, out_stride, p, p_stride, keys, n_keys, d); break;
    default: add_scaled_block<1, V>(out, out_stride, p, p_stride, keys, n_keys, d); break;
  }
}

}  // namespace

// Keys are taken a tile at a time by every block of four heads in turn, as
// many as fill two thirds of the core's L1 data cache (16 keys of 512 floats
// with 48 KB: 32 KB, beside a head block's 8 KB of queries), so that every
// head block after the first reads them from L1: with 64-key tiles from L2
// the scores ran 5-7% slower on the Intel Xeon (docs/kernels.md, "Key tiles
// in L1"). A row's 640 keys (1.3 MB) would otherwise be read once per block
// of heads from L2 or further out. Each score is one dot_fixed whatever the
// tile, so the tile changes no bit.
namespace {
int64_t dot_key_tile(int64_t dim) {
  static const int64_t l1_bytes = [] {
    const long bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return bytes > 0 ? int64_t(bytes) : int64_t(32) << 10;
  }();
  return std::max<int64_t>(4, l1_bytes * 2 / 3 / (dim * int64_t(sizeof(float))) / 4 * 4);
}
}  // namespace

void dot_fixed_rows_strided(const float* q, int64_t heads, const float* const* keys, int64_t n_keys, int64_t dim,
                            float* scores, int64_t score_stride, KernelIsa isa) {
  int64_t h0 = 0, j0 = 0;
  if (isa == KernelIsa::Avx512 && dim % 16 == 0) {
    h0 = heads / 4 * 4;
    j0 = n_keys / 4 * 4;
    const int64_t key_tile = dot_key_tile(dim);
    for (int64_t tile = 0; tile < j0; tile += key_tile)
      for (int64_t h = 0; h < h0; h += 4)
        for (int64_t j = tile; j < std::min(j0, tile + key_tile); j += 4)
          dot_fixed_4x4(q + h * dim, dim, keys + j, dim, scores + h * score_stride + j, score_stride);
  }
  // What the blocks left: the last keys of the blocked heads, then the
  // remaining heads.
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = h < h0 ? j0 : 0; j < n_keys; ++j)
      scores[h * score_stride + j] = dot_fixed(q + h * dim, keys[j], dim, isa);
}

void dot_fixed_rows(const float* q, int64_t heads, const float* const* keys, int64_t n_keys, int64_t dim, float* scores,
                    KernelIsa isa) {
  dot_fixed_rows_strided(q, heads, keys, n_keys, dim, scores, n_keys, isa);
}

// Six heads x 64 dims: 24 accumulators, and each key load and broadcast
// weight feeds four or six FMAs (10 loads per 24 FMAs; eight heads x 32 dims
// took 10 per 16): the weighted sums 10-13% faster on the Intel Xeon
// (docs/kernels.md, "Weighted sums in blocks of six heads").
constexpr int64_t kScaledHeads = 6;

void add_scaled_rows_range(float* out, int64_t out_stride, int64_t heads, const float* p, int64_t p_stride,
                           const float* const* keys, int64_t n_keys, int64_t d_begin, int64_t d_end,
                           KernelIsa isa) {
  if (isa != KernelIsa::Avx512 || (d_end - d_begin) % 16) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < n_keys; ++j)
        add_scaled(out + h * out_stride + d_begin, p[h * p_stride + j], keys[j] + d_begin, d_end - d_begin, isa);
    return;
  }
  // A block of dims for all heads in turn: the keys' slice for those dims
  // (64 x 256 bytes for a tile of 64 keys) stays in L1 while every block of
  // heads reads it.
  auto for_heads = [&](auto width, int64_t d) {
    for (int64_t h0 = 0; h0 < heads; h0 += kScaledHeads)
      add_scaled_heads<decltype(width)::value>(std::min<int64_t>(kScaledHeads, heads - h0), out + h0 * out_stride,
                                               out_stride, p + h0 * p_stride, p_stride, keys, n_keys, d);
  };
  int64_t d = d_begin;
  for (; d + 64 <= d_end; d += 64) for_heads(std::integral_constant<int, 4>{}, d);
  for (; d + 32 <= d_end; d += 32) for_heads(std::integral_constant<int, 2>{}, d);
  if (d < d_end) for_heads(std::integral_constant<int, 1>{}, d);
}

void add_scaled_rows(float* out, int64_t heads, const float* p, const float* const* keys, int64_t n_keys, int64_t dim,
                     KernelIsa isa) {
  add_scaled_rows_range(out, dim, heads, p, n_keys, keys, n_keys, 0, dim, isa);
}

namespace {

// Eight pairs at a time: x * (c, c) + swapped(x) * (-s, s) per pair, which is
// a c - b s and b c + a s with the products and the sum rounded as in the
// scalar loop (the negation is exact, the addition commutes).
DSV4_TARGET_AVX512 int64_t rotate_pairs_avx512(float* x, int64_t dim, const float* cos, const float* sin) {
  const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512 signs = _mm512_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1);
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m512 c = _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(cos + i / 2)));
    const __m512 s =
        _mm512_mul_ps(signs, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(sin + i / 2))));
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 swapped = _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));
    _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_mul_ps(v, c), _mm512_mul_ps(swapped, s)));
  }
  return i;
}

}  // namespace

void rotate_pairs(float* x, int64_t dim, const float* cos, const float* sin, KernelIsa isa) {
  int64_t i = isa == KernelIsa::Avx512 ? rotate_pairs_avx512(x, dim, cos, sin) : 0;
  for (; i + 1 < dim; i += 2) {
    const float a = x[i], b = x[i + 1];
    x[i] = a * cos[i / 2] - b * sin[i / 2];
    x[i + 1] = a * sin[i / 2] + b * cos[i / 2];
  }
}

void hadamard_transform(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float scale = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

namespace cpu {

void rms_norm_exact(float* x, const float* w, int64_t n, float eps, KernelIsa isa) {
  const double inv = 1.0 / std::sqrt(sum_of_squares_exact(x, n, isa) / double(n) + double(eps));
  for (int64_t i = 0; i < n; ++i) x[i] = float((w ? double(w[i]) : 1.0) * (double(x[i]) * inv));
}

}  // namespace cpu

}  // namespace dsv4
