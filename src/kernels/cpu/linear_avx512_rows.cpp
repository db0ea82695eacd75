// The AVX-512 register path: few tokens (decode and small batches) against
// rows decoded in registers, four rows at a time (all formats) or eight
// (BF16 from two tokens, from five with the Intel tuning of
// kernels/cpu/isa.h; FP8 with VDPBF16PS from five, in fp32 from nine; the
// eight-row kernels are in linear_avx512_eight_rows.cpp and
// linear_fp8_pairs.cpp), and how a thread's rows are walked
// (register_rows_avx512). Same bits as the scalar path (kernels/linear.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/scratch.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/linear_avx512_decode.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_AVX512 DSV4_TARGET_AVX512

namespace dsv4::linear_detail {

namespace {

// Few tokens (decode and small batches), in registers: four consecutive rows
// against the tokens in groups of up to four, the weights decoded in
// registers for each group (one pass over the weights from memory: a group
// after the first finds the rows' chunk in L1). Four rows x four tokens keep
// 16 FMA chains in flight. Each (row, token) sees exactly the sequence
// dot_avx512 gives it: same bits.
//
// The loop nest is chunk-major: for each 1024-column chunk, every token group
// in turn. When each group walked whole rows instead, the first group
// stalled on DRAM while the others ran from cache, with no overlap between
// the two (docs/kernels.md); now the groups ask for the rows' next chunk
// while they compute this one.
//
// Each format gives one generic lambda, add_chunk(c0, c1, x, a, group,
// groups), that adds the products of columns [c0, c1) of the four rows with
// the group's T tokens x[0..T) to a[row][t]. It is inlined into this small
// loop nest, so that the compiler keeps the accumulators in registers (one
// function with a switch over formats spilled them at every scale block).
constexpr int kSmallTokenGroup = 4;

template <int T>
DSV4_AVX512 inline void fma16_tokens(__m512 v, const float* const* x, int64_t i, __m512* a) {
  for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x[t] + i), a[t]);
}

// One group of T tokens over one chunk, a segment at a time (add_chunk sees
// [s0, s1)): the segments' sums are added to the lanes in registers, whose
// fold is added to sums[row * kMaxRegisterTokens + t].
template <int T, class AddChunk>
DSV4_AVX512 inline void dot4_group_chunk(const AddChunk& add_chunk, int64_t c0, int64_t c1, const float* const* x,
                                         int group, int groups, double* sums) {
  __m512 lanes[4][T];
  for (auto& r : lanes)
    for (auto& t : r) t = _mm512_setzero_ps();
  for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
    __m512 a[4][T];
    for (auto& r : a)
      for (auto& t : r) t = _mm512_setzero_ps();
    add_chunk(s0, std::min(c1, s0 + kSegment), x, a, group, groups);
    for (int r = 0; r < 4; ++r)
      for (int t = 0; t < T; ++t) lanes[r][t] = _mm512_add_ps(lanes[r][t], a[r][t]);
  }
  add_folds_avx512<4, T>(lanes, sums, kMaxRegisterTokens);
}

