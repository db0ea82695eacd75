// Cached FP8 rows: decoded in part on every path, and attended as stored
// (the backend decoding them per key tile) with the bits of attending their
// decoded floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu/fp8_rows.h"
#include "kernels/cpu/isa.h"
#include "random_floats.h"

namespace dsv4 {
namespace {

using test::normal_floats;

struct StoredRows {
  std::vector<uint8_t> codes, scales;
  std::vector<float> rope;
  Fp8RowsView view;

  StoredRows(int64_t rows, int64_t width, int64_t nope, int64_t block, uint32_t seed, bool every_code) {
    const int64_t blocks = (nope + block - 1) / block;
    std::mt19937 rng(seed);
    codes.resize(size_t(rows * nope));
    scales.resize(size_t(rows * blocks));
    for (size_t i = 0; i < codes.size(); ++i)
      codes[i] = every_code ? uint8_t(i * 7 + i / 256) : uint8_t(rng() % 0x7e | (rng() % 2 ? 0x80 : 0));
    for (auto& s : scales) s = every_code ? uint8_t(rng()) : uint8_t(118 + rng() % 12);
    rope = normal_floats(size_t(rows * (width - nope)), seed + 1);
    view = {codes.data(), scales.data(), rope.data(), width, nope, block};
  }
  float value(int64_t row, int64_t i) const {
    if (i >= view.nope) return rope[size_t(row * (view.width - view.nope) + i - view.nope)];
    const int64_t blocks = (view.nope + view.block - 1) / view.block;
    return e4m3_to_float(codes[size_t(row * view.nope + i)]) *
           e8m0_to_float(scales[size_t(row * blocks + i / view.block)]);
  }
};

std::vector<KernelIsa> supported_isas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512})
    if (kernel_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

// Parts of rows [d0, d1) decode to the definition's bits (every e4m3 code
// with NaNs, scales from tiny to NaN) and leave the rest of the row alone,
// on every path: starts on and off a vector boundary, ends in the RoPE
// floats, a width whose e4m3 part is not a multiple of 16.
TEST(Fp8Rows, PartsOfARowDecodeToTheDefinitionBitsOnEveryPath) {
  for (int64_t nope : {448, 40}) {
    const int64_t width = nope + 64, rows = 40;
    const StoredRows stored(rows, width, nope, 64, 5, true);
    for (KernelIsa isa : supported_isas())
      for (auto [d0, d1] : {std::pair<int64_t, int64_t>{0, width},
                            {0, 256},
                            {256, width},
                            {32, nope},
                            {5, 37},
                            {nope, width},
                            {16, 16}}) {
        if (d1 > width || d0 > d1) continue;
        SCOPED_TRACE(std::string(kernel_isa_name(isa)) + ", nope " + std::to_string(nope) + ", [" + std::to_string(d0) +
                     ", " + std::to_string(d1) + ")");
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> got(size_t(width), -7.0f);
          cpu::decode_fp8_row(isa, stored.view, r, d0, d1, got.data());
          for (int64_t i = 0; i < width; ++i) {
            const float want = i >= d0 && i < d1 ? stored.value(r, i) : -7.0f;
            // A NaN code times a NaN scale is a NaN whose sign is that of
            // whichever operand the compiler put first.
            if (std::isnan(want) && std::isnan(got[size_t(i)])) continue;
            ASSERT_EQ(0, std::memcmp(&got[size_t(i)], &want, 4)) << "row " << r << ", value " << i;
          }
        }
      }
  }
}

