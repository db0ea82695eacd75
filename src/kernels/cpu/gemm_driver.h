// The packed GEMM's shared parts (kernels/cpu/linear_avx512.cpp and
// linear_avx2.cpp): the token packing of its two forms, the split into
// tasks, the prefetch of the next panel, and the outer form's driver, which
// each ISA instantiates with its panel decoding, lane chains and fold. The
// blocking never changes bits (docs/kernels.md).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/scratch.h"
#include "kernels/cpu/linear_internal.h"

namespace dsv4::linear_detail {

// The outer form (n >= kOuterMinTokens): a vector holds 16 rows, not 16
// columns. The canonical order is kept lane by lane: lane l of (row, token)
// is the sum of the fp32 FMA chains over the columns c0 + 16k + l of a
// chunk, k = 0, 1, ..., one chain per segment of 16 steps; the kernel runs
// those chains for 32 rows x 12 tokens at once (24
// accumulators, two weight vectors and one broadcast input per step), one
// lane after the other, and the 16 lanes' results are then folded in double
// with vertical adds that make the same tree as fold16. Same bits as the
// dot kernels, with half the L2 traffic of the dot-product form (4 rows x 6
// tokens: four 64-byte weight loads per 24 FMAs) and a third of its fold
// work, which lets one core reach its fp32 FMA peak (docs/kernels.md).
//
// A task takes kRowBlock rows x all tokens (up to kMaxTokenBlock). For each
// chunk it decodes its rows once into a panel laid out [row group of 32]
// [lane][step][32 rows] (256 KB, in L2); each token group's inputs for the
// chunk, laid out [lane][step][token], are 48 KB and stay close in cache.
constexpr int kPanelRows = 32, kOuterTokens = 12;
constexpr int64_t kRowBlock = 64, kMaxTokenBlock = 4096 - 4096 % kOuterTokens;
static_assert(kMaxTokenBlock % kOuterTokens == 0 && kRowBlock % kPanelRows == 0, "blocks hold whole groups");

// Tokens per task: all of them, or for more than kMaxTokenBlock equal
// blocks (4096 tokens: two of 2052 and 2044, not 4092 and a 4-token block
// that decodes every panel again for almost no work), whole groups each.
inline int64_t balanced_token_block(int64_t n, int group) {
  const int64_t blocks = (n + kMaxTokenBlock - 1) / kMaxTokenBlock;
  const int64_t per_block = (n + blocks - 1) / blocks;
  return (per_block + group - 1) / group * group;
}

// Where column i of token `first + t` goes, in the group of `group` tokens
// that starts at `first`: chunk by chunk, lane by lane, step by step.
inline int64_t outer_packed_index(int64_t cols, int64_t first, int group, int64_t t, int64_t i) {
  const int64_t c0 = i / kChunk * kChunk, steps = (std::min(cols, c0 + kChunk) - c0) / 16;
  return first * cols + group * c0 + (i % 16) * steps * group + (i - c0) / 16 * group + t;
}

// Copies token t of n (cols floats in storage order) to its packed place.
inline void pack_token_outer(const float* src, int64_t cols, int64_t n, int64_t t, float* xp) {
  const int64_t first = t / kOuterTokens * kOuterTokens;
  const int group = int(std::min<int64_t>(kOuterTokens, n - first));
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t steps = (std::min(cols, c0 + kChunk) - c0) / 16;
    float* dst = xp + outer_packed_index(cols, first, group, t - first, c0);
    for (int l = 0; l < 16; ++l)
      for (int64_t k = 0; k < steps; ++k) dst[(l * steps + k) * group] = src[c0 + k * 16 + l];
  }
}

// Asks L2 for the weight bytes of storage positions [c0, c1) of rows
// [row0, row1), so that reading the next panel overlaps the FMAs of this one.
inline void prefetch_weights(const Linear& w, int64_t row0, int64_t row1, int64_t c0, int64_t c1) {
  const int64_t bits = w.format == WeightFormat::F32            ? 32
                       : w.format == WeightFormat::BF16         ? 16
                       : w.format == WeightFormat::FP8_BLOCK128 ? 8
                                                                : 4;
  for (int64_t r = row0; r < row1; ++r) {
    const uint8_t* p = w.data + r * w.cols * bits / 8;
    for (int64_t b = c0 * bits / 8; b < c1 * bits / 8; b += 64) _mm_prefetch((const char*)(p + b), _MM_HINT_T1);
  }
}

// How a packed product splits into tasks of row_block rows x token_block
// tokens (token blocks major, so that consecutive tasks share their tokens).
// Threads claim tasks one at a time (schedule(dynamic)): on a shared
// machine a thread that loses its core for a while no longer holds the
// other at the end of every product (a static split was as fast at best but
// much slower in a noisy VM's bad phases; docs/kernels.md). Fewer tasks
// than threads (a small matrix, few tokens): smaller row blocks, whole
// multiples of `row_unit`, so that every thread gets rows. The blocking
// never changes bits.
struct PackedTasks {
  int64_t token_block, token_blocks, row_block, row_blocks;
  int64_t count() const { return row_blocks * token_blocks; }
  int64_t first_token(int64_t task) const { return task / row_blocks * token_block; }
  int64_t first_row(int64_t task) const { return task % row_blocks * row_block; }
};