// n <= kMaxRegisterTokens tokens (xs: [n][cols], storage order); out[t *
// out_stride + r] receives (row r, token t).
template <class AddChunk>
DSV4_AVX512 inline void dot4_token_groups(int64_t cols, const float* xs, int64_t n, double* out, int64_t out_stride,
                                          const AddChunk& add_chunk) {
  double sums[4][kMaxRegisterTokens] = {};
  const int groups = int((n + kSmallTokenGroup - 1) / kSmallTokenGroup);
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    for (int g = 0; g < groups; ++g) {
      const int64_t t = int64_t(g) * kSmallTokenGroup;
      const float* x[kSmallTokenGroup];
      for (int u = 0; u < kSmallTokenGroup; ++u) x[u] = xs + std::min(t + u, n - 1) * cols;
      double* s = &sums[0][t];
      switch (std::min<int64_t>(kSmallTokenGroup, n - t)) {
        case 4: dot4_group_chunk<4>(add_chunk, c0, c1, x, g, groups, s); break;
        case 3: dot4_group_chunk<3>(add_chunk, c0, c1, x, g, groups, s); break;
        case 2: dot4_group_chunk<2>(add_chunk, c0, c1, x, g, groups, s); break;
        default: dot4_group_chunk<1>(add_chunk, c0, c1, x, g, groups, s); break;
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int64_t t = 0; t < n; ++t) out[t * out_stride + r] = sums[r][t];
}

DSV4_AVX512 void dot4_float_avx512(const Linear& w, const RowGroup& g, const float* xs, int64_t n, double* out,
                                   int64_t out_stride) {
  const int64_t cols = w.cols;
  // With several token groups, the first decodes each chunk's BF16 rows
  // into this L1 buffer and the others load floats from it.
  alignas(64) float decoded[4 * kChunk];
  dot4_token_groups(cols, xs, n, out, out_stride,
                    [&]<int T>(int64_t c0, int64_t c1, const float* const* x, __m512(*a)[T], int group, int groups)
                        DSV4_AVX512 {
                          if (w.format == WeightFormat::F32) {
                            const float* p[4];
                            for (int r = 0; r < 4; ++r) p[r] = reinterpret_cast<const float*>(w.data) + g.row(r) * cols;
                            for (int64_t i = c0; i < c1; i += 16)
                              for (int r = 0; r < 4; ++r) fma16_tokens<T>(_mm512_loadu_ps(p[r] + i), x, i, a[r]);
                            return;
                          }
                          const uint16_t* p[4];
                          for (int r = 0; r < 4; ++r)
                            p[r] = reinterpret_cast<const uint16_t*>(w.data) + g.row(r) * cols;
                          const __m512i widen = bf16_widen_index();
                          // One group (batch 1) asks for each stream's bytes kPrefetchBytesAhead
                          // ahead. Several groups share the prefetches of the rows' next segment
                          // ([c0, c1) is one segment; after the last, the first segment of the
                          // rows this thread takes next), each group its rows, one cache line per
                          // two steps.
                          const bool next_chunk = c1 < cols;
                          const bool stream_ahead = groups == 1 && g.has_next;
                          const bool chunk_ahead = groups > 1 && (next_chunk || g.has_next);
                          if (group > 0) {
                            for (int64_t i = c0; i < c1; i += 16) {
                              if ((i - c0) % 32 == 0 && chunk_ahead)
                                for (int r = group; r < 4; r += groups)
                                  _mm_prefetch((const char*)(p[r] + (next_chunk ? c1 : cols) + (i - c0)), _MM_HINT_T0);
                              for (int r = 0; r < 4; ++r)
                                fma16_tokens<T>(_mm512_load_ps(decoded + r * kChunk + i % kChunk), x, i, a[r]);
                            }
                            return;
                          }
                          for (int64_t i = c0; i < c1; i += 16) {
                            if ((i - c0) % 32 == 0) {
                              if (stream_ahead)
                                for (int r = 0; r < 4; ++r)
                                  _mm_prefetch((const char*)(p[r] + i) + kPrefetchBytesAhead, _MM_HINT_T0);
                              else if (chunk_ahead)
                                for (int r = group; r < 4; r += groups)
                                  _mm_prefetch((const char*)(p[r] + (next_chunk ? c1 : cols) + (i - c0)), _MM_HINT_T0);
                            }
                            for (int r = 0; r < 4; ++r) {
                              const __m512 v = bf16x16_to_ps_avx512(p[r] + i, widen);
                              if (groups > 1) _mm512_store_ps(decoded + r * kChunk + i % kChunk, v);
                              fma16_tokens<T>(v, x, i, a[r]);
                            }
                          }
                        });
}

DSV4_AVX512 void dot4_fp8_avx512(const Linear& w, const RowGroup& g, const float* xs, int64_t n, double* out,
                                 int64_t out_stride) {
  const int64_t cols = w.cols;
  const uint8_t* p[4];
  for (int r = 0; r < 4; ++r) p[r] = w.data + g.row(r) * cols;
  // As for BF16: with several token groups the first one decodes each
  // chunk's rows into this L1 buffer, the others load floats from it.
  alignas(64) float decoded[4 * kChunk];
  dot4_token_groups(cols, xs, n, out, out_stride,
                    [&]<int T>(int64_t c0, int64_t c1, const float* const* x, __m512(*a)[T], int group, int groups)
                        DSV4_AVX512 {
                          if (group > 0) {
                            for (int64_t i = c0; i < c1; i += 16)
                              for (int r = 0; r < 4; ++r)
                                fma16_tokens<T>(_mm512_load_ps(decoded + r * kChunk + i % kChunk), x, i, a[r]);
                            return;
                          }
                          const bool keep = groups > 1;
                          auto use = [&](int r, int64_t i, __m512 v) DSV4_AVX512 {
                            if (keep) _mm512_store_ps(decoded + r * kChunk + i % kChunk, v);
                            fma16_tokens<T>(v, x, i, a[r]);
                          };
                          const bool prefetch = g.has_next;
                          for (int64_t b = c0; b < c1; b += 128) {
                            const int64_t end = std::min(c1, b + 128);
                            uint8_t sb[4];
                            bool half_ok = true;
                            for (int r = 0; r < 4; ++r) {
                              sb[r] = w.scale[(g.row(r) / 128) * w.scale_cols + b / 128];
                              half_ok = half_ok && sb[r] <= kMaxHalfPathScale;
                            }
                            // The fp16 decoding, 32 weights a step. With one token group whose
                            // four rows share the block's scale, that scale is already in the
                            // inputs: each FMA gets the exact product (e4m3 * 2^-8) * (x * 2^(s -
                            // 119)) = (e4m3 * 2^(s - 127)) * x that the other paths give it, same
                            // bits, without the two scale multiplies per 32 weights.
                            auto half_path = [&]<bool kPrescaled>() DSV4_AVX512 {
                              const float* prescaled[T];
                              __m512 sc[4];
                              if constexpr (kPrescaled)
                                for (int t = 0; t < T; ++t) prescaled[t] = g.scaled_inputs + t * cols;
                              else
                                for (int r = 0; r < 4; ++r) sc[r] = _mm512_set1_ps(e8m0_to_float(sb[r]) * 256.0f);
                              auto put = [&](int r, int64_t i, __m512 v) DSV4_AVX512 {
                                if constexpr (kPrescaled) {
                                  fma16_tokens<T>(v, prescaled, i, a[r]);  // groups == 1: nothing to keep
                                } else {
                                  use(r, i, _mm512_mul_ps(v, sc[r]));
                                }
                              };
                              int64_t i = b;
                              for (; i + 32 <= end; i += 32) {
                                if (prefetch && i % 64 == 0)  // one cache line per row
                                  for (int r = 0; r < 4; ++r)
                                    _mm_prefetch((const char*)(p[r] + i) + kPrefetchBytesAhead, _MM_HINT_T0);
                                for (int r = 0; r < 4; ++r) {
                                  __m512 lo, hi;
                                  e4m3x32_to_ps_times_2m8(p[r] + i, lo, hi);
                                  put(r, i, lo);
                                  put(r, i + 16, hi);
                                }
                              }
                              for (; i < end; i += 16)
                                for (int r = 0; r < 4; ++r)
                                  put(r, i, e4m3_to_ps_times_2m8(_mm_loadu_si128((const __m128i*)(p[r] + i))));
                            };
                            if (g.scaled_inputs && groups == 1 && g.scaled_spans[b / 128]) {
                              half_path.template operator()<true>();
                            } else if (half_ok) {
                              half_path.template operator()<false>();
                            } else {
                              for (int64_t i = b; i < end; i += 16)
                                for (int r = 0; r < 4; ++r)
                                  use(r, i,
                                      e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p[r] + i)),
                                                        _mm512_set1_ps(e8m0_to_float(sb[r]))));
                            }
                          }
                        });
}

