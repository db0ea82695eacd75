// The weight-format products on the CPU: the scalar reference path, the
// preparation of the inputs, and the choice, per call, of the kernel that
// runs a product (the AVX2 and AVX-512 kernels are in linear_avx2.cpp,
// linear_avx512.cpp and linear_avx512_rows.cpp; the design is in
// docs/kernels.md).
#include "kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/numeric.h"
#include "core/scratch.h"
#include "core/threads.h"
#include "kernels/cpu/gemm_driver.h"
#include "kernels/cpu/linear_internal.h"

namespace dsv4 {

namespace linear_detail {

namespace {

// ---------------------------------------------------------------- scalar ---

double dot_scalar(const Linear& w, int64_t row, const float* x) {
  double sum = 0.0;
  float wv[16];
  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunk) {
    const int64_t c1 = std::min(w.cols, c0 + kChunk);
    float acc[16] = {};
    for (int64_t s0 = c0; s0 < c1; s0 += kSegment) {
      float segment[16] = {};
      for (int64_t i = s0; i < std::min(c1, s0 + kSegment); i += 16) {
        decode16_storage(w, row, i, wv);
        for (int l = 0; l < 16; ++l) segment[l] = std::fma(wv[l], x[i + l], segment[l]);
      }
      for (int l = 0; l < 16; ++l) acc[l] += segment[l];
    }
    sum += fold16(acc);
  }
  return sum;
}

}  // namespace

// The FP8 scale bytes s for which the inputs xs[0 .. count) times
// 2^(s - 119) (the block scale times the 256 of the fp16 decoding) are all
// exact (see prescalable_scale_range). Inputs rounded through FP8 span a
// few dozen binades, so every realistic scale qualifies.
std::pair<int, int> prescalable_scales(const float* xs, int64_t count) {
  int min_field = 255, max_field = 0;  // exponent fields of the nonzero |x|
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, xs + i, 4);
    const int field = int(bits >> 23 & 0xff);
    if ((bits & 0x7fffffffu) == 0) continue;
    min_field = std::min(min_field, field);
    max_field = std::max(max_field, field);
  }
  return prescalable_scale_range(min_field, max_field);
}

}  // namespace linear_detail

using namespace linear_detail;

namespace {

// ------------------------------------------------------------- dispatch ---

using DotFn = double (*)(const Linear&, int64_t, const float*);

DotFn dot_for(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return dot_avx512;
    case KernelIsa::Avx2: return dot_avx2;
    default: return dot_scalar;
  }
}

void check_width(const Linear& w) {
  if (w.cols % 16) throw Error("linear input width " + std::to_string(w.cols) + " is not a multiple of 16");
  if (w.format == WeightFormat::FP4_BLOCK32 && w.cols % 32)
    throw Error("FP4 weight width " + std::to_string(w.cols) + " is not a multiple of its 32-column scale blocks");
}

}  // namespace

double linear_dot(const Linear& w, int64_t row, const float* x, KernelIsa isa) {
  check_width(w);
  AlignedVector<float> xs(static_cast<size_t>(w.cols));
  to_storage_order(w, x, xs.data());
  return dot_for(isa)(w, row, xs.data());
}

void linear_decode_row(const Linear& w, int64_t row, float* out) {
  float tmp[16];
  for (int64_t i = 0; i < w.cols; i += 16) {
    decode16(w, row, i, tmp);
    std::copy_n(tmp, std::min<int64_t>(16, w.cols - i), out + i);
  }
}

double linear_dot_reference(const Linear& w, int64_t row, const float* x) {
  std::vector<float> wr(static_cast<size_t>(w.cols));
  linear_decode_row(w, row, wr.data());
  long double sum = 0.0L;
  for (int64_t i = 0; i < w.cols; ++i) sum += (long double)wr[size_t(i)] * (long double)x[i];
  return double(sum);
}

