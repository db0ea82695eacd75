#include "kernels/cpu/indexer_fp4.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/machine.h"
#include "core/numeric.h"
#include "kernels/cpu/avx512_common.h"

namespace dsv4::cpu {

namespace {

constexpr int64_t kBlock = 32;  // dims per FP4 scale block

// 2 v + 12 for each e2m1 code's value v (unsigned: VPDPBUSD's first operand).
struct KeyCodes {
  alignas(16) uint8_t code[16];
  KeyCodes() {
    for (int c = 0; c < 16; ++c) code[c] = uint8_t(int(2.0f * e2m1_to_float(uint8_t(c))) + 12);
  }
};
// Built on first use: the e2m1 table lives in another file, whose static
// initialisation need not come first.
const uint8_t* key_codes() {
  static const KeyCodes codes;
  return codes.code;
}

float key_half_scale(uint8_t scale) { return e8m0_to_float(scale) * 0.5f; }

// The definition, one key at a time (the scalar and AVX2 paths).
void scores_portable(const Fp4Query& q, const float* weights, const Fp4RowsView& keys, int64_t first, int64_t count,
                     float* scores) {
  const int64_t dim = q.dim, blocks = dim / kBlock;
  std::vector<int32_t> codes(static_cast<size_t>(dim));
  std::vector<float> half(static_cast<size_t>(blocks));
  const uint8_t* table = key_codes();
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* nibbles = keys.nibbles + (first + i) * (dim / 2);
    const uint8_t* scales = keys.scales + (first + i) * blocks;
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t j = 0; j < kBlock / 2; ++j) {
        const uint8_t byte = nibbles[b * kBlock / 2 + j];
        codes[size_t(b * kBlock + j)] = int32_t(table[byte & 15]) - 12;
        codes[size_t(b * kBlock + kBlock / 2 + j)] = int32_t(table[byte >> 4]) - 12;
      }
      half[size_t(b)] = key_half_scale(scales[b]);
    }
    float score = 0.0f;
    for (int64_t h = 0; h < q.heads; ++h) {
      const int8_t* qc = q.codes.data() + h * dim;
      float dot = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;
        for (int64_t j = b * kBlock; j < (b + 1) * kBlock; ++j) sum += int32_t(qc[j]) * codes[size_t(j)];
        dot += (float(sum) * q.half_scale[size_t(b * q.heads + h)]) * half[size_t(b)];
      }
      score += std::max(dot, 0.0f) * weights[h];
    }
    scores[i] = score;
  }
}

#define DSV4_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// The codes of 16 keys in VPDPBUSD's layout ([dword group][key]: row g
// holds dims [4g, 4g + 4) of all 16 keys, a dword each) and their blocks'
// half scales ([block][key]).
struct KeyTile {
  alignas(64) int32_t codes[128][16];
  alignas(64) float half[16][16];
  alignas(64) float low[16];  // each key's smallest half scale (the one-sum form's tiles)
};

// Dword group g (dims [4g, 4g + 4)) of T tiles against HN heads' query
// words (`words`: the group's words from the first head on): acc[t][h] +=
// the four products per key.
template <int T, int HN>
DSV4_TARGET_VNNI __attribute__((always_inline)) inline void add_dword_group(const KeyTile* tiles, int64_t g,
                                                                            const int32_t* words, __m512i (*acc)[HN]) {
  __m512i k[T];
  for (int t = 0; t < T; ++t) k[t] = _mm512_load_si512(tiles[t].codes[g]);
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h) {
    const __m512i word = _mm512_set1_epi32(words[h]);
    for (int t = 0; t < T; ++t) acc[t][h] = _mm512_dpbusd_epi32(acc[t][h], k[t], word);
  }
}