DSV4_AVX512 void dot4_fp4_avx512(const Linear& w, const RowGroup& g, const float* xs, int64_t n, double* out,
                                 int64_t out_stride) {
  const int64_t cols = w.cols, row_bytes = cols / 2;
  const uint8_t* p[4];
  const uint8_t* s[4];
  for (int r = 0; r < 4; ++r) {
    p[r] = w.data + g.row(r) * row_bytes;
    s[r] = w.scale + g.row(r) * w.scale_cols;
  }
  const E2m1Tables& tables = e2m1_tables();
  dot4_token_groups(cols, xs, n, out, out_stride,
                    [&]<int T>(int64_t c0, int64_t c1, const float* const* x, __m512(*a)[T], int group, int)
                        DSV4_AVX512 {
                          const bool prefetch = g.has_next && group == 0;
                          // Row pointers in locals, advanced per block: indexing the captured
                          // arrays with b / 2 and b / 32 cost scalar uops per row and block
                          // beside the six vector ones.
                          const uint8_t* bytes[4];
                          const uint8_t* scales[4];
                          for (int r = 0; r < 4; ++r) {
                            bytes[r] = p[r] + c0 / 2;
                            scales[r] = s[r] + c0 / 32;
                          }
                          for (int64_t b = c0; b < c1; b += 32) {
                            if (prefetch && b % 128 == 0)  // one cache line per row
                              for (int r = 0; r < 4; ++r)
                                _mm_prefetch((const char*)bytes[r] + kPrefetchBytesAhead, _MM_HINT_T0);
                            for (int r = 0; r < 4; ++r) {
                              __m512 even, odd;
                              e2m1_block_avx512(bytes[r], e2m1_table_avx512(tables, *scales[r]), even, odd);
                              bytes[r] += 16;
                              ++scales[r];
                              fma16_tokens<T>(even, x, b, a[r]);
                              fma16_tokens<T>(odd, x, b + 16, a[r]);
                            }
                          }
                        });
}