namespace {

// How the prepared inputs are laid out: rows of the storage order (the
// register path) or packed for a form of the packed GEMM, with fp32 or
// bf16-pair (linear_bf16.cpp) kernels.
enum class Packing { Rows, Dot, Outer, DotBf16, OuterBf16, AmxRows };

// Token t's inputs in storage order (rounded through FP8 if asked: the round
// trip works on 128- or 32-column blocks, which the FP4 storage order only
// permutes within), laid out as `packing` says. `row` is the thread's
// scratch row. With `pairs` (Rows only), the token's step-pair words also go
// to pairs + t * cols / 2 for the FP4 register path's VDPBF16PS kernel.
// Returns false where a bf16 packing or the pairs meet an input the bf16
// kernels cannot take (bf16_dot_inputs_qualify).
bool prepare_token(const Linear& w, const float* x, int64_t x_stride, int64_t n, int64_t t, Packing packing, float* row,
                   float* xs, uint32_t* pairs = nullptr) {
  const int64_t cols = w.cols;
  float* dst = packing == Packing::Rows || packing == Packing::AmxRows ? xs + t * cols : row;
  to_storage_order(w, x + t * x_stride, dst);
  if (w.quantize_input) fp8_round_trip(dst, cols, w.input_block);
  switch (packing) {
    case Packing::Rows:
      if (pairs) {
        if (!bf16_dot_inputs_qualify(dst, cols)) return false;
        if (w.format == WeightFormat::FP4_BLOCK32)
          fp4_pair_token_steps(dst, cols, pairs + t * (cols / 2));
        else
          pair_token_steps(dst, cols, pairs + t * (cols / 2));
      }
      break;
    case Packing::Dot: pack_token_dot(dst, cols, n, t, xs); break;
    case Packing::Outer: pack_token_outer(dst, cols, n, t, xs); break;
    case Packing::AmxRows: return bf16_dot_inputs_qualify(dst, cols);
    case Packing::DotBf16:
    case Packing::OuterBf16:
      if (!bf16_dot_inputs_qualify(dst, cols)) return false;
      if (packing == Packing::DotBf16)
        pack_token_dot_bf16(dst, cols, n, t, xs);
      else
        pack_token_outer_bf16(dst, cols, n, t, xs);
      break;
  }
  return true;
}

// All n tokens, on as many threads as the work is worth; false as above.
bool prepare_tokens(const Linear& w, const float* x, int64_t x_stride, int64_t n, Packing packing, float* xs,
                    uint32_t* pairs = nullptr) {
  int qualify = 1;
#pragma omp parallel num_threads(threads_for(n* w.cols * 16)) reduction(& : qualify)
  {
    float* row = thread_scratch_array<float>(ScratchSlot::LinearRow, w.cols);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) qualify &= int(prepare_token(w, x, x_stride, n, t, packing, row, xs, pairs));
  }
  return qualify != 0;
}

// Piece `id` of `pieces` of rows [row_begin, row_begin + out): an equal
// share of the rows, for FP8 with its ends moved to the nearest 128-row
// block boundary (see register_rows_avx512).
void register_rows_piece(const Linear& w, int64_t row_begin, int64_t out, const float* xs, int64_t n, float* y,
                         int64_t y_stride, int64_t id, int64_t pieces, const uint32_t* pairs) {
  auto bound = [&](int64_t k) {
    const int64_t b = out * k / pieces;
    if (w.format != WeightFormat::FP8_BLOCK128 || k == 0 || k == pieces) return b;
    return std::clamp<int64_t>((row_begin + b + 64) / 128 * 128 - row_begin, 0, out);
  };
  register_rows_avx512(w, row_begin, bound(id), bound(id + 1), xs, n, y, y_stride, pairs);
}

// How many pieces the register path cuts a matrix of `out` rows into for
// `threads` threads, which claim them one at a time: on a shared machine a
// thread that loses its core for a while leaves its later pieces to the
// other instead of holding it at the end of the product. Four per thread,
// more (up to sixteen) for long products, `macs` multiply-adds (weights x
// tokens), so that no piece is much over kPieceMacs: the 16-token LM head's
// pieces took 8 ms each, and the thread left waiting at its end cost
// 0-10% of the product (docs/kernels.md, "Pieces of long products").
// Pieces keep at least 64 rows (four streams of 16) once there are more
// than threads.
constexpr int64_t kRegisterPiecesPerThread = 4, kMaxRegisterPiecesPerThread = 16;
constexpr int64_t kPieceMacs = int64_t(1) << 26;
int64_t register_pieces(int64_t out, int64_t macs, int threads) {
  const int64_t per =
      std::clamp<int64_t>(macs / (threads * kPieceMacs), kRegisterPiecesPerThread, kMaxRegisterPiecesPerThread);
  return std::max<int64_t>(threads, std::min<int64_t>(out / 64, threads * per));
}

