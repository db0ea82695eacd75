#include "model/synthetic_state.h"

#include <vector>

#include "core/error.h"
#include "core/numeric.h"

namespace dsv4 {

namespace {

// Values spread like normalised activations (uniform in [-2, 2), from a
// 64-bit xorshift: a million rows of 512 values take about a second).
struct RandomRows {
  uint64_t state;
  explicit RandomRows(uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 1) {}
  void fill(float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      out[i] = float(int64_t(state >> 40) - (int64_t(1) << 23)) * 0x1p-22f;
    }
  }
};

// Rows rounded the way the forward pass rounds what it caches.
void fill_kv(KvRows& rows, int64_t count, int64_t nope, int64_t block, RandomRows& rng) {
  std::vector<float> row(static_cast<size_t>(rows.width()));
  rows.resize(0);
  for (int64_t r = 0; r < count; ++r) {
    rng.fill(row.data(), rows.width());
    fp8_round_trip(row.data(), nope, block);
    rows.append(row.data());
  }
}

void fill_fp4(Fp4Rows& rows, int64_t count, int64_t width, bool e4m3, RandomRows& rng) {
  std::vector<float> row(static_cast<size_t>(width));
  rows.resize(0);
  for (int64_t r = 0; r < count; ++r) {
    rng.fill(row.data(), width);
    if (e4m3) {
      rows.append_rounding(row.data());
    } else {
      fp4_round_trip(row.data(), width, 32);
      rows.append(row.data());
    }
  }
}

}  // namespace

SequenceState synthetic_context_state(const ModelConfig& c, int64_t tokens, uint64_t seed) {
  if (tokens < c.window) throw Error("a synthetic context needs at least the window's tokens");
  SequenceState s;
  s.reset(c);
  RandomRows rng(seed);
  const int64_t window_nope = c.v41 ? c.head_dim : c.nope_dim(), window_block = c.v41 ? 32 : 64;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerState& layer = s.layers[size_t(l)];
    const LayerLayout& layout = layer.layout;
    // The ring's slots in position order (slot p % window).
    fill_kv(layer.window, c.window, window_nope, window_block, rng);
    if (!layout.owns_compressor(l)) continue;
    const int64_t rows = tokens / layout.ratio;
    if (layout.kind == LayerKind::Grouped) {
      fill_fp4(layer.compressed_fp4, rows, c.head_dim, /*e4m3=*/true, rng);
      fill_fp4(layer.index_keys, rows, c.index_head_dim, false, rng);
    } else {
      fill_kv(layer.compressed, rows, c.nope_dim(), 64, rng);
      if (layout.has_indexer()) fill_fp4(layer.index_keys, rows, c.index_head_dim, false, rng);
    }
  }
  s.n_tokens = tokens;
  if (c.v41) {
    s.tokens.resize(size_t(tokens));
    uint64_t x = seed + 1;
    for (auto& t : s.tokens) x = x * 6364136223846793005ull + 1442695040888963407ull, t = int32_t((x >> 33) % uint64_t(c.vocab_size));
  }
  return s;
}

}  // namespace dsv4