// The whole-row functions' end of a segment: each of the four rows' sums
// of the segment (a) added to the row's lanes (l), token by token.
template <int T>
DSV4_AVX512 inline void add_segment_sums(__m512 (&l0)[T], __m512 (&l1)[T], __m512 (&l2)[T], __m512 (&l3)[T],
                                         const __m512 (&a0)[T], const __m512 (&a1)[T], const __m512 (&a2)[T],
                                         const __m512 (&a3)[T]) {
  for (int t = 0; t < T; ++t) {
    l0[t] = _mm512_add_ps(l0[t], a0[t]);
    l1[t] = _mm512_add_ps(l1[t], a1[t]);
    l2[t] = _mm512_add_ps(l2[t], a2[t]);
    l3[t] = _mm512_add_ps(l3[t], a3[t]);
  }
}

// One to four tokens against the four rows of `g` (FP4): dot4_fp4_avx512's
// steps, chunks and folds (fold16x4_avx512 gives each row fold16_avx512's
// bits), so the same results, as one function over the whole rows with the
// sums in registers. Where VDPBF16PS is off (an Intel Xeon measures it at
// half the FMAs' rate), the one-token experts took this form's per-chunk
// calls, pointer arrays and sums in memory; as for the pair kernel
// (fp4_pairs_whole_rows) they cost several percent of a one-token product
// (docs/kernels.md, "FP4 one token without VDPBF16PS").
template <int T>
DSV4_AVX512 void fp4_whole_rows_avx512(const Linear& w, const RowGroup& g, const float* xs, double* out,
                                       int64_t out_stride) {
  const int64_t cols = w.cols, row_bytes = cols / 2;
  const uint8_t *p0 = w.data + g.row(0) * row_bytes, *p1 = w.data + g.row(1) * row_bytes;
  const uint8_t *p2 = w.data + g.row(2) * row_bytes, *p3 = w.data + g.row(3) * row_bytes;
  const uint8_t *s0 = w.scale + g.row(0) * w.scale_cols, *s1 = w.scale + g.row(1) * w.scale_cols;
  const uint8_t *s2 = w.scale + g.row(2) * w.scale_cols, *s3 = w.scale + g.row(3) * w.scale_cols;
  const E2m1Tables& tables = e2m1_tables();
  const bool prefetch = g.has_next;
  __m256d sums[T];  // rows 0-3 of each token
  for (auto& sum : sums) sum = _mm256_setzero_pd();
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t chunk_end = std::min(cols, c0 + kChunk) / 32;  // blocks
    __m512 l0[T], l1[T], l2[T], l3[T];                           // the lanes: the segments' sums
    for (int t = 0; t < T; ++t) l0[t] = l1[t] = l2[t] = l3[t] = _mm512_setzero_ps();
    for (int64_t first = c0 / 32; first < chunk_end; first += kSegment / 32) {
      const int64_t end = std::min(chunk_end, first + kSegment / 32);
      __m512 a0[T], a1[T], a2[T], a3[T];
      for (int t = 0; t < T; ++t) a0[t] = a1[t] = a2[t] = a3[t] = _mm512_setzero_ps();
        // A segment's eight blocks unrolled: as a loop of eight the one-token
        // product ran 2-5% slower than the chunk's loop of 32 before the
        // segments (docs/kernels.md, "Segments and AMX on the Intel Xeon").
#pragma GCC unroll 8
      for (int64_t k = first; k < end; ++k) {
        if (prefetch && k % 4 == 0) {  // one cache line per row, as dot4_fp4_avx512
          _mm_prefetch((const char*)p0 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)p1 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)p2 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)p3 + 16 * k + kPrefetchBytesAhead, _MM_HINT_T0);
        }
        __m512 even, odd;
        auto row = [&](const uint8_t* bytes, uint8_t scale, __m512* a) DSV4_AVX512 {
          e2m1_block_avx512(bytes + 16 * k, e2m1_table_avx512(tables, scale), even, odd);
          for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(even, _mm512_loadu_ps(xs + t * cols + 32 * k), a[t]);
          for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(odd, _mm512_loadu_ps(xs + t * cols + 32 * k + 16), a[t]);
        };
        row(p0, s0[k], a0);
        row(p1, s1[k], a1);
        row(p2, s2[k], a2);
        row(p3, s3[k], a3);
      }
      add_segment_sums<T>(l0, l1, l2, l3, a0, a1, a2, a3);
    }
    for (int t = 0; t < T; ++t) sums[t] = _mm256_add_pd(sums[t], fold16x4_avx512(l0[t], l1[t], l2[t], l3[t]));
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_pd(out + t * out_stride, sums[t]);
}