// Heads [h0, h0 + HN) against T tiles of 16 keys, added to score[t] in
// head order. Each broadcast query word feeds T VPDPBUSD, each key load
// HN. HN and the eight dword groups of a block are constants, so that the
// accumulators stay in registers and each VPDPBUSD takes the query's word
// as a broadcast (with a run-time trip count GCC kept register copies of
// every accumulator and spilled one: half the speed). Two tiles against
// four heads scored 262,144 keys 7% faster than one tile against eight on
// AMD Zen 5 (fewer loads per VPDPBUSD: docs/long_context.md, "Two key
// tiles at a time, and one FMA per block"); two against two heads were 35%
// slower.
template <int T, int HN, bool kFused>
DSV4_TARGET_VNNI inline void add_head_group(const Fp4Query& q, const float* weights, int64_t h0, const KeyTile* tiles,
                                            __m512* score) {
  constexpr int kGroups = kBlock / 4;  // dword groups per 32-dim block
  const int64_t blocks = q.dim / kBlock, heads = q.heads;
  const __m512 zero = _mm512_setzero_ps();
  __m512 dot[T][HN];
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h)
    for (int t = 0; t < T; ++t) dot[t][h] = zero;
  for (int64_t b = 0; b < blocks; ++b) {
    const int32_t* offset = q.offset.data() + b * heads + h0;
    __m512i acc[T][HN];
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h)
      for (int t = 0; t < T; ++t) acc[t][h] = _mm512_set1_epi32(offset[h]);
#pragma GCC unroll 8
    for (int g = 0; g < kGroups; ++g)
      add_dword_group<T, HN>(tiles, b * kGroups + g, q.words_by_group.data() + (b * kGroups + g) * heads + h0, acc);
    __m512 kh[T];
    for (int t = 0; t < T; ++t) kh[t] = _mm512_load_ps(tiles[t].half[b]);
    const float* half_scale = q.half_scale.data() + b * heads + h0;
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) {
      const __m512 qh = _mm512_set1_ps(half_scale[h]);
      for (int t = 0; t < T; ++t) {
        const __m512 sum = _mm512_cvtepi32_ps(acc[t][h]);
        dot[t][h] = kFused ? _mm512_fmadd_ps(sum, _mm512_mul_ps(qh, kh[t]), dot[t][h])
                           : _mm512_add_ps(dot[t][h], _mm512_mul_ps(_mm512_mul_ps(sum, qh), kh[t]));
      }
    }
  }
  // max(0, d) keeps d when d is NaN or -0, as std::max(d, 0.0f) does.
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h) {
    const __m512 w = _mm512_set1_ps(weights[h0 + h]);
    for (int t = 0; t < T; ++t) score[t] = _mm512_add_ps(score[t], _mm512_mul_ps(_mm512_max_ps(zero, dot[t][h]), w));
  }
}

// T tiles against every head, in head order: groups of HN, then one at a
// time.
template <int T, int HN, bool kFused>
DSV4_TARGET_VNNI void add_heads(const Fp4Query& q, const float* weights, const KeyTile* tiles, __m512* score) {
  int64_t h0 = 0;
  for (; h0 + HN <= q.heads; h0 += HN) add_head_group<T, HN, kFused>(q, weights, h0, tiles, score);
  for (; h0 < q.heads; ++h0) add_head_group<T, 1, kFused>(q, weights, h0, tiles, score);
}

// Whether every block term of the tiles' scores, sum * q_half * k_half
// (sum an integer below 2^16 in magnitude, both halves powers of two), is
// exact in fp32 however it is grouped: true where the query's half scales
// are normal floats below 2^111 and each key half scale times the smallest
// and the largest of them stays in [2^-126, 2^111). Then the definition's
// dot + (sum * q_half) * k_half (two exact products, one rounded sum) is
// one fused multiply-add of sum by (q_half * k_half), also exact: a
// conversion, a multiplication and an FMA per block and head instead of a
// conversion, two multiplications and an addition (6% of the scoring on AMD
// Zen 5). NaN and subnormal scales keep the definition's operations.
//
// The one-sum form asks the products to stay below 2^100 instead (kOneSumCeiling):
// its sums of up to 2^21 times the smallest product then stay finite, so no
// partial sum of the definition can overflow where the one sum does not.
constexpr float kFusedCeiling = 0x1p111f, kOneSumCeiling = 0x1p100f;

