#include "model/cache_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/numeric.h"

namespace dsv4 {

namespace {

// The ue8m0 byte of the smallest power of two >= amax / format_max (amax
// 0: any scale encodes zeros; take 2^0).
uint8_t block_scale(const float* x, int64_t n, float format_max) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) return 127;
  const uint32_t bits = float_to_bits(pow2_ceil(amax / format_max));
  return uint8_t(bits >> 23);
}

// The e4m3 code of an exactly representable value (|v| <= 448).
uint8_t e4m3_code(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  if (a == 0.0f) return sign;
  int e;
  const float m = std::frexp(a, &e);                                // a = m * 2^e, m in [0.5, 1)
  const int exponent = e - 1;                                       // a = (2m) * 2^exponent
  if (exponent < -6) return uint8_t(sign | int(std::ldexp(a, 9)));  // subnormal: a = k * 2^-9
  const int mantissa = int(std::ldexp(2 * m - 1, 3));
  return uint8_t(sign | (exponent + 7) << 3 | mantissa);
}

// The e2m1 nibble of an exactly representable value (|v| <= 6).
uint8_t e2m1_code(float v) {
  static const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(v);
  uint8_t code = 0;
  while (code < 7 && magnitudes[code] != a) ++code;
  return uint8_t((std::signbit(v) ? 8 : 0) | code);
}

}  // namespace

KvRows::KvRows(int64_t width, int64_t nope, int64_t block)
    : width_(width), nope_(nope), block_(block), blocks_((nope + block - 1) / block) {}

void KvRows::resize(int64_t rows) {
  rows_ = rows;
  codes_.resize(size_t(rows * nope_), 0);
  scales_.resize(size_t(rows * blocks_), 127);
  rope_.resize(size_t(rows * (width_ - nope_)), 0.0f);
}

void KvRows::set(int64_t row, const float* values) {
  uint8_t* codes = codes_.data() + row * nope_;
  uint8_t* scales = scales_.data() + row * blocks_;
  for (int64_t b = 0; b < blocks_; ++b) {
    const int64_t b0 = b * block_, b1 = std::min(nope_, b0 + block_);
    scales[b] = block_scale(values + b0, b1 - b0, 448.0f);
    const float inverse = 1.0f / e8m0_to_float(scales[b]);  // exact: a power of two
    for (int64_t i = b0; i < b1; ++i) codes[i] = e4m3_code(values[i] * inverse);
  }
  std::memcpy(rope_.data() + row * (width_ - nope_), values + nope_, size_t(width_ - nope_) * 4);
}

void KvRows::append(const float* values) {
  resize(rows_ + 1);
  set(rows_ - 1, values);
}

void KvRows::decode(int64_t row, float* out) const {
  const uint8_t* codes = codes_.data() + row * nope_;
  const uint8_t* scales = scales_.data() + row * blocks_;
  for (int64_t i = 0; i < nope_; ++i) out[i] = e4m3_to_float(codes[i]) * e8m0_to_float(scales[i / block_]);
  std::memcpy(out + nope_, rope_.data() + row * (width_ - nope_), size_t(width_ - nope_) * 4);
}

void KvRows::copy_row_bytes(int64_t row, uint8_t* out) const {
  std::memcpy(out, codes_.data() + row * nope_, size_t(nope_));
  std::memcpy(out + nope_, scales_.data() + row * blocks_, size_t(blocks_));
  std::memcpy(out + nope_ + blocks_, rope_.data() + row * (width_ - nope_), size_t(width_ - nope_) * 4);
}

void KvRows::restore_row_bytes(int64_t row, const uint8_t* in) {
  std::memcpy(codes_.data() + row * nope_, in, size_t(nope_));
  std::memcpy(scales_.data() + row * blocks_, in + nope_, size_t(blocks_));
  std::memcpy(rope_.data() + row * (width_ - nope_), in + nope_ + blocks_, size_t(width_ - nope_) * 4);
}

std::vector<uint8_t> KvRows::bytes() const {
  std::vector<uint8_t> out(size_t(rows_ * row_bytes()));
  for (int64_t r = 0; r < rows_; ++r) copy_row_bytes(r, out.data() + r * row_bytes());
  return out;
}

void KvRows::set_bytes(const std::vector<uint8_t>& bytes, int64_t rows) {
  if (int64_t(bytes.size()) != rows * row_bytes()) throw Error("decode-state snapshot: KV rows of the wrong size");
  resize(rows);
  for (int64_t r = 0; r < rows; ++r) restore_row_bytes(r, bytes.data() + r * row_bytes());
}

void KvRows::copy_rows(int64_t r0, int64_t r1, uint8_t* out) const {
  for (int64_t r = r0; r < r1; ++r) copy_row_bytes(r, out + (r - r0) * row_bytes());
}

void KvRows::append_rows(const uint8_t* in, int64_t n) {
  const int64_t first = rows_;
  resize(rows_ + n);
  for (int64_t r = 0; r < n; ++r) restore_row_bytes(first + r, in + r * row_bytes());
}

