// The packed GEMM with AMX tiles (TDPBF16PS), for FP8 and FP4 weights
// against FP8-rounded inputs: every operand exact in bf16, every product
// exact in fp32, as for the VDPBF16PS kernels (linear_bf16.cpp).
//
// Why it gives the canonical bits (kernels/linear.h): with one nonzero
// product in each bf16 pair, one TDPBF16PS sets each fp32 element of its
// accumulator tile to round(C + S), S being its 16 pairs' products added
// in order in fp32 starting from zero, each addition rounded to nearest
// even (tests/test_amx_bf16.cpp pins this on every AMX CPU). So a tile
// element is one lane of one (row, token): its A row holds the weight row's
// 16 steps of that lane in one segment, each weight in the pair's first
// element and zero in the second; its B column holds the token's inputs for
// the same steps, each beside a zero. One instruction then adds a whole
// segment to the lane, as the canonical order does, for 16 rows x 16 tokens
// at once. The other half of each pair is wasted (half the instruction's
// peak): with both halves nonzero the tiles add a pair in a way no fp32
// sequence of roundings gives (docs/kernels.md, "AMX").
//
// Subnormals: the tiles flush them as VDPBF16PS does; the same checks
// (bf16_dot_weights_qualify, bf16_dot_inputs_qualify) keep every value a
// multiple of 2^-114 and so away from them, and a product that fails them
// takes the fp32 kernels (same bits).
//
// Layouts. The weights are the A operand (a tile row: one weight row's 16
// steps of one lane in one segment, each a 32-bit word with the weight's
// bf16 in the low half and the pair's zero in the high half), the inputs
// the B operand (a tile row: one step for 16 tokens), so the accumulator
// tiles hold 16 rows x 16 tokens. A task's panel for a chunk holds, per
// 16-row tile, lane and segment, one 1 KB A tile; decoding a row's segment
// (256 weights, 16 steps of 16 lanes) takes one 16 x 16 transpose in
// registers. The inputs are packed per group of 16 tokens (zeros past the
// last token): for each chunk, [lane][segment][step][16 tokens] words, one
// B tile each.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "core/scratch.h"
#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/gemm_driver.h"
#include "kernels/cpu/linear_avx512_decode.h"
#include "kernels/cpu/linear_internal.h"

#define DSV4_AMX DSV4_TARGET_AMX

namespace dsv4::linear_detail {

namespace {

// Palette 1: every tile used here is 16 rows of 64 bytes. Tiles 0-3 are
// accumulators (two 16-row tiles x two groups of 16 tokens), 4-5 the row
// tiles' A operands, 6-7 the token groups' B operands.
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

DSV4_AMX void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// Storage positions [p0, p0 + kSegment) of a row, decoded with the scale
// applied (the values of decode_chunk_avx512), in registers: steps[k]
// holds step k's 16 lanes.
DSV4_AMX inline void decode_segment(const Linear& w, int64_t row, int64_t p0, __m512 (&steps)[16]) {
  if (w.format == WeightFormat::FP8_BLOCK128) {
    const uint8_t* p = w.data + row * w.cols + p0;
    for (int b = 0; b < 2; ++b) {  // the segment's two 128-column scale blocks
      const uint8_t scale = w.scale[(row / 128) * w.scale_cols + p0 / 128 + b];
      if (scale <= kMaxHalfPathScale) {
        const __m512 scale256 = _mm512_set1_ps(e8m0_to_float(scale) * 256.0f);
        for (int j = 0; j < 4; ++j) {
          __m512 lo, hi;
          e4m3x32_to_ps_times_2m8(p + 128 * b + 32 * j, lo, hi);
          steps[8 * b + 2 * j] = _mm512_mul_ps(lo, scale256);
          steps[8 * b + 2 * j + 1] = _mm512_mul_ps(hi, scale256);
        }
      } else {
        const __m512 sc = _mm512_set1_ps(e8m0_to_float(scale));
        for (int j = 0; j < 8; ++j)
          steps[8 * b + j] = e4m3_to_ps_avx512(_mm_loadu_si128((const __m128i*)(p + 128 * b + 16 * j)), sc);
      }
    }
    return;
  }
  const uint8_t* p = w.data + row * (w.cols / 2) + p0 / 2;  // FP4: eight 32-column blocks
  const uint8_t* scales = w.scale + row * w.scale_cols + p0 / 32;
  const E2m1Tables& tables = e2m1_tables();
  for (int b = 0; b < 8; ++b)
    e2m1_block_avx512(p + 16 * b, e2m1_table_avx512(tables, scales[b]), steps[2 * b], steps[2 * b + 1]);
}

// An FP8 segment's 256 codes (byte k * 16 + l: step k of lane l) into lane
// order (byte l * 16 + k) with two byte permutes around a 4 x 4 transpose of
// 128-bit blocks: 16 shuffles where the floats' 16 x 16 transpose takes 64.
// first: within each register of four steps, the bytes of lanes 4j..4j+3
// gathered into block j (lane, then step); last: within each register of
// four lanes after the block transpose, each lane's 16 steps in order.
struct Fp8LaneOrder {
  alignas(64) uint8_t first[64], last[64];
  Fp8LaneOrder() {
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 4; ++i)
        for (int k = 0; k < 4; ++k) first[j * 16 + i * 4 + k] = uint8_t(k * 16 + 4 * j + i);
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 16; ++k) last[i * 16 + k] = uint8_t((k / 4) * 16 + i * 4 + k % 4);
  }
};
const Fp8LaneOrder& fp8_lane_order() {
  static const Fp8LaneOrder order;
  return order;
}

