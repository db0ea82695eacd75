// Microbenchmarks of the CPU kernels, each beside its scalar reference and
// checked against it before timing. Bytes/s counts weight bytes streamed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/aligned.h"
#include "core/numeric.h"
#include "io/config.h"
#include "kernels/backend.h"
#include "kernels/cpu/indexer_fp4.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/random_linear.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vector_ops.h"

namespace dsv4 {
namespace {

// Random weights (in huge pages, as the loader keeps them) whose inputs are
// rounded through FP8 where the model's are: FP8 and FP4 matrices.
RandomLinear make_weights(WeightFormat f, int64_t rows, int64_t cols, uint32_t seed = 1) {
  RandomLinear w(f, rows, cols, seed);
  w.linear.quantize_input = f == WeightFormat::FP8_BLOCK128 || f == WeightFormat::FP4_BLOCK32;
  return w;
}

// The routed experts of a decode step: `experts` distinct FP4 experts of
// V4-Flash's shape (gate and up 2048 x 4096, down 4096 x 2048: 13 MB each,
// 530 MB in all, from DRAM), one token each, as separate linear_forward
// calls (range 1 = 0) or as two linear_forward_many batches (range 1 = 1),
// the way moe_forward runs them. Checked: both give the same bits.
void BM_ExpertsDecode(benchmark::State& state) {
  const int experts = int(state.range(0));
  const bool many = state.range(1) != 0;
  const int64_t dim = 4096, inter = 2048;
  std::vector<RandomLinear> w1, w3, w2;
  for (int e = 0; e < experts; ++e) {
    w1.push_back(make_weights(WeightFormat::FP4_BLOCK32, inter, dim, 3 * e + 1));
    w3.push_back(make_weights(WeightFormat::FP4_BLOCK32, inter, dim, 3 * e + 2));
    w2.push_back(make_weights(WeightFormat::FP4_BLOCK32, dim, inter, 3 * e + 3));
  }
  std::vector<float> x(size_t(experts * dim)), a(size_t(experts * inter)), b(a.size()), y(x.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  auto run = [&](bool batched) {
    if (!batched) {
      for (int e = 0; e < experts; ++e) {
        linear_forward(w1[size_t(e)].linear, x.data() + e * dim, 1, a.data() + e * inter);
        linear_forward(w3[size_t(e)].linear, x.data() + e * dim, 1, b.data() + e * inter);
      }
      for (int e = 0; e < experts; ++e)
        linear_forward(w2[size_t(e)].linear, a.data() + e * inter, 1, y.data() + e * dim);
      return;
    }
    std::vector<LinearProduct> p;
    for (int e = 0; e < experts; ++e) {
      p.push_back({&w1[size_t(e)].linear, x.data() + e * dim, 1, a.data() + e * inter});
      p.push_back({&w3[size_t(e)].linear, x.data() + e * dim, 1, b.data() + e * inter});
    }
    linear_forward_many(p.data(), p.size());
    p.clear();
    for (int e = 0; e < experts; ++e) p.push_back({&w2[size_t(e)].linear, a.data() + e * inter, 1, y.data() + e * dim});
    linear_forward_many(p.data(), p.size());
  };
  run(!many);
  const std::vector<float> other = y;
  run(many);
  if (std::memcmp(other.data(), y.data(), y.size() * sizeof(float)) != 0) {
    state.SkipWithError("linear_forward_many differs from linear_forward");
    return;
  }
  for (auto _ : state) {
    run(many);
    benchmark::DoNotOptimize(y.data());
  }
  int64_t bytes = 0;
  for (int e = 0; e < experts; ++e)
    bytes +=
        w1[size_t(e)].linear.weight_bytes() + w3[size_t(e)].linear.weight_bytes() + w2[size_t(e)].linear.weight_bytes();
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
  state.SetLabel(many ? "linear_forward_many" : "one linear_forward each");
}
BENCHMARK(BM_ExpertsDecode)->Args({40, 0})->Args({40, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// state.range: 0 = format, 1 = isa, 2 = tokens, 3 = weight MiB (0: 2048 x
// 4096, which stays in cache: the compute ceiling; 512: streamed from DRAM,
// as in decode), 4 = AVX512-BF16 dot products where exact (1) or the fp32
// kernels (0).
void BM_Linear(benchmark::State& state) {
  const auto format = WeightFormat(state.range(0));
  const auto isa = KernelIsa(state.range(1));
  const int64_t n = state.range(2), cols = 4096;
  const int64_t bytes_per_row = format == WeightFormat::BF16          ? 2 * cols
                                : format == WeightFormat::FP4_BLOCK32 ? cols / 2
                                                                      : cols;
  const int64_t rows = state.range(3) ? (state.range(3) << 20) / bytes_per_row : 2048;
  if (!kernel_isa_supported(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  RandomLinear w = make_weights(format, rows, cols);
  std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  set_kernel_isa(isa);
  const bool bf16 = state.range(4) != 0;
  if (bf16 && !bf16_dot_supported()) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  set_bf16_dot(bf16);
  // Correctness against the scalar reference (on the rounded input).
  linear_forward(w.linear, x.data(), n, y.data());
  std::vector<float> xr(x.begin(), x.begin() + cols);
  if (w.linear.quantize_input) fp8_round_trip(xr.data(), cols, 128);
  // The fp32 lanes sum at most 64 products per chunk: within 66 rounding
  // units of the sum of |products| (see the kernel tests).
  std::vector<float> decoded(static_cast<size_t>(cols));
  for (int64_t o = 0; o < rows; o += 97) {
    const double ref = linear_dot_reference(w.linear, o, xr.data());
    linear_decode_row(w.linear, o, decoded.data());
    double magnitude = 0;
    for (int64_t i = 0; i < cols; ++i) magnitude += std::fabs(double(decoded[size_t(i)]) * xr[size_t(i)]);
    if (std::fabs(ref - y[size_t(o)]) > 66 * 0x1p-24 * magnitude) {
      state.SkipWithError("mismatch against the scalar reference");
      return;
    }
  }
  for (auto _ : state) {
    linear_forward(w.linear, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * w.linear.weight_bytes());
  state.counters["MAC/s"] =
      benchmark::Counter(double(rows * cols * n) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(weight_format_name(format)) + " / " + kernel_isa_name(isa) + (bf16 ? " / bf16 dot" : ""));
  set_bf16_dot(bf16_dot_supported());
}

void linear_args(benchmark::internal::Benchmark* b) {
  for (int f : {int(WeightFormat::BF16), int(WeightFormat::FP8_BLOCK128), int(WeightFormat::FP4_BLOCK32)})
    for (int isa : {int(KernelIsa::Scalar), int(KernelIsa::Avx2), int(KernelIsa::Avx512)})
      for (int n : {1, 4, 16, 128}) b->Args({f, isa, n, 0, 0});
  for (int f : {int(WeightFormat::BF16), int(WeightFormat::FP8_BLOCK128), int(WeightFormat::FP4_BLOCK32)})
    for (int isa : {int(KernelIsa::Avx2), int(KernelIsa::Avx512)}) b->Args({f, isa, 1, 512, 0});
  // Prefill-sized batches: the packed GEMM's throughput.
  // With the fp32 kernels and with the bf16 dot products.
  for (int bf16 : {0, 1}) {
    for (int f : {int(WeightFormat::FP8_BLOCK128), int(WeightFormat::FP4_BLOCK32)})
      b->Args({f, int(KernelIsa::Avx512), 1024, 0, bf16});
    // A routed expert in a prefill: ~100 tokens, FP4 weights from DRAM.
    b->Args({int(WeightFormat::FP4_BLOCK32), int(KernelIsa::Avx512), 96, 256, bf16});
  }
  // A 16-sequence decode step: the head (BF16, 16 tokens), the attention
  // and shared-expert products (FP8, 16 tokens) and the routed experts,
  // which see 1-3 tokens each (FP4), all from DRAM. Against the 1-token
  // cases they show where batched decode stops being bound by the bytes.
  b->Args({int(WeightFormat::BF16), int(KernelIsa::Avx512), 16, 512, 0});
  // FP8 with decoding's, a verify step's or a batch's tokens: with bf16
  // off the fp32 kernels (1-8 tokens: fp8_whole_rows_avx512; 9-16: the
  // eight-row kernel through bf16; the paths V4's wo_a always takes, its
  // inputs not rounded through FP8); with it on the four-row kernel with
  // byte tables (1-4 tokens, where the CPU has AVX512-VBMI) and the
  // eight-row kernel (5-16), both VDPBF16PS (linear_fp8_pairs.cpp); in
  // cache and from DRAM.
  for (int bf16 : {0, 1}) {
    for (int n : {1, 2, 4, 5, 8, 12, 16})
      b->Args({int(WeightFormat::FP8_BLOCK128), int(KernelIsa::Avx512), n, 0, bf16});
    for (int n : {1, 2, 4, 5, 8, 12, 16})
      b->Args({int(WeightFormat::FP8_BLOCK128), int(KernelIsa::Avx512), n, 256, bf16});
  }
  // The routed experts' FP4 register path, fp32 FMAs against VDPBF16PS
  // step pairs (linear_fp4_pairs.cpp), in cache and from DRAM.
  for (int bf16 : {0, 1}) {
    for (int n : {1, 2, 4}) b->Args({int(WeightFormat::FP4_BLOCK32), int(KernelIsa::Avx512), n, 0, bf16});
    for (int n : {1, 2, 3}) b->Args({int(WeightFormat::FP4_BLOCK32), int(KernelIsa::Avx512), n, 256, bf16});
  }
}
BENCHMARK(BM_Linear)->Apply(linear_args)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Fp8RoundTrip(benchmark::State& state) {
  const bool reference = state.range(0);
  std::vector<float> x(4096), y;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  std::vector<float> a = x, b = x;
  fp8_round_trip(a.data(), 4096, 128);
  fp8_round_trip_reference(b.data(), 4096, 128);
  if (a != b) {
    state.SkipWithError("fast and reference round trips differ");
    return;
  }
  for (auto _ : state) {
    y = x;
    if (reference)
      fp8_round_trip_reference(y.data(), 4096, 128);
    else
      fp8_round_trip(y.data(), 4096, 128);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * 4096);
  state.SetLabel(reference ? "exhaustive reference" : "fast");
}
BENCHMARK(BM_Fp8RoundTrip)->Arg(0)->Arg(1);

void BM_Hadamard128(benchmark::State& state) {
  std::vector<float> x(128, 0.5f);
  for (auto _ : state) {
    hadamard_transform(x.data(), 128);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * 128);
}
BENCHMARK(BM_Hadamard128);

void BM_RmsNorm4096(benchmark::State& state) {
  std::vector<float> x(4096, 0.25f), w(4096, 1.0f);
  for (auto _ : state) {
    rms_norm(x.data(), w.data(), 4096, 1e-6f);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * 4096);
}
BENCHMARK(BM_RmsNorm4096);

// The fixed-order dot product of the attention scores and norms, checked
// against a long double sum.
void BM_DotFixed(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& v : a) v = nd(rng);
  for (auto& v : b) v = nd(rng);
  long double ref = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i)
    ref += (long double)a[size_t(i)] * b[size_t(i)], mag += std::fabs(a[size_t(i)] * b[size_t(i)]);
  if (std::fabs(double(ref) - dot_fixed(a.data(), b.data(), n)) > 1e-5 * double(mag)) {
    state.SkipWithError("dot_fixed differs from the long double reference");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(dot_fixed(a.data(), b.data(), n));
  state.SetItemsProcessed(int64_t(state.iterations()) * n);
}
BENCHMARK(BM_DotFixed)->Arg(512)->Arg(4096);

// Sink attention of one token over 640 keys (V4-Flash ratio-4 layer: 512
// selected compressed rows + the 128-token window), 16 heads of 512 dims,
// against the per-pair functions it replaces (arg 1; arg 0: the blocked
// kernels). Checked for identical bits before timing.
void BM_AttentionHeads(benchmark::State& state) {
  const bool per_pair = state.range(0) == 1;
  const int64_t heads = 16, n_keys = 640, dim = 512;
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  AlignedVector<float> q(size_t(heads * dim)), k(size_t(n_keys * dim)), p(size_t(heads * n_keys));  // as the model's Buffers
  for (auto* v : {&q, &k, &p})
    for (auto& x : *v) x = nd(rng);
  std::vector<const float*> keys;
  for (int64_t j = 0; j < n_keys; ++j) keys.push_back(k.data() + j * dim);
  std::vector<float> scores(size_t(heads * n_keys)), out(size_t(heads * dim), 0.0f);
  auto run = [&](bool pairs) {
    std::fill(out.begin(), out.end(), 0.0f);
    if (pairs) {
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < n_keys; ++j)
          scores[size_t(h * n_keys + j)] = dot_fixed(q.data() + h * dim, keys[size_t(j)], dim);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < n_keys; ++j)
          add_scaled(out.data() + h * dim, p[size_t(h * n_keys + j)], keys[size_t(j)], dim);
    } else {
      dot_fixed_rows(q.data(), heads, keys.data(), n_keys, dim, scores.data());
      add_scaled_rows(out.data(), heads, p.data(), keys.data(), n_keys, dim);
    }
  };
  run(true);
  const std::vector<float> want_scores = scores, want_out = out;
  run(false);
  if (scores != want_scores || out != want_out) {
    state.SkipWithError("blocked attention differs from the per-pair functions");
    return;
  }
  const int64_t part = state.range(0);  // 2: the scores alone, 3: the weighted sums alone
  for (auto _ : state) {
    if (part == 2)
      dot_fixed_rows(q.data(), heads, keys.data(), n_keys, dim, scores.data());
    else if (part == 3)
      add_scaled_rows(out.data(), heads, p.data(), keys.data(), n_keys, dim);
    else
      run(per_pair);
    benchmark::DoNotOptimize(scores.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["MAC/s"] = benchmark::Counter((part >= 2 ? 1.0 : 2.0) * double(heads * n_keys * dim) *
                                                   double(state.iterations()),
                                               benchmark::Counter::kIsRate);
  const char* labels[] = {"blocked rows", "per-pair dot_fixed + add_scaled", "blocked scores (dot_fixed_rows)",
                          "blocked weighted sums (add_scaled_rows)"};
  state.SetLabel(labels[part]);
}
BENCHMARK(BM_AttentionHeads)->Arg(0)->Arg(1)->Arg(2)->Arg(3);

// The cached rows of a ratio-128 layer at 1M tokens of context, as a decode
// state stores them (448 e4m3 codes with a scale per 64, 64 RoPE floats),
// for `sequences` sequences: 8,192 compressed rows each.
struct StoredHcaRows {
  static constexpr int64_t kDim = 512, kNope = 448, kBlock = 64, kRows = 8192;
  std::vector<uint8_t> codes, scales;
  std::vector<float> rope;
  std::vector<Fp8RowsView> views;
  explicit StoredHcaRows(int64_t sequences, uint32_t seed)
      : codes(size_t(sequences * kRows * kNope)),
        scales(size_t(sequences * kRows * kNope / kBlock)),
        rope(size_t(sequences * kRows * (kDim - kNope))) {
    std::mt19937 rng(seed);
    for (auto& c : codes) c = uint8_t(rng() % 0x7e);  // finite e4m3, positive and small
    for (auto& c : scales) c = uint8_t(120 + rng() % 6);
    std::normal_distribution<float> nd;
    for (auto& x : rope) x = nd(rng) * 0.1f;
    for (int64_t r = 0; r < sequences; ++r)
      views.push_back({codes.data() + r * kRows * kNope, scales.data() + r * kRows * kNope / kBlock,
                       rope.data() + r * kRows * (kDim - kNope), kDim, kNope, kBlock});
  }
};

// A decode row's attention at 1M tokens of context in a ratio-128 layer:
// its 8,192 compressed rows (StoredHcaRows) + the 128-token window, 64 heads
// of 512 dims. Arg 0: the FP8 rows decoded into memory, then the sink
// attention; arg 1: the attention alone over those decoded rows; arg 2: the
// decoding alone; arg 3: the rows handed over as stored, decoded per key
// tile inside the attention (what the model runs since these were
// compared: docs/long_context.md, "Cached rows decoded per key tile"). On
// every compute thread; MAC/s counts the scores' and weighted sums'
// multiply-adds.
void BM_AttentionLongRow(benchmark::State& state) {
  const int part = int(state.range(0));
  const bool with_decode = part == 0 || part == 2, with_attention = part != 2;
  const int64_t heads = 64, dim = StoredHcaRows::kDim, nope = StoredHcaRows::kNope, block = StoredHcaRows::kBlock;
  const int64_t compressed = StoredHcaRows::kRows, window = 128, n_keys = compressed + window;
  const StoredHcaRows stored(1, 10);
  std::mt19937 rng(10);
  std::normal_distribution<float> nd;
  std::vector<float> sink(static_cast<size_t>(heads));
  AlignedVector<float> q(size_t(heads * dim)), window_keys(size_t(window * dim));
  for (auto& x : sink) x = nd(rng) * 0.1f;
  for (auto& x : q) x = nd(rng) * 0.1f;
  for (auto& x : window_keys) x = nd(rng) * 0.1f;
  std::vector<int64_t> ids(static_cast<size_t>(compressed));
  std::iota(ids.begin(), ids.end(), 0);
  AlignedVector<float> decoded(size_t(compressed * dim)), out(size_t(heads * dim));  // as the model's Buffers
  std::vector<const float*> keys, undecoded;
  std::vector<Fp8Key> fp8;
  for (int64_t j = 0; j < compressed; ++j) {
    keys.push_back(decoded.data() + j * dim);
    undecoded.push_back(nullptr);
    fp8.push_back({&stored.views[0], j});
  }
  for (int64_t j = 0; j < window; ++j) {
    keys.push_back(window_keys.data() + j * dim);
    undecoded.push_back(window_keys.data() + j * dim);
    fp8.push_back({});
  }
  const int64_t key_begin[2] = {0, n_keys};
  const KernelBackend& kb = default_backend();
  kb.decode_fp8_rows(stored.views[0], ids.data(), compressed, decoded.data());
  const float scale = 1.0f / std::sqrt(float(dim));
  for (auto _ : state) {
    if (with_decode) kb.decode_fp8_rows(stored.views[0], ids.data(), compressed, decoded.data());
    if (part == 3)
      kb.sink_attention(
          {q.data(), 1, heads, dim, undecoded.data(), key_begin, sink.data(), scale, out.data(), fp8.data()});
    else if (with_attention)
      kb.sink_attention({q.data(), 1, heads, dim, keys.data(), key_begin, sink.data(), scale, out.data()});
    benchmark::DoNotOptimize(out.data());
  }
  if (with_attention)
    state.counters["MAC/s"] =
        benchmark::Counter(2.0 * double(heads * n_keys * dim) * double(state.iterations()), benchmark::Counter::kIsRate);
  // Bytes the decode writes (the floats) and reads (codes, scales, RoPE floats).
  if (with_decode)
    state.counters["decode B/s"] = benchmark::Counter(
        double(compressed * (dim * 4 + nope + nope / block + (dim - nope) * 4)) * double(state.iterations()),
        benchmark::Counter::kIsRate);
  const char* labels[] = {"FP8 rows decoded + attention", "attention over decoded rows", "FP8 rows decoded alone",
                          "stored FP8 rows, decoded per key tile"};
  state.SetLabel(labels[part]);
}
BENCHMARK(BM_AttentionLongRow)->Arg(0)->Arg(1)->Arg(2)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

// A decode step of `rows` sequences at 1M tokens of context in a ratio-128
// layer, all in one call, as the model makes it for a batch: each its own
// 8,192 compressed rows + 128 window rows. Arg 1 = 0: over rows decoded
// into memory beforehand (the decoding not timed); 1: the compressed rows
// as stored, decoded per key tile inside the attention.
void BM_AttentionLongRows(benchmark::State& state) {
  const int64_t rows = state.range(0), heads = 64, dim = StoredHcaRows::kDim, compressed = StoredHcaRows::kRows;
  const int64_t window = 128, n_keys = compressed + window;
  const bool as_stored = state.range(1) == 1;
  const StoredHcaRows stored(rows, 11);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  AlignedVector<float> decoded(size_t(rows * compressed * dim)), window_keys(size_t(rows * window * dim)),
      q(size_t(rows * heads * dim)), out(size_t(rows * heads * dim));
  std::vector<float> sink(static_cast<size_t>(heads));
  for (auto& x : window_keys) x = nd(rng) * 0.1f;
  for (auto& x : q) x = nd(rng) * 0.1f;
  for (auto& x : sink) x = nd(rng) * 0.1f;
  std::vector<int64_t> ids(static_cast<size_t>(compressed));
  std::iota(ids.begin(), ids.end(), 0);
  const KernelBackend& kb = default_backend();
  std::vector<const float*> keys;
  std::vector<Fp8Key> fp8;
  std::vector<int64_t> key_begin{0};
  for (int64_t r = 0; r < rows; ++r) {
    kb.decode_fp8_rows(stored.views[size_t(r)], ids.data(), compressed, decoded.data() + r * compressed * dim);
    for (int64_t j = 0; j < compressed; ++j) {
      keys.push_back(as_stored ? nullptr : decoded.data() + (r * compressed + j) * dim);
      fp8.push_back({&stored.views[size_t(r)], j});
    }
    for (int64_t j = 0; j < window; ++j) {
      keys.push_back(window_keys.data() + (r * window + j) * dim);
      fp8.push_back({});
    }
    key_begin.push_back(key_begin.back() + n_keys);
  }
  for (auto _ : state) {
    kb.sink_attention({q.data(), rows, heads, dim, keys.data(), key_begin.data(), sink.data(),
                       1.0f / std::sqrt(float(dim)), out.data(), as_stored ? fp8.data() : nullptr});
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["MAC/s"] = benchmark::Counter(2.0 * double(rows * heads * n_keys * dim) * double(state.iterations()),
                                               benchmark::Counter::kIsRate);
  state.SetLabel(as_stored ? "stored FP8 rows, decoded per key tile" : "over decoded rows");
}
BENCHMARK(BM_AttentionLongRows)
    ->Args({2, 0})
    ->Args({2, 1})
    ->Args({4, 0})
    ->Args({4, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The lightning indexer scoring one decode row against 4096 FP4 keys (64
// heads x 128 dims, V4-Flash), on one thread: arg 0 the integer FP4 scores
// (VPDPBUSD where the CPU has AVX512-VNNI) of keys whose block scales lie up
// to 2^7 apart (per block), arg 2 the same with scales at most 2^2 apart
// (the VNNI kernel's one sum per head: docs/long_context.md, "One integer
// sum across the blocks"), arg 1 the fp32 path (dot_fixed rows over decoded
// key tiles), which a query off the FP4 grid takes.
void BM_IndexerScores(benchmark::State& state) {
  const bool fp32 = state.range(0) == 1, one_sum = state.range(0) == 2;
  const int64_t heads = 64, dim = 128, keys = 4096;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<uint8_t> nibbles(size_t(keys * dim / 2)), scales(size_t(keys * dim / 32));
  for (auto& b : nibbles) b = uint8_t(rng());
  for (auto& v : scales) v = uint8_t(118 + rng() % (one_sum ? 3 : 8));
  std::vector<float> q(static_cast<size_t>(heads * dim)), weights(static_cast<size_t>(heads));
  for (auto& v : q) v = nd(rng);
  for (auto& v : weights) v = nd(rng);
  for (int64_t h = 0; h < heads; ++h) fp4_round_trip(q.data() + h * dim, dim, 32);
  if (fp32) q[0] = std::nextafter(q[0], 100.0f);  // off the FP4 grid
  const Fp4RowsView view{nibbles.data(), scales.data(), dim, 32};
  const int64_t visible = keys;
  std::vector<std::vector<int32_t>> selected;
  const IndexerSelect problem{q.data(), weights.data(), 1, heads, dim, &view, &visible, 512, &selected};
  std::vector<float> scores(static_cast<size_t>(keys));
  const KernelIsa isa = best_kernel_isa();
  for (auto _ : state) {
    cpu::indexer_row_scores(isa, problem, 0, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.counters["MAC/s"] =
      benchmark::Counter(double(heads * dim * keys) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(fp32                             ? "fp32 dot_fixed tiles"
                 : !cpu::fp4_scores_use_vnni(isa) ? "integer FP4"
                 : one_sum                        ? "integer FP4 (VNNI), scales at most 2^2 apart"
                                                  : "integer FP4 (VNNI), scales up to 2^7 apart");
}
BENCHMARK(BM_IndexerScores)->Arg(0)->Arg(2)->Arg(1)->Unit(benchmark::kMicrosecond);

// Hyper-connections of one V4-Flash block side (hc_mult 4 copies of 4096):
// hc_pre (the fp32 mix projection, Sinkhorn, the collapse) then hc_post
// (the expansion back into the copies), for n tokens; checked first against
// a float64 evaluation of the definition (architecture.md 4.2).
void BM_HyperConnections(benchmark::State& state) {
  const int64_t n = state.range(0);
  ModelConfig c;
  c.dim = 4096;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6f;
  c.norm_eps = 1e-6f;
  const int64_t h = c.hc_mult, width = h * c.dim, mixes = c.hc_mix();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> fn(size_t(mixes * width)), x(size_t(n * width)), y(size_t(n * c.dim)), sub(size_t(n * c.dim));
  for (auto& v : fn) v = 0.01f * nd(rng);
  for (auto& v : x) v = nd(rng);
  for (auto& v : sub) v = nd(rng);
  struct {
    Linear fn;
    std::vector<float> base, scale;
  } w;
  w.fn.format = WeightFormat::F32;
  w.fn.rows = mixes;
  w.fn.cols = width;
  w.fn.data = reinterpret_cast<const uint8_t*>(fn.data());
  for (int64_t i = 0; i < mixes; ++i) w.base.push_back(0.1f * nd(rng));
  w.scale = {0.5f, 0.7f, 0.9f};
  const HcShape shape{c.hc_mult, c.dim, c.hc_sinkhorn_iters, c.hc_eps, c.norm_eps};
  const HcSite site{&w.fn, w.base.data(), w.scale.data()};
  const KernelBackend& kb = default_backend();

  // The float64 reference for the first token.
  std::vector<double> mix(static_cast<size_t>(mixes));
  double ss = 0;
  for (int64_t i = 0; i < width; ++i) ss += double(x[size_t(i)]) * x[size_t(i)];
  const double inv = 1.0 / std::sqrt(ss / double(width) + c.norm_eps);
  for (int64_t m = 0; m < mixes; ++m) {
    double d = 0;
    for (int64_t i = 0; i < width; ++i) d += double(fn[size_t(m * width + i)]) * x[size_t(i)];
    mix[size_t(m)] = d * inv;
  }
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  std::vector<double> pre(static_cast<size_t>(h)), post(static_cast<size_t>(h)), comb(static_cast<size_t>(h * h));
  for (int64_t j = 0; j < h; ++j) {
    pre[size_t(j)] = sig(mix[size_t(j)] * w.scale[0] + w.base[size_t(j)]) + c.hc_eps;
    post[size_t(j)] = 2.0 * sig(mix[size_t(h + j)] * w.scale[1] + w.base[size_t(h + j)]);
  }
  for (int64_t j = 0; j < h; ++j) {
    double m = -INFINITY, sum = 0;
    for (int64_t k = 0; k < h; ++k)
      m = std::max(m, mix[size_t(2 * h + j * h + k)] * w.scale[2] + w.base[size_t(2 * h + j * h + k)]);
    for (int64_t k = 0; k < h; ++k)
      sum += comb[size_t(j * h + k)] =
          std::exp(mix[size_t(2 * h + j * h + k)] * w.scale[2] + w.base[size_t(2 * h + j * h + k)] - m);
    for (int64_t k = 0; k < h; ++k) comb[size_t(j * h + k)] = comb[size_t(j * h + k)] / sum + c.hc_eps;
  }
  for (int64_t it = 0; it < c.hc_sinkhorn_iters; ++it) {
    if (it > 0)
      for (int64_t j = 0; j < h; ++j) {
        double r = 0;
        for (int64_t k = 0; k < h; ++k) r += comb[size_t(j * h + k)];
        for (int64_t k = 0; k < h; ++k) comb[size_t(j * h + k)] /= r + c.hc_eps;
      }
    for (int64_t k = 0; k < h; ++k) {
      double col = 0;
      for (int64_t j = 0; j < h; ++j) col += comb[size_t(j * h + k)];
      for (int64_t j = 0; j < h; ++j) comb[size_t(j * h + k)] /= col + c.hc_eps;
    }
  }
  HcMix got;
  std::vector<float> x_out = x;
  kb.hc_pre(shape, site, x_out.data(), n, y.data(), &got);
  kb.hc_post(shape, got, sub.data(), x_out.data(), n);
  double worst = 0;
  auto compare = [&](double want, double have) {
    worst = std::max(worst, std::fabs(want - have) / (std::fabs(want) + 1e-3));
  };
  for (int64_t d = 0; d < c.dim; ++d) {
    double collapsed = 0;
    for (int64_t j = 0; j < h; ++j) collapsed += pre[size_t(j)] * x[size_t(j * c.dim + d)];
    compare(collapsed, y[size_t(d)]);
    for (int64_t k = 0; k < h; ++k) {
      double v = post[size_t(k)] * sub[size_t(d)];
      for (int64_t j = 0; j < h; ++j) v += comb[size_t(j * h + k)] * x[size_t(j * c.dim + d)];
      compare(v, x_out[size_t(k * c.dim + d)]);
    }
  }
  if (worst > 1e-3) {
    state.SkipWithError("hyper-connections differ from the float64 definition");
    return;
  }
  for (auto _ : state) {
    kb.hc_pre(shape, site, x.data(), n, y.data(), &got);
    kb.hc_post(shape, got, sub.data(), x_out.data(), n);
    benchmark::DoNotOptimize(x_out.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(double(n) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel("worst relative error vs float64 " + std::to_string(worst));
}
BENCHMARK(BM_HyperConnections)->Arg(1)->Arg(16)->Arg(512)->UseRealTime();

// Indexer / router top-k (ties to the lower index), checked against a full
// sort; n = compressed rows of a 4K..1M context at ratio 4, k = V4-Flash's 512
// (from 4096 rows the histogram path, below it nth_element).
void BM_TopK(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  std::vector<float> s(static_cast<size_t>(n));
  std::mt19937 rng(6);
  for (auto& v : s) v = float(rng() % 100000) / 1000.0f;  // ties happen
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return s[size_t(x)] > s[size_t(y)]; });
  order.resize(size_t(std::min(k, n)));
  std::sort(order.begin(), order.end());
  if (top_k_indices(s.data(), n, k) != order) {
    state.SkipWithError("top_k_indices differs from the full-sort reference");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(top_k_indices(s.data(), n, k));
  state.SetItemsProcessed(int64_t(state.iterations()) * n);
}
BENCHMARK(BM_TopK)->Args({1024, 512})->Args({16384, 512})->Args({262144, 512})->Args({256, 6});

// The attention's softmax with a sink over one head's 640 scores, and the
// sampler's normalizer over a 129,280-token vocabulary (arg: 0 scalar,
// 1 AVX2, 2 AVX-512), each checked against the scalar path's bits first.
KernelIsa isa_arg(int64_t arg) { return arg == 2 ? KernelIsa::Avx512 : arg == 1 ? KernelIsa::Avx2 : KernelIsa::Scalar; }

void BM_SoftmaxWithSink(benchmark::State& state) {
  const KernelIsa isa = isa_arg(state.range(0));
  if (!kernel_isa_supported(isa)) return state.SkipWithError("path not supported here");
  std::mt19937 rng(10);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  std::vector<float> scores(640);
  for (float& v : scores) v = nd(rng);
  std::vector<float> want = scores, got = scores;
  softmax_with_sink(want.data(), 640, 0.0442f, 1.0f, KernelIsa::Scalar);
  softmax_with_sink(got.data(), 640, 0.0442f, 1.0f, isa);
  if (want != got) return state.SkipWithError("differs from the scalar path");
  for (auto _ : state) {
    got = scores;
    softmax_with_sink(got.data(), 640, 0.0442f, 1.0f, isa);
    benchmark::DoNotOptimize(got.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * 640);
  state.SetLabel(kernel_isa_name(isa));
}
BENCHMARK(BM_SoftmaxWithSink)->Arg(0)->Arg(1)->Arg(2);

void BM_SamplerNormalizer(benchmark::State& state) {
  const KernelIsa isa = isa_arg(state.range(0));
  if (!kernel_isa_supported(isa)) return state.SkipWithError("path not supported here");
  const int64_t vocab = 129280;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& v : logits) v = nd(rng);
  const double top = *std::max_element(logits.begin(), logits.end());
  const double want = exp_sum_f64(logits.data(), vocab, top, nullptr, KernelIsa::Scalar);
  if (exp_sum_f64(logits.data(), vocab, top, nullptr, isa) != want) return state.SkipWithError("differs from scalar");
  for (auto _ : state) benchmark::DoNotOptimize(exp_sum_f64(logits.data(), vocab, top, nullptr, isa));
  state.SetItemsProcessed(int64_t(state.iterations()) * vocab);
  state.SetLabel(kernel_isa_name(isa));
}
BENCHMARK(BM_SamplerNormalizer)->Arg(0)->Arg(1)->Arg(2);

}  // namespace
}  // namespace dsv4

BENCHMARK_MAIN();