// A row's compressed keys handed over as stored FP8 rows (null keys with
// fp8_keys beside them) give the bits of the same keys decoded first, on
// every path, backend numerics and thread count: long rows (decoded per key
// tile, one row split over the threads or whole rows per thread) and short
// ones (decoded before the attention), stored keys first and float keys
// (a window) after them, rows of two sequences' stores.
TEST(Fp8Rows, StoredKeysAttendAsTheirDecodedFloats) {
  struct Case {
    int64_t heads, width, nope;
    std::vector<int64_t> stored_keys;  // per row; each row also has 5 float keys
  };
  for (const Case& c : {Case{16, 512, 448, {1000}}, Case{8, 128, 64, {300, 70}}, Case{4, 64, 48, {20, 9, 33}},
                        Case{4, 96, 64, {600, 600, 600, 600}}, Case{4, 64, 64, {257, 2}}}) {
    const int64_t rows = int64_t(c.stored_keys.size()), H = c.heads, dim = c.width, window = 5;
    // Two sequences' stores: even rows read the first, odd rows the second.
    const StoredRows first(1200, dim, c.nope, 64, 31, false), second(700, dim, c.nope, 64, 32, false);
    const std::vector<float> window_keys = normal_floats(size_t(rows * window * dim), 33);
    std::vector<float> decoded;
    std::vector<const float*> stored_keys, float_keys;
    std::vector<Fp8Key> fp8;
    std::vector<int64_t> key_begin = {0};
    decoded.reserve(size_t(1200 * 4 * dim));
    for (int64_t t = 0; t < rows; ++t) {
      const StoredRows& store = t % 2 ? second : first;
      for (int64_t j = 0; j < c.stored_keys[size_t(t)]; ++j) {
        const int64_t id = (j * 37 + t) % (t % 2 ? 700 : 1200);
        stored_keys.push_back(nullptr);
        fp8.push_back({&store.view, id});
        for (int64_t i = 0; i < dim; ++i) decoded.push_back(store.value(id, i));
      }
      for (int64_t j = 0; j < window; ++j) {
        stored_keys.push_back(window_keys.data() + (t * window + j) * dim);
        fp8.push_back({});
        for (int64_t i = 0; i < dim; ++i) decoded.push_back(window_keys[size_t((t * window + j) * dim + i)]);
      }
      key_begin.push_back(int64_t(stored_keys.size()));
    }
    for (size_t j = 0; j < stored_keys.size(); ++j) float_keys.push_back(decoded.data() + j * size_t(dim));
    const std::vector<float> q = normal_floats(size_t(rows * H * dim), 34), sink = normal_floats(size_t(H), 35);
    const float scale = 1.0f / std::sqrt(float(dim));
    const int saved = compute_threads();
    for (int threads : {1, 2, 3})
      for (KernelIsa isa : supported_isas())
        for (const char* numerics : {"", "-exact"}) {
          const std::string name = std::string(kernel_isa_name(isa)) + numerics;
          SCOPED_TRACE(name + ", " + std::to_string(H) + " heads, dim " + std::to_string(dim) + ", " +
                       std::to_string(rows) + " rows, " + std::to_string(threads) + " threads");
          set_compute_threads(threads);
          const KernelBackend& kb = backend_by_name(name);
          std::vector<float> want(size_t(rows * H * dim), NAN), got(want.size(), NAN);
          kb.sink_attention(
              {q.data(), rows, H, dim, float_keys.data(), key_begin.data(), sink.data(), scale, want.data()});
          kb.sink_attention({q.data(), rows, H, dim, stored_keys.data(), key_begin.data(), sink.data(), scale,
                             got.data(), fp8.data()});
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
          // The first row alone (a decode step's lone sequence).
          std::vector<float> alone(size_t(H * dim), NAN);
          kb.sink_attention({q.data(), 1, H, dim, stored_keys.data(), key_begin.data(), sink.data(), scale,
                             alone.data(), fp8.data()});
          EXPECT_EQ(0, std::memcmp(alone.data(), want.data(), alone.size() * 4));
        }
    set_compute_threads(saved);
  }
}

// A stored key whose rows are not the attention's width is refused, not
// read past its tile.
TEST(Fp8Rows, StoredKeysOfAnotherWidthAreRefused) {
  const StoredRows store(4, 128, 64, 64, 41, false);
  const std::vector<float> q = normal_floats(64 * 2, 42), sink = normal_floats(2, 43);
  std::vector<const float*> keys(4, nullptr);
  std::vector<Fp8Key> fp8;
  for (int64_t i = 0; i < 4; ++i) fp8.push_back({&store.view, i});
  const int64_t key_begin[2] = {0, 4};
  std::vector<float> out(64 * 2);
  EXPECT_THROW(default_backend().sink_attention(
                   {q.data(), 1, 2, 64, keys.data(), key_begin, sink.data(), 0.125f, out.data(), fp8.data()}),
               std::exception);
}

}  // namespace
}  // namespace dsv4