template <int T>
DSV4_TARGET_VNNI bool terms_exact(const Fp4Query& q, const KeyTile* tiles, int64_t blocks, float top = kFusedCeiling) {
  if (!(q.half_scale_min >= 0x1p-126f && q.half_scale_max < top)) return false;
  const __m512 low = _mm512_set1_ps(q.half_scale_min), high = _mm512_set1_ps(q.half_scale_max);
  const __m512 floor = _mm512_set1_ps(0x1p-126f), ceiling = _mm512_set1_ps(top);
  __mmask16 ok = 0xffff;
  for (int t = 0; t < T; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      const __m512 kh = _mm512_load_ps(tiles[t].half[b]);
      ok &= _mm512_cmp_ps_mask(_mm512_mul_ps(low, kh), floor, _CMP_GE_OQ) &
            _mm512_cmp_ps_mask(_mm512_mul_ps(high, kh), ceiling, _CMP_LT_OQ);
    }
  return ok == 0xffff;
}

template <int T, int HN>
DSV4_TARGET_VNNI void score_tiles(const Fp4Query& q, const float* weights, const KeyTile* tiles, __m512* score) {
  if (terms_exact<T>(q, tiles, q.dim / kBlock))
    add_heads<T, HN, true>(q, weights, tiles, score);
  else
    add_heads<T, HN, false>(q, weights, tiles, score);
}

// The codes of 16 keys (from `key`; past the end, copies of the last) into
// `tile` ([dword group][key]: register g holds dims [4g, 4g + 4) of all 16
// keys, a dword each) and their blocks' half scales into `half`
// ([block][key]). Any width up to 512: each key's blocks through a row
// buffer, 128 bits at a time.
DSV4_TARGET_VNNI void keys_to_tile(const Fp4RowsView& keys, int64_t dim, int64_t key, int64_t n, int32_t (*tile)[16],
                                   float (*half)[16]) {
  const int64_t blocks = dim / kBlock, groups = dim / 4;
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key_codes()));
  const __m128i low = _mm_set1_epi8(0x0f);
  alignas(64) uint8_t rows[16][512];  // key codes, [key][dim]
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t k = key + std::min(i, n - 1);
    const uint8_t* nibbles = keys.nibbles + k * (dim / 2);
    for (int64_t b = 0; b < blocks; ++b) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles + b * kBlock / 2));
      _mm_store_si128(reinterpret_cast<__m128i*>(&rows[i][b * kBlock]),
                      _mm_shuffle_epi8(lut, _mm_and_si128(bytes, low)));
      _mm_store_si128(reinterpret_cast<__m128i*>(&rows[i][b * kBlock + 16]),
                      _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bytes, 4), low)));
      half[b][i] = key_half_scale(keys.scales[k * blocks + b]);
    }
  }
  for (int64_t g0 = 0; g0 < groups; g0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(reinterpret_cast<const float*>(&rows[i][g0 * 4]));
    linear_detail::transpose16x16(r);
    for (int g = 0; g < 16; ++g) _mm512_store_ps(reinterpret_cast<float*>(tile[g0 + g]), r[g]);
  }
}

// The scale bytes of the 16 keys from `key` (past the end, the last key's
// again), four to a dword: `keys.scales` itself where all 16 are there,
// else copied into `partial` (64 bytes). 128-dim keys.
const uint8_t* tile_scale_bytes(const Fp4RowsView& keys, int64_t key, int64_t n, uint8_t* partial) {
  constexpr int64_t kBlocks = 128 / kBlock;
  if (n >= 16) return keys.scales + key * kBlocks;
  for (int64_t i = 0; i < 16; ++i) std::memcpy(partial + 4 * i, keys.scales + (key + std::min(i, n - 1)) * kBlocks, 4);
  return partial;
}