inline PackedTasks packed_tasks(int64_t out, int64_t n, int threads, int token_group, int64_t row_unit) {
  PackedTasks p;
  p.token_block = balanced_token_block(n, token_group);
  p.token_blocks = (n + p.token_block - 1) / p.token_block;
  p.row_block = kRowBlock;
  if (((out + kRowBlock - 1) / kRowBlock) * p.token_blocks < threads)
    p.row_block = std::clamp<int64_t>((out + threads - 1) / threads, row_unit, kRowBlock) / row_unit * row_unit;
  p.row_blocks = (out + p.row_block - 1) / p.row_block;
  return p;
}

// The panel after the one of (task, chunk [.., c1)): this task's next chunk,
// or the first chunk of the next task (which the next thread to finish
// claims; from another core's L2 it is still closer than DRAM). Its rows
// are asked for in `token_groups` parts, one before each token group of the
// current panel, so that reading it overlaps the FMAs.
struct NextPanel {
  int64_t row0, rows, c0, c1, rows_per_part;
};

inline NextPanel next_panel(const PackedTasks& tasks, int64_t out, int64_t cols, int64_t task, int64_t c1,
                            int64_t token_groups) {
  NextPanel next{tasks.first_row(task), 0, c1, 0, 0};
  if (c1 == cols) {
    next.row0 = tasks.first_row(task + 1);
    next.c0 = 0;
  }
  next.rows = std::min(tasks.row_block, out - next.row0);
  next.c1 = std::min(cols, next.c0 + kChunk);
  next.rows_per_part = (next.rows + token_groups - 1) / token_groups;
  return next;
}

inline void prefetch_next_panel_part(const Linear& w, int64_t row_begin, const NextPanel& next, int64_t part) {
  const int64_t first = part * next.rows_per_part;
  prefetch_weights(w, row_begin + next.row0 + std::min(first, next.rows),
                   row_begin + next.row0 + std::min(first + next.rows_per_part, next.rows), next.c0, next.c1);
}

// Y[t][o] for the task's rows and tokens, from its double sums.
inline void store_task_sums(const double* sums, int64_t row_stride, int64_t token_stride, int64_t nt, int64_t nr,
                            float* y, int64_t y_stride) {
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t r = 0; r < nr; ++r) y[t * y_stride + r] = float(sums[r * row_stride + t * token_stride]);
}

// The dot-product form, from packed_min_tokens(w) to kOuterMinTokens - 1
// tokens: a vector holds 16 columns of one (row, token) pair, the canonical
// lanes themselves. Tokens are packed in groups of kDotTokens: for every 16
// storage positions, the group's tokens' 16 floats back to back. For each
// chunk a task decodes its rows into a panel (for every 16 positions, four
// rows' 16 floats back to back) and sweeps register blocks of 4 rows x 6
// tokens over it; each chunk's lanes are folded with fold16_avx512. Its
// panel needs no transpose, which is what a batch of 16 decoding sequences
// or a prefill's routed experts (~100 tokens each) want.
constexpr int kDotRows = 4, kDotTokens = 6;
static_assert(kMaxTokenBlock % kDotTokens == 0 && kRowBlock % kDotRows == 0, "blocks hold whole groups");

// Element (t, i) of the token group of `group` tokens that starts at `first`.
inline int64_t dot_packed_index(int64_t cols, int64_t first, int group, int64_t t, int64_t i) {
  return first * cols + (i / 16) * (group * 16) + t * 16 + (i % 16);
}

// Copies token t of n (cols floats in storage order) to its packed place.
inline void pack_token_dot(const float* src, int64_t cols, int64_t n, int64_t t, float* xp) {
  const int64_t first = t / kDotTokens * kDotTokens;
  const int group = int(std::min<int64_t>(kDotTokens, n - first));
  float* dst = xp + dot_packed_index(cols, first, group, t - first, 0);
  for (int64_t i = 0; i < cols; i += 16, dst += group * 16) std::copy_n(src + i, 16, dst);
}