// The segment of FP8 codes at p (both 128-column spans' scales at most
// kMaxHalfPathScale; scale256: each step's scale times 256) as words, lane l
// at out + l * lane_stride: the fp16 decoding of dot4_fp8_avx512 (the code
// times 2^-8, times the scale times 256), so the values decode_chunk_avx512
// gives.
DSV4_AMX inline void fp8_segment_words(const uint8_t* p, __m512 scale256, uint32_t* out, int64_t lane_stride) {
  const Fp8LaneOrder& order = fp8_lane_order();
  const __m512i first = _mm512_load_si512(order.first), last = _mm512_load_si512(order.last);
  __m512i quads[4];  // quads[q]: steps 4q..4q+3, block j holding lanes 4j..4j+3
  for (int q = 0; q < 4; ++q) quads[q] = _mm512_permutexvar_epi8(first, _mm512_loadu_si512(p + 64 * q));
  const __m512i low01 = _mm512_shuffle_i64x2(quads[0], quads[1], 0x44);
  const __m512i high01 = _mm512_shuffle_i64x2(quads[0], quads[1], 0xEE);
  const __m512i low23 = _mm512_shuffle_i64x2(quads[2], quads[3], 0x44);
  const __m512i high23 = _mm512_shuffle_i64x2(quads[2], quads[3], 0xEE);
  // lane_quads[j]: lanes 4j..4j+3, block q holding their steps 4q..4q+3.
  const __m512i lane_quads[4] = {_mm512_shuffle_i64x2(low01, low23, 0x88), _mm512_shuffle_i64x2(low01, low23, 0xDD),
                                 _mm512_shuffle_i64x2(high01, high23, 0x88),
                                 _mm512_shuffle_i64x2(high01, high23, 0xDD)};
  const __m512i keep = _mm512_set1_epi16(int16_t(0xBFFF));
  for (int j = 0; j < 4; ++j) {
    const __m512i codes = _mm512_permutexvar_epi8(last, lane_quads[j]);  // lane 4j + i's 16 steps in block i
    for (int pair = 0; pair < 2; ++pair) {
      const __m256i two_lanes = pair == 0 ? _mm512_castsi512_si256(codes) : _mm512_extracti64x4_epi64(codes, 1);
      const __m512i fp16 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(two_lanes), 7), keep);
      const __m512 even = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(fp16)), scale256);
      const __m512 odd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(fp16, 1)), scale256);
      const int lane = 4 * j + 2 * pair;
      _mm512_storeu_si512(out + lane * lane_stride, _mm512_srli_epi32(_mm512_castps_si512(even), 16));
      _mm512_storeu_si512(out + (lane + 1) * lane_stride, _mm512_srli_epi32(_mm512_castps_si512(odd), 16));
    }
  }
}