// The 16 keys' half scales of each of the four blocks into half[b], from
// their scale bytes (a dword per key): key_half_scale's values, byte x is
// 2^(x - 128), exact down to the subnormal 2^-128, and NaN for 255. Returns
// each key's smallest (where a scale is NaN, terms_exact fails anyway).
DSV4_TARGET_VNNI __m512 tile_half_scales(__m512i scale_bytes, float (*half)[16]) {
  const __m512i byte = _mm512_set1_epi32(0xff), nan_code = _mm512_set1_epi32(255);
  const __m512 one = _mm512_set1_ps(1.0f), nan = _mm512_set1_ps(NAN);
  __m512 smallest = _mm512_set1_ps(INFINITY);
  for (int b = 0; b < 4; ++b) {
    const __m512i x = _mm512_and_si512(_mm512_srli_epi32(scale_bytes, 8 * b), byte);
    __m512 h = _mm512_scalef_ps(one, _mm512_cvtepi32_ps(_mm512_sub_epi32(x, _mm512_set1_epi32(128))));
    h = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(x, nan_code), h, nan);
    _mm512_store_ps(half[b], h);
    smallest = _mm512_min_ps(smallest, h);
  }
  return smallest;
}

// A 128-dim tile's codes from each key's 16 registers of even (low-nibble)
// and odd dims: transposed, dword 4b + j of `even` is tile row 8b + j and
// of `odd` row 8b + 4 + j.
DSV4_TARGET_VNNI void store_tile_codes(__m512 even[16], __m512 odd[16], int32_t (*tile)[16]) {
  linear_detail::transpose16x16(even);
  linear_detail::transpose16x16(odd);
  for (int b = 0; b < 4; ++b)
    for (int j = 0; j < 4; ++j) {
      _mm512_store_ps(reinterpret_cast<float*>(tile[8 * b + j]), even[4 * b + j]);
      _mm512_store_ps(reinterpret_cast<float*>(tile[8 * b + 4 + j]), odd[4 * b + j]);
    }
}

// The same tile for 128-dim keys (V4's): a key's 64 bytes in one register,
// the low nibbles of its four blocks (their even dims) and the high nibbles
// (odd dims) turned into codes by one 512-bit PSHUFB each, and both sets
// transposed from registers. Dword 4b + j of `even` is dword 8b + j of
// keys_to_tile's row and dword 4b + j of `odd` its dword 8b + 4 + j, so the
// tile is the same; keys_to_tile's 128-bit steps and row buffer took 6% more
// of the scoring time (docs/long_context.md, "Runs of key tiles, the
// scores' buffer and the top-k").
DSV4_TARGET_VNNI void keys_to_tile_128(const Fp4RowsView& keys, int64_t key, int64_t n, int32_t (*tile)[16],
                                       float (*half)[16]) {
  const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(key_codes())));
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 even[16], odd[16];
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t k = key + std::min(i, n - 1);
    const __m512i bytes = _mm512_loadu_si512(keys.nibbles + k * 64);
    even[i] = _mm512_castsi512_ps(_mm512_shuffle_epi8(lut, _mm512_and_si512(bytes, low)));
    odd[i] = _mm512_castsi512_ps(_mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low)));
  }
  alignas(64) uint8_t partial[64];
  tile_half_scales(_mm512_loadu_si512(tile_scale_bytes(keys, key, n, partial)), half);
  store_tile_codes(even, odd, tile);
}