// Whether an AVX-512 register-path product of w with n tokens also prepares
// step-pair words for the kernels with VDPBF16PS: FP4 weights
// (linear_fp4_pairs.cpp, AVX512-VBMI), and FP8 ones (linear_fp8_pairs.cpp)
// with enough tokens for the eight-row kernel (32-column steps) or few
// enough for the four-row one (64-column steps, AVX512-VBMI); FP8-rounded
// inputs, on a CPU where the startup measurement turned the bf16 kernels on.
bool register_pairs_apply(KernelIsa isa, const Linear& w, int64_t n) {
  if (isa != KernelIsa::Avx512 || !w.quantize_input || !bf16_dot_enabled()) return false;
  if (w.format == WeightFormat::FP4_BLOCK32) return avx512_vbmi_enabled();
  if (w.format != WeightFormat::FP8_BLOCK128) return false;
  if (n >= kEightRowMinTokensFp8) return w.cols % 32 == 0;
  return n <= kFp8FourRowMaxTokens && w.cols % 64 == 0 && avx512_vbmi_enabled();
}

// Whether the product of rows [row_begin, row_end) of w with n tokens runs
// on AMX tiles (linear_amx.cpp), if its inputs qualify too.
bool amx_applies(KernelIsa isa, const Linear& w, int64_t n, int64_t row_begin, int64_t row_end) {
  return isa == KernelIsa::Avx512 && amx_enabled() && n >= kAmxMinTokens && row_end - row_begin >= kPackedMinRows &&
         w.cols % kSegment == 0 && bf16_dot_weights_qualify(w, row_begin, row_end);
}

}  // namespace