// Row `row` (or zeros where row < 0), storage positions [c0, c0 + kSegment
// * segments), into its place in a 16-row tile's panel: for each lane and
// segment, 16 words at tile + (lane * segments + segment) * 256 +
// row_in_tile * 16.
DSV4_AMX void decode_row_to_amx_panel(const Linear& w, int64_t row, int64_t c0, int64_t segments, uint32_t* tile,
                                      int row_in_tile) {
  for (int64_t segment = 0; segment < segments; ++segment) {
    uint32_t* first_lane = tile + segment * 256 + row_in_tile * 16;
    const int64_t lane_stride = segments * 256;
    if (row >= 0 && w.format == WeightFormat::FP8_BLOCK128) {
      const int64_t p0 = c0 + segment * kSegment;
      const uint8_t* scales = w.scale + (row / 128) * w.scale_cols + p0 / 128;
      if (scales[0] <= kMaxHalfPathScale && scales[1] <= kMaxHalfPathScale) {
        const __m512 scale256 = _mm512_insertf32x8(_mm512_set1_ps(e8m0_to_float(scales[0]) * 256.0f),
                                                   _mm256_set1_ps(e8m0_to_float(scales[1]) * 256.0f), 1);
        fp8_segment_words(w.data + row * w.cols + p0, scale256, first_lane, lane_stride);
        continue;
      }
    }
    __m512 steps[16];
    if (row >= 0) {
      decode_segment(w, row, c0 + segment * kSegment, steps);
      transpose16x16(steps);  // now steps[lane]: the lane's 16 steps
    } else {
      for (auto& zero : steps) zero = _mm512_setzero_ps();
    }
    for (int lane = 0; lane < 16; ++lane)
      _mm512_storeu_si512(first_lane + lane * lane_stride, _mm512_srli_epi32(_mm512_castps_si512(steps[lane]), 16));
  }
}

// The lanes of `Tiles` (1 or 2) 16-row tiles against `Groups` (1 or 2)
// token groups over a chunk of `segments` segments: the lane of row r of
// tile h and token n of group g goes to lanes[h * 16 * 16 * 32 + (lane *
// 16 + r) * 32 + g * 16 + n].
template <int Tiles, int Groups>
DSV4_AMX void amx_lane_chains(const uint32_t* const* tiles, const uint32_t* const* inputs, int64_t segments,
                              float* lanes) {
  for (int lane = 0; lane < 16; ++lane) {
    _tile_zero(0);
    if constexpr (Groups == 2) _tile_zero(1);
    if constexpr (Tiles == 2) _tile_zero(2);
    if constexpr (Tiles == 2 && Groups == 2) _tile_zero(3);
    for (int64_t segment = 0; segment < segments; ++segment) {
      const int64_t at = (lane * segments + segment) * 256;
      _tile_loadd(4, tiles[0] + at, 64);
      _tile_loadd(6, inputs[0] + at, 64);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (Groups == 2) {
        _tile_loadd(7, inputs[1] + at, 64);
        _tile_dpbf16ps(1, 4, 7);
      }
      if constexpr (Tiles == 2) {
        _tile_loadd(5, tiles[1] + at, 64);
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (Groups == 2) _tile_dpbf16ps(3, 5, 7);
      }
    }
    float* out = lanes + lane * 16 * kPanelRows;
    _tile_stored(0, out, kPanelRows * 4);
    if constexpr (Groups == 2) _tile_stored(1, out + 16, kPanelRows * 4);
    if constexpr (Tiles == 2) _tile_stored(2, out + 16 * 16 * kPanelRows, kPanelRows * 4);
    if constexpr (Tiles == 2 && Groups == 2) _tile_stored(3, out + 16 * 16 * kPanelRows + 16, kPanelRows * 4);
  }
}

}  // namespace

namespace {
std::atomic<int64_t> amx_product_count{0};
}  // namespace

int64_t amx_products() { return amx_product_count.load(std::memory_order_relaxed); }

DSV4_AMX void pack_group_amx(const float* xs, int64_t n, int64_t cols, int64_t first, float* xp) {
  uint32_t* group = reinterpret_cast<uint32_t*>(xp) + first * cols;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t segments = (std::min(cols, c0 + kChunk) - c0) / kSegment;
    uint32_t* chunk = group + kAmxTokens * c0;
    for (int64_t segment = 0; segment < segments; ++segment)
      for (int step = 0; step < 16; ++step) {
        __m512 values[16];  // values[token]: the token's 16 lanes of this step
        for (int token = 0; token < 16; ++token)
          values[token] = first + token < n
                              ? _mm512_loadu_ps(xs + (first + token) * cols + c0 + (segment * 16 + step) * 16)
                              : _mm512_setzero_ps();
        transpose16x16(values);  // now values[lane]: the lane's step for the 16 tokens
        for (int lane = 0; lane < 16; ++lane)
          _mm512_storeu_si512(chunk + (lane * segments + segment) * 256 + step * 16,
                              _mm512_srli_epi32(_mm512_castps_si512(values[lane]), 16));
      }
  }
}