// Heads [h0, h0 + HN) against T tiles in the one-sum form (keys_to_tile_scaled):
// each head's blocks go into one integer per key, so the fp32 part is one
// conversion and one multiplication per head instead of one per block.
// Where terms_exact holds with the one-sum ceiling, every partial sum of the
// definition is an integer below 2^21 times the head's and the key's
// smallest half scales, exact in fp32: the definition's dot is that product,
// float(sum) * (q_low * k_low), both exact (docs/long_context.md, "One
// integer sum across the blocks").
template <int T, int HN>
DSV4_TARGET_VNNI inline void add_head_group_one_sum(const Fp4Query& q, const float* weights, int64_t h0,
                                                    const KeyTile* tiles, __m512* score) {
  const int64_t groups = q.dim / 4, heads = q.heads;
  const __m512 zero = _mm512_setzero_ps();
  // Two chains per sum (even and odd dword groups), added at the end: an
  // integer sum in any order is the same, and one chain of 32 VPDPBUSD per
  // accumulator is bound by their latency.
  __m512i acc[2][T][HN];
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h)
    for (int t = 0; t < T; ++t) {
      acc[0][t][h] = _mm512_set1_epi32(q.scaled_offset[size_t(h0 + h)]);
      acc[1][t][h] = _mm512_setzero_si512();
    }
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j)
      add_dword_group<T, HN>(tiles, g0 + j, q.scaled_words.data() + (g0 + j) * heads + h0, acc[j % 2]);
  }
  __m512 low[T];
  for (int t = 0; t < T; ++t) low[t] = _mm512_load_ps(tiles[t].low);
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h) {
    const __m512 q_low = _mm512_set1_ps(q.head_half_scale[size_t(h0 + h)]);
    const __m512 w = _mm512_set1_ps(weights[h0 + h]);
    for (int t = 0; t < T; ++t) {
      const __m512i sum = _mm512_add_epi32(acc[0][t][h], acc[1][t][h]);
      const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(q_low, low[t]));
      score[t] = _mm512_add_ps(score[t], _mm512_mul_ps(_mm512_max_ps(zero, dot), w));
    }
  }
}

template <int T, int HN>
DSV4_TARGET_VNNI void add_heads_one_sum(const Fp4Query& q, const float* weights, const KeyTile* tiles, __m512* score) {
  int64_t h0 = 0;
  for (; h0 + HN <= q.heads; h0 += HN) add_head_group_one_sum<T, HN>(q, weights, h0, tiles, score);
  for (; h0 < q.heads; ++h0) add_head_group_one_sum<T, 1>(q, weights, h0, tiles, score);
}

// Each key's code table by its blocks' exponents above its smallest:
// table d (bytes [16 d, 16 d + 16)) holds 2 v * 2^d + kScaledKeyBias for
// each e2m1 code's value v.
struct ScaledKeyCodes {
  alignas(64) uint8_t code[64];
  ScaledKeyCodes() {
    for (int d = 0; d < 4; ++d)
      for (int c = 0; c < 16; ++c)
        code[16 * d + c] = uint8_t(int(2.0f * e2m1_to_float(uint8_t(c))) * (1 << d) + kScaledKeyBias);
  }
};
const uint8_t* scaled_key_codes() {
  static const ScaledKeyCodes codes;
  return codes.code;
}

