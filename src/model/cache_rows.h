// Cached rows in the exact form the reference rounds them to, so that a
// decode state holds each value in as few bytes as its rounding allows and
// decodes to the very same floats:
//  - KV rows (window ring and compressed rows): the reference rounds the
//    first `nope` dims through FP8 e4m3 with one power-of-two scale per 64
//    (stored: one byte each plus a scale byte per block) and keeps the
//    rotated `rope` dims as they are (stored as floats);
//  - indexer keys: rounded through FP4 e2m1 with a scale per 32 (stored: a
//    nibble each plus a scale byte per block);
//  - V4.1's compressed rows: FP4 e2m1 with an E4M3 scale per 16 (stored the
//    same way; the round trip itself hands over the codes, since an E4M3
//    scale cannot be found again from the rounded values).
// Encoding takes the rounded floats the forward pass computed and finds, per
// block, a power-of-two scale that makes every value an exact code (the
// largest magnitude over the format's maximum, rounded up to a power of
// two: the rounding's own scale or a smaller one, under which the values
// are codes times a power of two and so codes too). Decoding multiplies the
// code by the scale, as the rounding did: the same bits.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace dsv4 {

class KvRows {
 public:
  KvRows() = default;
  KvRows(int64_t width, int64_t nope, int64_t block = 64);
  int64_t width() const { return width_; }
  int64_t rows() const { return rows_; }
  void resize(int64_t rows);  // new rows decode to zeros
  // Row `row` <- the floats at `values` (already rounded by the reference's
  // FP8 round trip over the first nope dims).
  void set(int64_t row, const float* values);
  void append(const float* values);
  void decode(int64_t row, float* out) const;
  // The rows as stored, for the kernels (decode_fp8_rows decodes as decode).
  Fp8RowsView view() const { return {codes_.data(), scales_.data(), rope_.data(), width_, nope_, block_}; }
  // Bytes of row `row` in storage (for the rollback journal) and their size.
  int64_t row_bytes() const { return nope_ + blocks_ + (width_ - nope_) * 4; }
  void copy_row_bytes(int64_t row, uint8_t* out) const;
  void restore_row_bytes(int64_t row, const uint8_t* in);
  int64_t memory_bytes() const { return rows_ * row_bytes(); }
  // All rows' storage, for snapshots.
  std::vector<uint8_t> bytes() const;
  void set_bytes(const std::vector<uint8_t>& bytes, int64_t rows);
  // Rows [r0, r1) one after another (row_bytes() each), and the reverse:
  // `n` such rows appended. The prefix cache stores rows in these ranges.
  void copy_rows(int64_t r0, int64_t r1, uint8_t* out) const;
  void append_rows(const uint8_t* in, int64_t n);

 private:
  int64_t width_ = 0, nope_ = 0, block_ = 64, blocks_ = 0, rows_ = 0;
  std::vector<uint8_t> codes_, scales_;  // [rows, nope], [rows, blocks]
  std::vector<float> rope_;              // [rows, width - nope]
};

// How an FP4 row's per-block scales are stored: ue8m0 (powers of two: the
// indexer keys) or e4m3 (V4.1's compressed rows).
enum class Fp4Scale { Ue8m0, E4m3 };

class Fp4Rows {
 public:
  Fp4Rows() = default;
  explicit Fp4Rows(int64_t width, int64_t block = 32, Fp4Scale scale = Fp4Scale::Ue8m0);
  int64_t width() const { return width_; }
  int64_t rows() const { return rows_; }
  void resize(int64_t rows);
  // Ue8m0: values already rounded by the FP4 round trip (the scales are
  // found again from them).
  void append(const float* values);
  // E4m3: rounds `values` in place (fp4_e4m3_round_trip) and stores the
  // codes that round trip hands over.
  void append_rounding(float* values);
  void decode(int64_t row, float* out) const;
  int64_t memory_bytes() const { return rows_ * (width_ / 2 + blocks_); }
  std::vector<uint8_t> bytes() const;
  void set_bytes(const std::vector<uint8_t>& bytes, int64_t rows);
  int64_t row_bytes() const { return width_ / 2 + blocks_; }
  // The rows as the backend reads them (ue8m0 scales only).
  Fp4RowsView view() const;
  void copy_rows(int64_t r0, int64_t r1, uint8_t* out) const;  // as KvRows::copy_rows
  void append_rows(const uint8_t* in, int64_t n);

 private:
  int64_t width_ = 0, block_ = 32, blocks_ = 0, rows_ = 0;
  Fp4Scale scale_ = Fp4Scale::Ue8m0;
  std::vector<uint8_t> nibbles_, scales_;  // [rows, width / 2], [rows, blocks]
};

}  // namespace dsv4