// Tasks as the dot form's (gemm_driver.h): kRowBlock rows x token blocks;
// for each chunk the task's rows are decoded once into the panel, then
// every pair of token groups meets every pair of row tiles.
DSV4_AMX void packed_gemm_amx(const Linear& w, int64_t row_begin, int64_t out, const float* xp, int64_t n, float* y,
                              int64_t y_stride, int threads) {
  const int64_t cols = w.cols;
  const PackedTasks tasks = packed_tasks(out, n, threads, kAmxTokens, 16);
  const int64_t token_block = tasks.token_block;
  const auto* words = reinterpret_cast<const uint32_t*>(xp);
  amx_product_count.fetch_add(1, std::memory_order_relaxed);
#pragma omp parallel num_threads(threads)
  {
    configure_tiles();
    auto* panel = reinterpret_cast<uint32_t*>(thread_scratch_array<float>(ScratchSlot::GemmPanel, kRowBlock * kChunk));
    float* lanes = thread_scratch_array<float>(ScratchSlot::GemmLanes, 2 * 16 * 16 * kPanelRows);
    double* sums = thread_scratch_array<double>(ScratchSlot::GemmSums, token_block * kRowBlock);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks.count(); ++task) {
      const int64_t t0 = tasks.first_token(task), r0 = tasks.first_row(task);
      const int64_t nt = std::min(token_block, n - t0), nr = std::min(tasks.row_block, out - r0);
      const int64_t row_tiles = (nr + 15) / 16, groups = (nt + kAmxTokens - 1) / kAmxTokens;
      std::fill_n(sums, row_tiles * 16 * token_block, 0.0);
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t c1 = std::min(cols, c0 + kChunk), segments = (c1 - c0) / kSegment;
        const NextPanel next = next_panel(tasks, out, cols, task, c1, (groups + 1) / 2);
        for (int64_t r = 0; r < row_tiles * 16; ++r)
          decode_row_to_amx_panel(w, r < nr ? row_begin + r0 + r : -1, c0, segments,
                                  panel + r / 16 * 16 * 16 * segments * 16, int(r % 16));
        for (int64_t group = 0; group < groups; group += 2) {
          prefetch_next_panel_part(w, row_begin, next, group / 2);
          const int group_pair = int(std::min<int64_t>(2, groups - group));
          const uint32_t* inputs[2];
          for (int u = 0; u < group_pair; ++u)
            inputs[u] = words + (t0 + (group + u) * kAmxTokens) * cols + kAmxTokens * c0;
          for (int64_t tile = 0; tile < row_tiles; tile += 2) {
            const int tile_pair = int(std::min<int64_t>(2, row_tiles - tile));
            const uint32_t* tiles[2];
            for (int v = 0; v < tile_pair; ++v) tiles[v] = panel + (tile + v) * 16 * 16 * segments * 16;
            if (tile_pair == 2 && group_pair == 2)
              amx_lane_chains<2, 2>(tiles, inputs, segments, lanes);
            else if (tile_pair == 2)
              amx_lane_chains<2, 1>(tiles, inputs, segments, lanes);
            else if (group_pair == 2)
              amx_lane_chains<1, 2>(tiles, inputs, segments, lanes);
            else
              amx_lane_chains<1, 1>(tiles, inputs, segments, lanes);
            // Tile v's lanes, (lane * 16 + row) * 32 + token, folded into
            // sums[row][token].
            for (int v = 0; v < tile_pair; ++v)
              fold_lanes_avx512(lanes + v * 16 * 16 * kPanelRows, 16,
                                sums + (tile + v) * 16 * token_block + group * kAmxTokens, token_block,
                                group_pair * kAmxTokens);
          }
        }
      }
      store_task_sums(sums, token_block, 1, nt, nr, y + t0 * y_stride + r0, y_stride);
    }
    _tile_release();
  }
}

}  // namespace dsv4::linear_detail