// One to four tokens against the four rows of `g` (FP8, one 128-row block,
// so one scale per 128 columns for all four, each at most
// kMaxHalfPathScale), the fp16 decoding of dot4_fp8_avx512 as one function
// over the whole rows with the sums in registers: each 32 columns of a row
// are decoded once, scaled (unless kPrescaled: then `xs` are the scaled
// inputs, every span prescaled) and fed to the tokens' FMAs, whose inputs
// are loaded once for the four rows. The same steps,
// chunks and folds as dot4_fp8_avx512, so the same bits. There the step
// loop's nested lambdas kept the accumulators in memory: four tokens ran at
// 26% of the FMA chains, the same product with FP4 rows at 55%
// (docs/kernels.md, "FP8 few tokens in fp32"). V4's wo_a (inputs not
// FP8-rounded) takes it at batches of 1-8 rows, and so does every FP8
// product of 1-8 tokens where VDPBF16PS is off; 5-8 tokens call it twice on
// the same rows (register_rows_avx512). cols is a multiple of 32.
template <int T, bool kPrescaled>
DSV4_AVX512 void fp8_whole_rows_avx512(const Linear& w, const RowGroup& g, const float* xs, double* out,
                                       int64_t out_stride) {
  const int64_t cols = w.cols;
  const uint8_t *p0 = w.data + g.row(0) * cols, *p1 = w.data + g.row(1) * cols;
  const uint8_t *p2 = w.data + g.row(2) * cols, *p3 = w.data + g.row(3) * cols;
  const uint8_t* scales = w.scale + (g.row(0) / 128) * w.scale_cols;
  __m256d sums[T];  // rows 0-3 of each token
  for (auto& sum : sums) sum = _mm256_setzero_pd();
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    __m512 l0[T], l1[T], l2[T], l3[T];  // the lanes: the segments' sums
    for (int t = 0; t < T; ++t) l0[t] = l1[t] = l2[t] = l3[t] = _mm512_setzero_ps();
    for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
      __m512 a0[T], a1[T], a2[T], a3[T];
      for (int t = 0; t < T; ++t) a0[t] = a1[t] = a2[t] = a3[t] = _mm512_setzero_ps();
      // One loop over the segment, the scale changing every 128 columns (a
      // loop per 128-column span inside it ran one token up to 5% slower in
      // cache).
      __m512 scale = _mm512_setzero_ps();
      for (int64_t i = s0; i < std::min(c1, s0 + kSegment); i += 32) {
        if constexpr (!kPrescaled)
          if (i % 128 == 0) scale = _mm512_set1_ps(e8m0_to_float(scales[i / 128]) * 256.0f);
        if (g.has_next && i % 64 == 0) {  // one cache line per row, as dot4_fp8_avx512
          _mm_prefetch((const char*)(p0 + i) + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)(p1 + i) + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)(p2 + i) + kPrefetchBytesAhead, _MM_HINT_T0);
          _mm_prefetch((const char*)(p3 + i) + kPrefetchBytesAhead, _MM_HINT_T0);
        }
        __m512 x0[T], x1[T];
        for (int t = 0; t < T; ++t) {
          x0[t] = _mm512_loadu_ps(xs + t * cols + i);
          x1[t] = _mm512_loadu_ps(xs + t * cols + i + 16);
        }
        auto row = [&](const uint8_t* p, __m512* a) DSV4_AVX512 {
          __m512 lo, hi;
          e4m3x32_to_ps_times_2m8(p + i, lo, hi);
          if constexpr (!kPrescaled) {
            lo = _mm512_mul_ps(lo, scale);
            hi = _mm512_mul_ps(hi, scale);
          }
          for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(lo, x0[t], a[t]);
          for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(hi, x1[t], a[t]);
        };
        row(p0, a0);
        row(p1, a1);
        row(p2, a2);
        row(p3, a3);
      }
      add_segment_sums<T>(l0, l1, l2, l3, a0, a1, a2, a3);
    }
    for (int t = 0; t < T; ++t) sums[t] = _mm256_add_pd(sums[t], fold16x4_avx512(l0[t], l1[t], l2[t], l3[t]));
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_pd(out + t * out_stride, sums[t]);
}