// The dot form's driver, shared by the fp32 and the bf16 dot-product kernels
// (linear_avx512.cpp, linear_bf16.cpp): tasks of rows x tokens; for each
// chunk [c0, c1) every row of the task is decoded once into its group of
// kDotRows rows (decode_row(row, c0, c1, group_panel, row_in_group,
// rows_in_group), group_panel = panel + first row of the group * kChunk),
// then for each token group of kDotTokens and row group the register block
// (micro(rows, tokens, group_panel, xg, steps, sums, sums_stride), xg =
// the token group's packed inputs for the chunk) adds the folded chunk to
// the double sums. Y[t][o] for rows [row_begin, row_begin + out).
template <class DecodeRow, class Micro>
void packed_gemm_dot(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                     int64_t y_stride, int threads, const DecodeRow& decode_row, const Micro& micro) {
  const int64_t cols = w.cols;
  const PackedTasks tasks = packed_tasks(out, n, threads, kDotTokens, kDotRows);
  const int64_t token_block = tasks.token_block;
#pragma omp parallel num_threads(threads)
  {
    float* panel = thread_scratch_array<float>(ScratchSlot::GemmPanel, kRowBlock * kChunk);
    double* sums = thread_scratch_array<double>(ScratchSlot::GemmSums, kRowBlock * token_block);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks.count(); ++task) {
      const int64_t t0 = tasks.first_token(task), r0 = tasks.first_row(task);
      const int64_t nt = std::min(token_block, n - t0), nr = std::min(tasks.row_block, out - r0);
      std::fill_n(sums, kRowBlock * token_block, 0.0);
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t c1 = std::min(cols, c0 + kChunk), steps = (c1 - c0) / 16;
        const NextPanel next = next_panel(tasks, out, cols, task, c1, (nt + kDotTokens - 1) / kDotTokens);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t g = r / kDotRows * kDotRows;
          decode_row(row_begin + r0 + r, c0, c1, panel + g * kChunk, int(r - g),
                     int(std::min<int64_t>(kDotRows, nr - g)));
        }
        for (int64_t tg = t0; tg < t0 + nt; tg += kDotTokens) {
          prefetch_next_panel_part(w, row_begin, next, (tg - t0) / kDotTokens);
          const int group = int(std::min<int64_t>(kDotTokens, n - tg));
          const float* xg = xp + tg * cols + (c0 / 16) * (group * 16);
          for (int64_t g = 0; g < nr; g += kDotRows)
            micro(int(std::min<int64_t>(kDotRows, nr - g)), group, panel + g * kChunk, xg, steps,
                  sums + g * token_block + (tg - t0), token_block);
        }
      }
      store_task_sums(sums, token_block, 1, nt, nr, y + t0 * y_stride + r0, y_stride);
    }
  }
}

// The outer form's driver, shared by the AVX-512 and AVX2 kernels: tasks of
// rows x tokens, each chunk's rows decoded once into a panel
// (decode_rows(row, count, c0, steps, rows_tmp, panel) for 16 rows), then
// for each token group and panel row group the 16 lanes' FMA chains
// (lane_chains(group, panel_group, inputs, steps, lanes)) and their fold
// (fold(lanes, group, sums, stride)). Y[t][o] for rows [row_begin,
// row_begin + out) and n tokens packed by pack_token_outer (xp), on
// `threads` threads.
template <class DecodeRows, class LaneChains, class Fold>
void packed_gemm_outer(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                       int64_t y_stride, int threads, const DecodeRows& decode_rows, const LaneChains& lane_chains,
                       const Fold& fold) {
  const int64_t cols = w.cols;
  const PackedTasks tasks = packed_tasks(out, n, threads, kOuterTokens, kPanelRows);
  const int64_t token_block = tasks.token_block;
#pragma omp parallel num_threads(threads)
  {
    float* panel = thread_scratch_array<float>(ScratchSlot::GemmPanel, kRowBlock * kChunk);
    float* rows_tmp = thread_scratch_array<float>(ScratchSlot::GemmRows, 16 * kChunk);
    float* lanes = thread_scratch_array<float>(ScratchSlot::GemmLanes, 16 * kOuterTokens * kPanelRows);
    double* sums = thread_scratch_array<double>(ScratchSlot::GemmSums, token_block * kRowBlock);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks.count(); ++task) {
      const int64_t t0 = tasks.first_token(task), r0 = tasks.first_row(task);
      const int64_t nt = std::min(token_block, n - t0), nr = std::min(tasks.row_block, out - r0);
      const int64_t row_groups = (nr + kPanelRows - 1) / kPanelRows;
      std::fill_n(sums, nt * kRowBlock, 0.0);
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t c1 = std::min(cols, c0 + kChunk), steps = (c1 - c0) / 16;
        const NextPanel next = next_panel(tasks, out, cols, task, c1, (nt + kOuterTokens - 1) / kOuterTokens);
        for (int64_t r = 0; r < row_groups * kPanelRows; r += 16)
          decode_rows(row_begin + r0 + r, int(std::clamp<int64_t>(nr - r, 0, 16)), c0, steps, rows_tmp,
                      panel + (r / kPanelRows) * 16 * steps * kPanelRows + r % kPanelRows);
        for (int64_t tg = t0; tg < t0 + nt; tg += kOuterTokens) {
          prefetch_next_panel_part(w, row_begin, next, (tg - t0) / kOuterTokens);
          const int group = int(std::min<int64_t>(kOuterTokens, n - tg));
          const float* xg = xp + tg * cols + group * c0;
          for (int64_t g = 0; g < row_groups; ++g) {
            lane_chains(group, panel + g * 16 * steps * kPanelRows, xg, steps, lanes);
            fold(lanes, group, sums + (tg - t0) * kRowBlock + g * kPanelRows, kRowBlock);
          }
        }
      }
      store_task_sums(sums, 1, kRowBlock, nt, nr, y + t0 * y_stride + r0, y_stride);
    }
  }
}

}  // namespace dsv4::linear_detail
