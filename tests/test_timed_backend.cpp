// TimedBackend's accounts of the weight products: what `dsv4 bench` sets
// each kind of product against (its bytes, and its weights and
// multiply-adds for the compute floor), and that timing changes no result.
#include "kernels/timed_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/random_linear.h"
#include "random_floats.h"

namespace dsv4 {
namespace {

using test::normal_floats;

TEST(TimedBackend, LinearCountsTheRowsItReads) {
  const KernelBackend& inner = default_backend();
  TimedBackend timed(inner);
  const int64_t rows = 40, cols = 256, n = 3, row_begin = 8, row_end = 24;
  RandomLinear w(WeightFormat::BF16, rows, cols, 5);
  const std::vector<float> x = normal_floats(size_t(n * cols), 7);
  std::vector<float> got(size_t(n * rows)), want(size_t(n * rows));
  timed.linear(w.linear, x.data(), n, got.data(), row_begin, row_end, rows);
  inner.linear(w.linear, x.data(), n, want.data(), row_begin, row_end, rows);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));

  ASSERT_EQ(1u, timed.products().count("BF16 x3"));
  const TimedBackend::ProductAccount& p = timed.products().at("BF16 x3");
  const double weights = double((row_end - row_begin) * cols);
  EXPECT_EQ(1, p.calls);
  EXPECT_EQ(1, p.passes);
  EXPECT_EQ(n, p.tokens);
  EXPECT_DOUBLE_EQ(2 * weights, p.bytes);
  EXPECT_DOUBLE_EQ(weights, p.weights[size_t(WeightFormat::BF16)]);
  EXPECT_DOUBLE_EQ(0, p.weights[size_t(WeightFormat::FP8_BLOCK128)]);
  EXPECT_DOUBLE_EQ(weights * double(n), p.macs);
}

// A batch of products: slices of one kind (a grouped projection's) count
// as that kind, each slice's rows once; a mix by its formats joined, with
// the token count where they share it. Timing changes no result.
TEST(TimedBackend, ManyCountsSlicesOfOneKindAsThatKind) {
  const KernelBackend& inner = default_backend();
  TimedBackend timed(inner);
  const int64_t rows = 64, cols = 256, n = 2;
  RandomLinear w(WeightFormat::BF16, rows, cols, 11), other(WeightFormat::F32, 16, cols, 12);
  const std::vector<float> x = normal_floats(size_t(2 * n * cols), 13);
  std::vector<float> got(size_t(n * rows)), want(size_t(n * rows));
  const LinearProduct slices[2] = {{&w.linear, x.data(), n, got.data(), 0, 24, rows},
                                   {&w.linear, x.data() + n * cols, n, got.data() + 24, 24, 64, rows}};
  timed.linear_many(slices, 2);
  inner.linear(w.linear, x.data(), n, want.data(), 0, 24, rows);
  inner.linear(w.linear, x.data() + n * cols, n, want.data() + 24, 24, 64, rows);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  ASSERT_EQ(1u, timed.products().size());
  const TimedBackend::ProductAccount& p = timed.products().at("BF16 x2");
  EXPECT_EQ(1, p.calls);
  EXPECT_EQ(2, p.passes);
  EXPECT_DOUBLE_EQ(2.0 * double(rows * cols), p.bytes);
  EXPECT_DOUBLE_EQ(double(rows * cols * n), p.macs);

  std::vector<float> y(size_t(n * 16));
  const LinearProduct mixed[2] = {slices[0], {&other.linear, x.data(), n, y.data()}};
  timed.linear_many(mixed, 2);
  ASSERT_EQ(1u, timed.products().count("BF16+F32 x" + std::to_string(n)));
  EXPECT_EQ(2, timed.products().at("BF16+F32 x" + std::to_string(n)).passes);

  const LinearProduct counts[2] = {slices[0], {&other.linear, x.data(), 1, y.data()}};
  timed.linear_many(counts, 2);
  EXPECT_EQ(1u, timed.products().count("BF16+F32 (several token counts)"));
}

// The experts of one call: each task's three matrices once, by format, and
// the multiply-adds of its rows; the shared expert (no routing weights)
// counts with them.
TEST(TimedBackend, ExpertsCountEachTaskByFormat) {
  const KernelBackend& inner = default_backend();
  TimedBackend timed(inner);
  const int64_t dim = 256, inter = 128, rows = 3;
  RandomLinear gate4(WeightFormat::FP4_BLOCK32, inter, dim, 1), down4(WeightFormat::FP4_BLOCK32, dim, inter, 2),
      up4(WeightFormat::FP4_BLOCK32, inter, dim, 3);
  RandomLinear gate8(WeightFormat::FP8_BLOCK128, inter, dim, 4), down8(WeightFormat::FP8_BLOCK128, dim, inter, 5),
      up8(WeightFormat::FP8_BLOCK128, inter, dim, 6);
  const int64_t routed_rows[2] = {0, 2}, shared_rows[3] = {0, 1, 2};
  const float routed_weights[2] = {0.25f, 0.75f};
  const ExpertTask tasks[2] = {{&gate4.linear, &down4.linear, &up4.linear, routed_rows, routed_weights, 2},
                               {&gate8.linear, &down8.linear, &up8.linear, shared_rows, nullptr, 3}};
  const std::vector<float> x = normal_floats(size_t(rows * dim), 9);
  std::vector<float> got(size_t(rows * dim)), want(size_t(rows * dim));
  timed.experts(x.data(), rows, dim, inter, tasks, 2, 0.0f, got.data());
  inner.experts(x.data(), rows, dim, inter, tasks, 2, 0.0f, want.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));

  ASSERT_EQ(1u, timed.products().count("experts FP4"));
  const TimedBackend::ProductAccount& p = timed.products().at("experts FP4");
  const double matrix = double(inter * dim);
  EXPECT_EQ(6, p.passes);
  EXPECT_EQ(3 * 2 + 3 * 3, p.tokens);
  EXPECT_DOUBLE_EQ(3 * matrix, p.weights[size_t(WeightFormat::FP4_BLOCK32)]);
  EXPECT_DOUBLE_EQ(3 * matrix, p.weights[size_t(WeightFormat::FP8_BLOCK128)]);
  EXPECT_DOUBLE_EQ(3 * matrix * 2 + 3 * matrix * 3, p.macs);
}

}  // namespace
}  // namespace dsv4