// The four rows of `g` against n < packed_min_tokens(w) tokens.
DSV4_AVX512 void dot4_all_tokens_avx512(const Linear& w, const RowGroup& g, const float* xs, int64_t n, double* out,
                                        int64_t out_stride) {
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16: dot4_float_avx512(w, g, xs, n, out, out_stride); break;
    case WeightFormat::FP8_BLOCK128: dot4_fp8_avx512(w, g, xs, n, out, out_stride); break;
    case WeightFormat::FP4_BLOCK32:
      switch (n) {
        case 1: fp4_whole_rows_avx512<1>(w, g, xs, out, out_stride); break;
        case 2: fp4_whole_rows_avx512<2>(w, g, xs, out, out_stride); break;
        case 3: fp4_whole_rows_avx512<3>(w, g, xs, out, out_stride); break;
        case 4: fp4_whole_rows_avx512<4>(w, g, xs, out, out_stride); break;
        default: dot4_fp4_avx512(w, g, xs, n, out, out_stride); break;
      }
      break;
  }
}

// The rows an eight-row kernel takes: rows[r] = first + r % run + (r / run)
// * stride, runs of `run` consecutive rows `stride` apart (run 8: the eight
// consecutive rows from `first`; dot8_fp8_pairs reads its block scales from
// rows[0], so all eight lie in one 128-row block). kernel(rows, out) fills
// out[t * 8 + r] for the n tokens; each result goes to y[t * y_stride +
// rows[r] - row_begin].
template <class Kernel>
inline void eight_rows(int64_t first, int run, int64_t stride, int64_t row_begin, int64_t n, float* y, int64_t y_stride,
                       Kernel&& kernel) {
  int64_t rows[kEightRows];
  for (int r = 0; r < kEightRows; ++r) rows[r] = first + r % run + (r / run) * stride;
  double out[kEightRows * kMaxRegisterTokens];
  kernel(static_cast<const int64_t*>(rows), out);
  for (int64_t t = 0; t < n; ++t)
    for (int r = 0; r < kEightRows; ++r) y[t * y_stride + rows[r] - row_begin] = float(out[t * kEightRows + r]);
}

// Rows [lo, hi) of rows [row_begin, row_begin + out) against n register-path
// tokens, as four streams (see RowGroup); BF16 rows against two or more
// tokens first go eight at a time (kEightRowConsecutiveMaxTokensBf16); the
// last rows of a range that does not split in four go one by one. With
// `pairs` (FP4, or FP8 against at most kFp8FourRowMaxTokens tokens), each
// group goes to the format's VDPBF16PS kernel where its scales allow, else
// to the fp32 one.
void rows_as_four_streams(const Linear& w, int64_t row_begin, int64_t lo, int64_t hi, const float* xs, int64_t n,
                          float* y, int64_t y_stride, const uint32_t* pairs) {
  // (With the Intel tuning, 2-4 tokens go as four streams below.)
  if (w.format == WeightFormat::BF16 && n >= kEightRowMinTokens &&
      !(n <= kBf16QuarterMaxTokens && kernel_tuning() == KernelTuning::Intel)) {
    if (n <= kEightRowConsecutiveMaxTokensBf16) {
      // Eight consecutive rows at a time; the last chunk prefetches the
      // next eight.
      for (; lo + kEightRows <= hi; lo += kEightRows)
        eight_rows(row_begin + lo, kEightRows, 0, row_begin, n, y, y_stride, [&](const int64_t* rows, double* out) {
          dot8_bf16_avx512(w, rows, lo + 2 * kEightRows <= hi ? kEightRows : 0, xs, n, out);
        });
    } else {
      // Row j of each of eight streams an eighth of the range apart, then
      // row j + 1.
      const int64_t eighth = (hi - lo) / kEightRows;
      for (int64_t j = 0; j < eighth; ++j)
        eight_rows(row_begin + lo + j, 1, eighth, row_begin, n, y, y_stride, [&](const int64_t* rows, double* out) {
          dot8_bf16_avx512(w, rows, j + 1 < eighth ? 1 : 0, xs, n, out);
        });
      lo += kEightRows * eighth;
    }
    // Fewer than eight rows are left: they go on below.
  }
  const int64_t quarter = (hi - lo) / 4;
  // FP8's scales belong to 128-row blocks: each stream's block is checked
  // once for the VDPBF16PS kernel's range, not its rows at every group.
  const bool fp8_pairs = pairs && w.format == WeightFormat::FP8_BLOCK128;
  int64_t checked_block[4] = {-1, -1, -1, -1};
  bool block_within[4] = {};
  for (int64_t j = 0; j < quarter; ++j) {
    const RowGroup g{row_begin + lo + j, quarter, j + 1 < quarter};
    double r[4 * kMaxRegisterTokens];
    bool paired = false;
    if (fp8_pairs) {
      for (int q = 0; q < 4; ++q)
        if (g.row(q) / 128 != checked_block[q]) {
          checked_block[q] = g.row(q) / 128;
          block_within[q] = fp8_block_scales_within(w, g.row(q), kBf16DotMinFp8Scale);
        }
      paired = block_within[0] && block_within[1] && block_within[2] && block_within[3];
      if (paired) dot4_fp8_pairs(w, g, pairs, n, r, 4);
    } else if (pairs) {
      paired = dot4_fp4_pairs(w, g, pairs, n, r, 4);
    }
    if (!paired) dot4_all_tokens_avx512(w, g, xs, n, r, 4);
    for (int64_t t = 0; t < n; ++t)
      for (int q = 0; q < 4; ++q) y[t * y_stride + lo + j + q * quarter] = float(r[t * 4 + q]);
  }
  for (int64_t o = lo + 4 * quarter; o < hi; ++o)
    for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = float(dot_avx512(w, row_begin + o, xs + t * w.cols));
}

}  // namespace