// FP4 rows (both kinds): a row is its nibbles, then its scales.
static void copy_fp4_rows(const std::vector<uint8_t>& nibbles, const std::vector<uint8_t>& scales, int64_t half,
                          int64_t blocks, int64_t r0, int64_t r1, uint8_t* out) {
  for (int64_t r = r0; r < r1; ++r, out += half + blocks) {
    std::memcpy(out, nibbles.data() + r * half, size_t(half));
    std::memcpy(out + half, scales.data() + r * blocks, size_t(blocks));
  }
}

static void restore_fp4_rows(std::vector<uint8_t>& nibbles, std::vector<uint8_t>& scales, int64_t half,
                             int64_t blocks, int64_t first, int64_t n, const uint8_t* in) {
  for (int64_t r = first; r < first + n; ++r, in += half + blocks) {
    std::memcpy(nibbles.data() + r * half, in, size_t(half));
    std::memcpy(scales.data() + r * blocks, in + half, size_t(blocks));
  }
}

Fp4Rows::Fp4Rows(int64_t width, int64_t block, Fp4Scale scale)
    : width_(width), block_(block), blocks_((width + block - 1) / block), scale_(scale) {
  if (width % 2) throw Error("FP4 rows need an even width");
}

void Fp4Rows::resize(int64_t rows) {
  rows_ = rows;
  nibbles_.resize(size_t(rows * width_ / 2), 0);
  scales_.resize(size_t(rows * blocks_), scale_ == Fp4Scale::Ue8m0 ? 127 : 0x38);  // 1.0
}

void Fp4Rows::append(const float* values) {
  if (scale_ != Fp4Scale::Ue8m0) throw Error("FP4 rows with e4m3 scales are appended by append_rounding");
  resize(rows_ + 1);
  uint8_t* nibbles = nibbles_.data() + (rows_ - 1) * (width_ / 2);
  uint8_t* scales = scales_.data() + (rows_ - 1) * blocks_;
  for (int64_t b = 0; b < blocks_; ++b) {
    const int64_t b0 = b * block_, b1 = std::min(width_, b0 + block_);
    scales[b] = block_scale(values + b0, b1 - b0, 6.0f);
    const float inverse = 1.0f / e8m0_to_float(scales[b]);
    for (int64_t i = b0; i < b1; ++i) {
      const uint8_t code = e2m1_code(values[i] * inverse);
      nibbles[i / 2] = uint8_t(i % 2 ? (nibbles[i / 2] & 0x0f) | code << 4 : (nibbles[i / 2] & 0xf0) | code);
    }
  }
}

void Fp4Rows::append_rounding(float* values) {
  if (scale_ != Fp4Scale::E4m3) throw Error("append_rounding stores e4m3-scaled FP4 rows");
  std::vector<uint8_t> codes(static_cast<size_t>(width_));
  resize(rows_ + 1);
  fp4_e4m3_round_trip(values, width_, block_, codes.data(), scales_.data() + (rows_ - 1) * blocks_);
  uint8_t* nibbles = nibbles_.data() + (rows_ - 1) * (width_ / 2);
  for (int64_t i = 0; i < width_; i += 2) nibbles[i / 2] = uint8_t(codes[size_t(i)] | codes[size_t(i + 1)] << 4);
}

void Fp4Rows::decode(int64_t row, float* out) const {
  const uint8_t* nibbles = nibbles_.data() + row * (width_ / 2);
  const uint8_t* scales = scales_.data() + row * blocks_;
  const float* scale_values = scale_ == Fp4Scale::Ue8m0 ? kNumericTables.e8m0 : kNumericTables.e4m3;
  for (int64_t i = 0; i < width_; ++i)
    out[i] = e2m1_to_float(i % 2 ? nibbles[i / 2] >> 4 : nibbles[i / 2] & 15) * scale_values[scales[i / block_]];
}

Fp4RowsView Fp4Rows::view() const {
  if (scale_ != Fp4Scale::Ue8m0) throw Error("Fp4Rows::view: only rows with ue8m0 scales");
  return {nibbles_.data(), scales_.data(), width_, block_};
}

std::vector<uint8_t> Fp4Rows::bytes() const {
  std::vector<uint8_t> out(nibbles_);
  out.insert(out.end(), scales_.begin(), scales_.end());
  return out;
}

void Fp4Rows::set_bytes(const std::vector<uint8_t>& bytes, int64_t rows) {
  if (int64_t(bytes.size()) != rows * (width_ / 2 + blocks_))
    throw Error(std::string("decode-state snapshot: ") +
                (scale_ == Fp4Scale::Ue8m0 ? "index keys" : "compressed rows") + " of the wrong size");
  resize(rows);
  std::copy(bytes.begin(), bytes.begin() + int64_t(nibbles_.size()), nibbles_.begin());
  std::copy(bytes.begin() + int64_t(nibbles_.size()), bytes.end(), scales_.begin());
}

void Fp4Rows::copy_rows(int64_t r0, int64_t r1, uint8_t* out) const {
  copy_fp4_rows(nibbles_, scales_, width_ / 2, blocks_, r0, r1, out);
}

void Fp4Rows::append_rows(const uint8_t* in, int64_t n) {
  const int64_t first = rows_;
  resize(rows_ + n);
  restore_fp4_rows(nibbles_, scales_, width_ / 2, blocks_, first, n, in);
}

}  // namespace dsv4