void linear_forward(KernelIsa isa, const Linear& w, const float* x, int64_t n, float* y, int64_t row_begin,
                    int64_t row_end, int64_t y_stride, int64_t x_stride) {
  if (row_end < 0) row_end = w.rows;
  const int64_t out = row_end - row_begin;
  if (y_stride < 0) y_stride = out;
  const int64_t cols = w.cols;
  if (x_stride < 0) x_stride = cols;
  check_width(w);
  const bool outer = n >= kOuterMinTokens;
  // AVX2 has the outer form only (its dot form is rows_tokens_avx2).
  const bool packed =
      n >= packed_min_tokens(w) && out >= kPackedMinRows &&
      ((isa == KernelIsa::Avx512 && n > register_groups_max_tokens(w)) || (isa == KernelIsa::Avx2 && outer));
  const bool pairs_apply = !packed && register_pairs_apply(isa, w, n);
  const bool amx = amx_applies(isa, w, n, row_begin, row_end);
  const int64_t amx_tokens = (n + kAmxTokens - 1) / kAmxTokens * kAmxTokens;
  // After the rows of inputs: the AMX kernel's packed groups, or the step
  // pairs of the register path's VDPBF16PS kernels.
  const int64_t after_rows = amx ? amx_tokens * cols : pairs_apply ? n * cols / 2 : 0;
  // The register kernels read F32 and BF16 products' inputs where they are
  // when nothing prepares them: their storage order is the column order, and
  // without the FP8 rounding or step pairs the copy would be all the
  // preparation (a quarter of the hyper-connections' 16384-column product
  // at 4096 tokens).
  const bool inputs_in_place = !packed && !amx && !pairs_apply && !w.quantize_input && x_stride == cols &&
                               (w.format == WeightFormat::F32 || w.format == WeightFormat::BF16);
  float* xs = inputs_in_place ? nullptr : thread_scratch_array<float>(ScratchSlot::LinearInput, n * cols + after_rows);
  const int threads = threads_for(out * cols * std::max<int64_t>(n, 1));
  // AMX tiles where they give the canonical bits (linear_amx.cpp): the
  // inputs prepared as rows, then packed a group of tokens at a time.
  if (amx && prepare_tokens(w, x, x_stride, n, Packing::AmxRows, xs)) {
    float* packed = xs + n * cols;
#pragma omp parallel for schedule(static) num_threads(threads_for(n* cols * 16))
    for (int64_t first = 0; first < n; first += kAmxTokens) pack_group_amx(xs, n, cols, first, packed);
    packed_gemm_amx(w, row_begin, out, packed, n, y, y_stride, threads);
    return;
  }
  // VDPBF16PS where it gives the canonical bits (linear_bf16.cpp); the rare
  // product it cannot take goes to the fp32 kernels.
  if (packed && isa == KernelIsa::Avx512 && bf16_dot_enabled() && bf16_dot_weights_qualify(w, row_begin, row_end) &&
      prepare_tokens(w, x, x_stride, n, outer ? Packing::OuterBf16 : Packing::DotBf16, xs)) {
    if (outer)
      packed_gemm_outer_bf16(w, row_begin, out, xs, n, y, y_stride, threads);
    else
      packed_gemm_dot_bf16(w, row_begin, out, xs, n, y, y_stride, threads);
    return;
  }
  uint32_t* pairs = pairs_apply ? reinterpret_cast<uint32_t*>(xs + n * cols) : nullptr;
  if (!inputs_in_place && !prepare_tokens(w, x, x_stride, n,
                                          !packed ? Packing::Rows
                                          : outer ? Packing::Outer
                                                  : Packing::Dot,
                                          xs, pairs))
    pairs = nullptr;
  const float* inputs = inputs_in_place ? x : xs;
  if (packed) {
    if (isa == KernelIsa::Avx2)
      packed_gemm_outer_avx2(w, row_begin, out, xs, n, y, y_stride, threads);
    else if (outer)
      packed_gemm_outer_avx512(w, row_begin, out, xs, n, y, y_stride, threads);
    else
      packed_gemm_dot_avx512(w, row_begin, out, xs, n, y, y_stride, threads);
    return;
  }
  if (isa == KernelIsa::Avx512) {
    // Up to kMaxRegisterTokens tokens per item (more for matrices of few
    // rows, see kPackedMinRows, and up to register_groups_max_tokens), in
    // blocks of as equal a size as they go: 17 tokens as 9 + 8, not 16 + 1,
    // since each block streams the weights once.
    const int64_t token_blocks = (n + kMaxRegisterTokens - 1) / kMaxRegisterTokens;
    const int64_t block_macs = token_blocks > 0 ? out * cols * ((n + token_blocks - 1) / token_blocks) : 0;
#pragma omp parallel num_threads(threads)
    {
      // A matrix of few rows with a token block for every thread: whole
      // blocks, so that each block's inputs are read from memory once, not
      // once per piece of rows (the hyper-connections' 24 x 16384 at 4096
      // tokens: 39 -> 36 ms against two pieces).
      const int64_t pieces = out < kPackedMinRows && token_blocks >= omp_get_num_threads()
                                 ? 1
                                 : register_pieces(out, block_macs, omp_get_num_threads());
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < token_blocks * pieces; ++item) {
        const int64_t block = item / pieces, piece = item % pieces;
        const int64_t t0 = n * block / token_blocks, t1 = n * (block + 1) / token_blocks;
        register_rows_piece(w, row_begin, out, inputs + t0 * cols, t1 - t0, y + t0 * y_stride, y_stride, piece, pieces,
                            pairs ? pairs + t0 * (cols / 2) : nullptr);
      }
    }
    return;
  }
  if (isa == KernelIsa::Avx2 && n == 1) {
    // One token: pieces of rows as four streams each (see RowGroup).
#pragma omp parallel num_threads(threads)
    {
      const int64_t pieces = register_pieces(out, out * cols, omp_get_num_threads());
#pragma omp for schedule(dynamic, 1)
      for (int64_t piece = 0; piece < pieces; ++piece)
        rows_one_token_avx2(w, row_begin, out * piece / pieces, out * (piece + 1) / pieces, inputs, y);
    }
    return;
  }
  const DotFn dot = dot_for(isa);
  const int64_t tile = 16;
  const int64_t n_tiles = (out + tile - 1) / tile;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t k = 0; k < n_tiles; ++k) {
    const int64_t o0 = k * tile, o1 = std::min(out, (k + 1) * tile);
    if (isa == KernelIsa::Avx2) {
      rows_tokens_avx2(w, row_begin + o0, row_begin + o1, inputs, n, y + o0, y_stride);
      continue;
    }
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = float(dot(w, row_begin + o, inputs + t * cols));
  }
}