DSV4_AVX512 std::pair<int, int> prescalable_scales_avx512(const float* xs, int64_t count) {
  const __m512i field_mask = _mm512_set1_epi32(0xff), magnitude_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i lo = _mm512_set1_epi32(255), hi = _mm512_setzero_si512();
  for (int64_t i = 0; i < count; i += 16) {
    const __m512i bits = _mm512_loadu_si512(xs + i);
    const __m512i field = _mm512_and_si512(_mm512_srli_epi32(bits, 23), field_mask);
    const __mmask16 nonzero = _mm512_test_epi32_mask(bits, magnitude_mask);
    lo = _mm512_mask_min_epi32(lo, nonzero, lo, field);
    hi = _mm512_mask_max_epi32(hi, nonzero, hi, field);
  }
  return prescalable_scale_range(_mm512_reduce_min_epi32(lo), _mm512_reduce_max_epi32(hi));
}

// Rows [o0, o1) against n register-path tokens. FP8 rows that fill whole
// 128-row blocks go as four streams 32 rows apart inside each block: the
// four rows of a group then share their scales, and for 1-4 tokens each
// block's scales go into a copy of the inputs once, for its 32 groups,
// instead of into every decoded weight (faster on an Intel Xeon with the
// old four-row kernel and on AMD Zen 5 with the whole-row one; docs/kernels.md,
// "FP8 few tokens in fp32"); from
// kEightRowMinTokensFp8 tokens with step pairs, eight rows of the block go
// at a time (dot8_fp8_pairs). The other rows go as four streams over the
// range.
DSV4_AVX512 void register_rows_avx512(const Linear& w, int64_t row_begin, int64_t o0, int64_t o1, const float* xs,
                                      int64_t n, float* y, int64_t y_stride, const uint32_t* pairs) {
  if (w.format == WeightFormat::FP8_BLOCK128 && pairs && n <= kFp8FourRowMaxTokens) {
    // The byte-table kernel applies each row's own block scales, so the
    // rows go as four long streams over the range like the other formats,
    // not as the blocks' four streams 32 rows apart below, which restart
    // every 128 rows (on AMD Zen 5 those read 30-40% less from DRAM;
    // docs/kernels.md, "FP8 four rows with byte tables").
    rows_as_four_streams(w, row_begin, o0, o1, xs, n, y, y_stride, pairs);
    return;
  }
  const int64_t blocks_begin = (row_begin + o0 + 127) / 128 * 128 - row_begin;
  const int64_t blocks_end = (row_begin + o1) / 128 * 128 - row_begin;
  if (w.format != WeightFormat::FP8_BLOCK128 || blocks_begin >= blocks_end) {
    // (FP8 pairs serve whole blocks only.)
    rows_as_four_streams(w, row_begin, o0, o1, xs, n, y, y_stride,
                         w.format == WeightFormat::FP4_BLOCK32 ? pairs : nullptr);
    return;
  }
  rows_as_four_streams(w, row_begin, o0, blocks_begin, xs, n, y, y_stride, nullptr);
  const int64_t cols = w.cols, spans = w.scale_cols;
  const bool prescale = n <= kFp8PrescaledMaxTokens;
  const auto [prescale_min, prescale_max] =
      prescale ? prescalable_scales_avx512(xs, n * cols) : std::pair<int, int>{1, 0};
  float* scaled = nullptr;  // the scaled inputs, then a flag per span, in one scratch block
  uint8_t* scaled_spans = nullptr;
  if (prescale) {
    scaled = static_cast<float*>(thread_scratch(ScratchSlot::ScaledInput, size_t(n * cols) * 4 + size_t(spans)));
    scaled_spans = reinterpret_cast<uint8_t*>(scaled + n * cols);
  }
  for (int64_t block = blocks_begin; block < blocks_end; block += 128) {
    if (prescale) {
      const uint8_t* scale_row = w.scale + (row_begin + block) / 128 * spans;
      for (int64_t k = 0; k < spans; ++k) {
        const int s = scale_row[k];
        scaled_spans[k] = s >= prescale_min && s <= prescale_max;
        if (!scaled_spans[k]) continue;
        const __m512 f = _mm512_set1_ps(e8m0_to_float(uint8_t(s)) * 256.0f);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = k * 128; c < std::min(cols, k * 128 + 128); c += 16)
            _mm512_storeu_ps(scaled + t * cols + c, _mm512_mul_ps(_mm512_loadu_ps(xs + t * cols + c), f));
      }
    }
    int64_t j = 0;
    // Eight consecutive rows at a time, then the next eight (after the
    // block's last, the next block's first): with VDPBF16PS, or from
    // kEightRowMinTokensFp32Fp8 tokens through bf16.
    const int64_t first_row = row_begin + block;
    const bool by_pairs =
        pairs && n >= kEightRowMinTokensFp8 && fp8_block_scales_within(w, first_row, kBf16DotMinFp8Scale);
    const bool as_bf16 = !by_pairs && n >= kEightRowMinTokensFp32Fp8 && cols % 32 == 0 &&
                         fp8_block_scales_within(w, first_row, kBf16ExactMinFp8Scale);
    if (by_pairs || as_bf16) {
      for (int64_t k = 0; k < 128; k += kEightRows) {
        const int64_t next_rows = k + kEightRows < 128 || block + 128 < blocks_end ? kEightRows : 0;
        eight_rows(first_row + k, kEightRows, 0, row_begin, n, y, y_stride, [&](const int64_t* rows, double* out) {
          if (by_pairs)
            dot8_fp8_pairs(w, rows, next_rows, pairs, n, out);
          else
            dot8_fp8_as_bf16_avx512(w, rows, next_rows, xs, n, out);
        });
      }
      j = 32;
    }
    // The whole-row function where every span is prescaled or the block's
    // scales are in the fp16 decoding's range (elsewhere dot4_fp8_avx512
    // takes the spans apart); 5-8 tokens as two passes over each row group,
    // the second finding the rows in L1 (docs/kernels.md, "FP8 few tokens
    // in fp32").
    const bool all_prescaled =
        prescale && std::all_of(scaled_spans, scaled_spans + spans, [](uint8_t on) { return on; });
    const bool whole_rows = cols % 32 == 0 && n <= kFp8WholeRowsMaxTokens &&
                            (all_prescaled || fp8_block_scales_within(w, row_begin + block, 0));
    for (; j < 32; ++j) {
      const RowGroup g{row_begin + block + j, 32, j + 1 < 32, scaled, scaled_spans};
      double r[4 * kMaxRegisterTokens];
      if (whole_rows && all_prescaled) {
        with_block_size<4>(int(n), [&](auto tokens) { fp8_whole_rows_avx512<tokens.value, true>(w, g, scaled, r, 4); });
      } else if (whole_rows) {
        RowGroup pass = g;
        for (int64_t t0 = 0; t0 < n; t0 += 4) {
          with_block_size<4>(int(n - t0), [&](auto tokens) {
            fp8_whole_rows_avx512<tokens.value, false>(w, pass, xs + t0 * cols, r + 4 * t0, 4);
          });
          pass.has_next = false;  // the later passes find the rows in L1
        }
      } else
        dot4_all_tokens_avx512(w, g, xs, n, r, 4);
      for (int64_t t = 0; t < n; ++t)
        for (int q = 0; q < 4; ++q) y[t * y_stride + block + j + 32 * q] = float(r[t * 4 + q]);
    }
  }
  rows_as_four_streams(w, row_begin, blocks_end, o1, xs, n, y, y_stride, nullptr);
}

}  // namespace dsv4::linear_detail