// keys_to_tile_128's tile in the one-sum form: each block's codes times
// 2^(its exponent - the key's smallest), biased by kScaledKeyBias, and each
// key's smallest half scale in `tile.low`; false (the tile unusable) where a
// key's block exponents lie more than 3 apart (a scaled code would leave
// the unsigned byte). The half scales per block are kept for terms_exact.
DSV4_TARGET_VNNI bool keys_to_tile_scaled(const Fp4RowsView& keys, int64_t key, int64_t n, KeyTile& tile) {
  // The 16 keys' four scale bytes, a dword per key (past the end, the last
  // key's again); each byte's exponent above its key's smallest, from byte
  // rotations within the dwords (no branches: the scales are data).
  alignas(64) uint8_t partial[64];
  const __m512i bytes_of_scales = _mm512_loadu_si512(tile_scale_bytes(keys, key, n, partial));
  __m512i low = _mm512_min_epu8(bytes_of_scales, _mm512_rol_epi32(bytes_of_scales, 8));
  low = _mm512_min_epu8(low, _mm512_rol_epi32(low, 16));
  __m512i high = _mm512_max_epu8(bytes_of_scales, _mm512_rol_epi32(bytes_of_scales, 8));
  high = _mm512_max_epu8(high, _mm512_rol_epi32(high, 16));
  if (_mm512_cmpgt_epu8_mask(_mm512_sub_epi8(high, low), _mm512_set1_epi8(3))) return false;
  alignas(64) uint32_t above[16];
  _mm512_store_si512(above, _mm512_sub_epi8(bytes_of_scales, low));
  const __m512i tables = _mm512_load_si512(scaled_key_codes());
  const __m512i low_bits = _mm512_set1_epi8(0x0f), pair = _mm512_setr_epi64(0, 1, 0, 1, 0, 1, 0, 1);
  __m512 even[16], odd[16];
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t k = key + std::min(i, n - 1);
    // 128-bit lane b (block b) takes table d_b: qword indices 2 d_b, 2 d_b + 1.
    const __m128i d = _mm_cvtsi32_si128(int(above[i]));
    const __m512i index = _mm512_cvtepu8_epi64(_mm_unpacklo_epi8(d, d));
    const __m512i table = _mm512_permutexvar_epi64(_mm512_add_epi64(_mm512_add_epi64(index, index), pair), tables);
    const __m512i bytes = _mm512_loadu_si512(keys.nibbles + k * 64);
    even[i] = _mm512_castsi512_ps(_mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_bits)));
    odd[i] = _mm512_castsi512_ps(_mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_bits)));
  }
  _mm512_store_ps(tile.low, tile_half_scales(bytes_of_scales, tile.half));
  store_tile_codes(even, odd, tile.codes);
  return true;
}

// 16 keys per register lane by lane: VPDPBUSD adds four products per lane
// (a key's dims [4g, 4g + 4) in tile row g) against the query's four codes
// of those dims, broadcast. 32 keys at a time, the last 16 or fewer alone.
DSV4_TARGET_VNNI void scores_vnni(const Fp4Query& q, const float* weights, const Fp4RowsView& keys, int64_t first,
                                  int64_t count, float* scores) {
  const int64_t dim = q.dim;
  KeyTile tiles[2];
  auto build = [&](KeyTile& tile, int64_t key, int64_t n) {
    if (dim == 128 && keys.block == kBlock)
      keys_to_tile_128(keys, key, n, tile.codes, tile.half);
    else
      keys_to_tile(keys, dim, key, n, tile.codes, tile.half);
  };
  // The one-sum form where the query and both tiles allow it, else the
  // tiles are built again in the per-block form.
  const bool one_sum = q.one_sum && dim == 128 && keys.block == kBlock;
  auto one_sum_tiles = [&](int t, int64_t key, int64_t n) {
    if (!one_sum) return false;
    for (int i = 0; i < t; ++i)
      if (!keys_to_tile_scaled(keys, key + 16 * i, i + 1 < t ? 16 : n, tiles[i])) return false;
    return true;
  };
  for (int64_t k0 = 0; k0 < count;) {
    __m512 score[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    if (count - k0 > 16) {
      const int64_t n = std::min<int64_t>(16, count - k0 - 16);
      if (one_sum_tiles(2, first + k0, n) && terms_exact<2>(q, tiles, 128 / kBlock, kOneSumCeiling)) {
        add_heads_one_sum<2, 4>(q, weights, tiles, score);
      } else {
        build(tiles[0], first + k0, 16);
        build(tiles[1], first + k0 + 16, n);
        score_tiles<2, 4>(q, weights, tiles, score);
      }
      _mm512_storeu_ps(scores + k0, score[0]);
      alignas(64) float out[16];
      _mm512_store_ps(out, score[1]);
      std::copy_n(out, n, scores + k0 + 16);
      k0 += 16 + n;
    } else {
      const int64_t n = count - k0;
      if (one_sum_tiles(1, first + k0, n) && terms_exact<1>(q, tiles, 128 / kBlock, kOneSumCeiling)) {
        add_heads_one_sum<1, 8>(q, weights, tiles, score);
      } else {
        build(tiles[0], first + k0, n);
        score_tiles<1, 8>(q, weights, tiles, score);
      }
      alignas(64) float out[16];
      _mm512_store_ps(out, score[0]);
      std::copy_n(out, n, scores + k0);
      k0 += n;
    }
  }
}

}  // namespace