namespace {

// Whether linear_forward would run the product on the register kernels
// (AVX-512's register path; AVX2's four-stream and few-token kernels), which
// linear_forward_many can run as pieces in a shared parallel region.
bool runs_on_register_kernels(KernelIsa isa, const LinearProduct& p) {
  if (p.n < 1) return false;
  if (isa == KernelIsa::Avx512)
    return p.n < packed_min_tokens(*p.w) && !amx_applies(isa, *p.w, p.n, p.row_begin, p.end());
  if (isa == KernelIsa::Avx2) return p.n < kOuterMinTokens;
  return false;
}

// Piece `id` of `pieces` of a product's rows on AVX2, as linear_forward runs
// it: one token as four streams, more tokens a row at a time.
void avx2_rows_piece(const LinearProduct& p, const float* xs, int64_t id, int64_t pieces) {
  const int64_t out = p.rows(), lo = out * id / pieces, hi = out * (id + 1) / pieces;
  if (p.n == 1) {
    rows_one_token_avx2(*p.w, p.row_begin, lo, hi, xs, p.y);
    return;
  }
  rows_tokens_avx2(*p.w, p.row_begin + lo, p.row_begin + hi, xs, p.n, p.y + lo, p.stride());
}

}  // namespace

void linear_forward_many(KernelIsa isa, const LinearProduct* products, size_t count) {
  std::vector<size_t> fused;
  std::vector<int64_t> offset, pairs_offset;  // pairs_offset: -1 without step-pair words
  int64_t floats = 0, work = 0;
  for (size_t i = 0; i < count; ++i) {
    const LinearProduct& p = products[i];
    check_width(*p.w);
    if (!runs_on_register_kernels(isa, p)) {
      linear_forward(isa, *p.w, p.x, p.n, p.y, p.row_begin, p.end(), p.stride(), p.input_stride());
      continue;
    }
    fused.push_back(i);
    offset.push_back(floats);
    floats += p.n * p.w->cols;
    pairs_offset.push_back(register_pairs_apply(isa, *p.w, p.n) ? floats : -1);
    if (pairs_offset.back() >= 0) floats += p.n * p.w->cols / 2;
    work += p.n * p.w->cols * p.rows();
  }
  if (fused.empty()) return;
  float* xs = thread_scratch_array<float>(ScratchSlot::LinearInput, floats);
  auto pairs_of = [&](size_t k) {
    return pairs_offset[k] < 0 ? nullptr : reinterpret_cast<uint32_t*>(xs + pairs_offset[k]);
  };
  // Per product, whether every token's inputs qualify for its pair words.
  std::vector<uint8_t> pairs_ok(fused.size(), 1);
  struct Piece {
    size_t product;  // index in fused
    int64_t piece, pieces;
  };
  std::vector<Piece> pieces;
#pragma omp parallel num_threads(threads_for(work))
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    for (size_t k = 0; k < fused.size(); ++k) {
      const LinearProduct& p = products[fused[k]];
      for (int64_t t = 0; t < p.n; ++t)
        if ((k + size_t(t)) % size_t(nt) == size_t(id) &&
            !prepare_token(*p.w, p.x, p.input_stride(), p.n, t, Packing::Rows, nullptr, xs + offset[k], pairs_of(k))) {
#pragma omp atomic write
          pairs_ok[k] = 0;
        }
    }
#pragma omp single
    for (size_t k = 0; k < fused.size(); ++k) {
      const LinearProduct& pk = products[fused[k]];
      const int64_t count = register_pieces(pk.rows(), pk.rows() * pk.w->cols * pk.n, nt);
      for (int64_t piece = 0; piece < count; ++piece) pieces.push_back({k, piece, count});
    }
    // (The single's barrier also waits for every token's prepared input.)
#pragma omp for schedule(dynamic, 1)
    for (size_t item = 0; item < pieces.size(); ++item) {
      const Piece& q = pieces[item];
      const LinearProduct& p = products[fused[q.product]];
      if (isa == KernelIsa::Avx2)
        avx2_rows_piece(p, xs + offset[q.product], q.piece, q.pieces);
      else
        register_rows_piece(*p.w, p.row_begin, p.rows(), xs + offset[q.product], p.n, p.y, p.stride(), q.piece,
                            q.pieces, pairs_ok[q.product] ? pairs_of(q.product) : nullptr);
    }
  }
}

}  // namespace dsv4