namespace {

// The exponent e of the block's scale 2^e, the power of two at or above
// amax / 6 (what FP4 rounding used, or a smaller one where the block's
// largest value is below 6 units); false where 2 / scale or scale / 2
// would not be a float.
bool block_exponent(float amax, int& exponent) {
  exponent = 0;
  if (amax > 0.0f) {
    const float m = std::frexp(amax / 6.0f, &exponent);  // amax / 6 = m * 2^exponent, m in [0.5, 1)
    if (m == 0.5f) --exponent;
  }
  return exponent - 1 >= -149 && 1 - exponent <= 127;
}

// One 32-block: its codes (2 x / scale, dims in the keys' storage order:
// even dims first, then odd ones), the sum of the codes and the exponent;
// false where the block is not on the grid.
bool quantize_block(const float* x, int8_t* codes, int32_t& sum, int& exponent) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kBlock; ++j) {
    if (!std::isfinite(x[j])) return false;
    amax = std::max(amax, std::fabs(x[j]));
  }
  if (!block_exponent(amax, exponent)) return false;
  const float to_code = std::ldexp(1.0f, 1 - exponent);  // 2 / scale
  sum = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    // Exact where t is a nonzero code (at most 127 in magnitude): scaling
    // by a power of two does not round a normal result. A zero t must
    // come from a zero x (not from a product that underflowed).
    const float t = x[j] * to_code;
    if (!(std::fabs(t) <= 127.0f) || float(int32_t(t)) != t || (t == 0.0f && x[j] != 0.0f)) return false;
    codes[j % 2 ? kBlock / 2 + j / 2 : j / 2] = int8_t(t);
    sum += int32_t(t);
  }
  return true;
}

// The same 32 values as two registers: the same maximum (exact in any
// order), exponent, products and checks, so the same codes and answer.
DSV4_TARGET_AVX512 bool quantize_block_avx512(const float* x, int8_t* codes, int32_t& sum, int& exponent) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  constexpr int kNanOrInf = 0x01 | 0x08 | 0x10 | 0x80;  // QNaN, +inf, -inf, SNaN
  if (_mm512_fpclass_ps_mask(a, kNanOrInf) | _mm512_fpclass_ps_mask(b, kNanOrInf)) return false;
  const __m512 abs_a = _mm512_abs_ps(a), abs_b = _mm512_abs_ps(b);
  if (!block_exponent(_mm512_reduce_max_ps(_mm512_max_ps(abs_a, abs_b)), exponent)) return false;
  const __m512 to_code = _mm512_set1_ps(std::ldexp(1.0f, 1 - exponent));
  const __m512 ta = _mm512_mul_ps(a, to_code), tb = _mm512_mul_ps(b, to_code), zero = _mm512_setzero_ps();
  const __m512 limit = _mm512_set1_ps(127.0f);
  auto off_grid = [&](__m512 t, __m512 v) DSV4_TARGET_AVX512 {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(t), limit, _CMP_NLE_UQ) |
           _mm512_cmp_ps_mask(_mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), t, _CMP_NEQ_UQ) |
           (_mm512_cmp_ps_mask(t, zero, _CMP_EQ_OQ) & _mm512_cmp_ps_mask(v, zero, _CMP_NEQ_UQ));
  };
  if (off_grid(ta, a) | off_grid(tb, b)) return false;
  const __m512i ia = _mm512_cvttps_epi32(ta), ib = _mm512_cvttps_epi32(tb);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(ia, even, ib)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + kBlock / 2),
                   _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(ia, odd, ib)));
  sum = _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib));
  return true;
}

// The one-sum form of a query whose codes and half scales are set: each
// head's block codes shifted left by the block's exponent above the head's
// smallest, where every shifted code fits in [-127, 127] (one_sum false
// otherwise; the other fields are then left empty).
void scaled_query(Fp4Query& q) {
  const int64_t heads = q.heads, dim = q.dim, blocks = dim / kBlock;
  q.one_sum = false;
  q.scaled_words.clear();
  q.scaled_offset.clear();
  q.head_half_scale.clear();
  std::vector<int8_t> scaled(static_cast<size_t>(heads * dim));
  std::vector<int32_t> offset(static_cast<size_t>(heads));
  std::vector<float> head_half(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    float low = q.half_scale[size_t(h)];
    for (int64_t b = 1; b < blocks; ++b) low = std::min(low, q.half_scale[size_t(b * heads + h)]);
    int32_t sum = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      // Both half scales are powers of two: their ratio is exact.
      const float ratio = q.half_scale[size_t(b * heads + h)] / low;
      if (!(ratio <= 64.0f)) return;
      const int32_t factor = int32_t(ratio);
      for (int64_t j = 0; j < kBlock; ++j) {
        const int32_t code = int32_t(q.codes[size_t(h * dim + b * kBlock + j)]) * factor;
        if (code < -127 || code > 127) return;
        scaled[size_t(h * dim + b * kBlock + j)] = int8_t(code);
        sum += code;
      }
    }
    offset[size_t(h)] = -kScaledKeyBias * sum;
    head_half[size_t(h)] = low;
  }
  q.scaled_words.assign(size_t(dim / 4 * heads), 0);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t g = 0; g < dim / 4; ++g)
      std::memcpy(&q.scaled_words[size_t(g * heads + h)], scaled.data() + h * dim + g * 4, 4);
  q.scaled_offset = std::move(offset);
  q.head_half_scale = std::move(head_half);
  q.one_sum = true;
}

}  // namespace

bool fp4_query(const float* q, int64_t heads, int64_t dim, Fp4Query& out, KernelIsa isa) {
  if (dim % kBlock != 0 || dim > 512) return false;
  const int64_t blocks = dim / kBlock;
  out.heads = heads;
  out.dim = dim;
  out.codes.assign(size_t(heads * dim), 0);
  out.half_scale.assign(size_t(heads * blocks), 0.0f);
  out.offset.assign(size_t(heads * blocks), 0);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* x = q + h * dim + b * kBlock;
      int8_t* codes = out.codes.data() + h * dim + b * kBlock;
      int32_t sum = 0;
      int exponent = 0;
      if (!(isa == KernelIsa::Avx512 ? quantize_block_avx512(x, codes, sum, exponent)
                                     : quantize_block(x, codes, sum, exponent)))
        return false;
      out.half_scale[size_t(b * heads + h)] = std::ldexp(1.0f, exponent - 1);
      out.offset[size_t(b * heads + h)] = -12 * sum;
    }
  const auto [low, high] = std::minmax_element(out.half_scale.begin(), out.half_scale.end());
  out.half_scale_min = low == out.half_scale.end() ? 0.0f : *low;
  out.half_scale_max = high == out.half_scale.end() ? 0.0f : *high;
  const int64_t words = dim / 4;
  out.words_by_group.assign(size_t(words * heads), 0);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t g = 0; g < words; ++g)
      std::memcpy(&out.words_by_group[size_t(g * heads + h)], out.codes.data() + h * dim + g * 4, 4);
  scaled_query(out);
  return true;
}

bool fp4_scores_use_vnni(KernelIsa isa) {
  static const bool vnni = detect_cpu_features().avx512_vnni;
  return isa == KernelIsa::Avx512 && vnni;
}

void fp4_scores(KernelIsa isa, const Fp4Query& q, const float* weights, const Fp4RowsView& keys, int64_t first,
                int64_t count, float* scores) {
  if (fp4_scores_use_vnni(isa)) return scores_vnni(q, weights, keys, first, count, scores);
  scores_portable(q, weights, keys, first, count, scores);
}

}  // namespace dsv4::cpu
