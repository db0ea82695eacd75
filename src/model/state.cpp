#include "model/state.h"

#include <cstring>
#include <limits>

#include "core/error.h"
#include "model/layer_kind.h"

namespace dsv4 {

void CompressorState::reset(int64_t slots, int64_t slot_width) {
  kv.assign(size_t(slots * slot_width), 0.0f);
  score.assign(size_t(slots * slot_width), -std::numeric_limits<float>::infinity());
}

static void reset_layer(LayerState& s, const ModelConfig& c, const LayerLayout& layout) {
  s.window.assign(size_t(c.window * c.head_dim), 0.0f);
  s.compressed.clear();
  s.index_keys.clear();
  s.compressor = {};
  s.index_compressor = {};
  if (layout.compresses()) {
    const int64_t copies = layout.overlapping() ? 2 : 1;
    s.compressor.reset(copies * layout.ratio, copies * c.head_dim);
    if (layout.has_indexer()) s.index_compressor.reset(2 * layout.ratio, 2 * c.index_head_dim);
  }
}

void SequenceState::reset(const ModelConfig& c) {
  n_tokens = 0;
  mtp_tokens = 0;
  layers.resize(size_t(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) reset_layer(layers[size_t(l)], c, layer_layout(c, l));
  mtp_layers.resize(size_t(c.n_mtp_layers));
  for (int64_t k = 0; k < c.n_mtp_layers; ++k)
    reset_layer(mtp_layers[size_t(k)], c, layer_layout(c, c.n_layers + k));
}

namespace {
constexpr uint32_t kSnapshotMagic = 0x34565344;  // "DSV4"

struct Writer {
  std::vector<uint8_t> out;
  void u64(uint64_t v) { bytes(&v, 8); }
  void bytes(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  void floats(const std::vector<float>& v) {
    u64(v.size());
    bytes(v.data(), v.size() * sizeof(float));
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t pos = 0;
  void bytes(void* p, size_t n) {
    if (n > in.size() - pos) throw Error("decode-state snapshot is truncated");
    std::memcpy(p, in.data() + pos, n);
    pos += n;
  }
  uint64_t u64() {
    uint64_t v;
    bytes(&v, 8);
    return v;
  }
  void floats(std::vector<float>& v) {
    uint64_t n = u64();
    if (n > (in.size() - pos) / sizeof(float)) throw Error("decode-state snapshot is truncated");
    v.resize(n);
    bytes(v.data(), n * sizeof(float));
  }
};

void write_layer(Writer& w, const LayerState& s) {
  w.floats(s.window);
  w.floats(s.compressed);
  w.floats(s.index_keys);
  w.floats(s.compressor.kv);
  w.floats(s.compressor.score);
  w.floats(s.index_compressor.kv);
  w.floats(s.index_compressor.score);
}

void read_layer(Reader& r, LayerState& s) {
  r.floats(s.window);
  r.floats(s.compressed);
  r.floats(s.index_keys);
  r.floats(s.compressor.kv);
  r.floats(s.compressor.score);
  r.floats(s.index_compressor.kv);
  r.floats(s.index_compressor.score);
}
}  // namespace

std::vector<uint8_t> SequenceState::snapshot() const {
  Writer w;
  w.u64(kSnapshotMagic);
  w.u64(uint64_t(n_tokens));
  w.u64(uint64_t(mtp_tokens));
  w.u64(layers.size());
  w.u64(mtp_layers.size());
  for (auto& l : layers) write_layer(w, l);
  for (auto& l : mtp_layers) write_layer(w, l);
  return std::move(w.out);
}

void SequenceState::restore(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  if (r.u64() != kSnapshotMagic) throw Error("not a decode-state snapshot");
  SequenceState s;
  s.n_tokens = int64_t(r.u64());
  s.mtp_tokens = int64_t(r.u64());
  uint64_t n_layers = r.u64(), n_mtp = r.u64();
  if (n_layers != layers.size() || n_mtp != mtp_layers.size())
    throw Error("decode-state snapshot belongs to a model with a different layer count");
  s.layers.resize(n_layers);
  s.mtp_layers.resize(n_mtp);
  for (auto& l : s.layers) read_layer(r, l);
  for (auto& l : s.mtp_layers) read_layer(r, l);
  if (r.pos != bytes.size()) throw Error("decode-state snapshot has trailing bytes");
  *this = std::move(s);
}

int64_t SequenceState::memory_bytes() const {
  int64_t total = 0;
  auto add = [&](const LayerState& l) {
    total += int64_t(l.window.size() + l.compressed.size() + l.index_keys.size() +
                     l.compressor.kv.size() + l.compressor.score.size() +
                     l.index_compressor.kv.size() + l.index_compressor.score.size()) *
             4;
  };
  for (auto& l : layers) add(l);
  for (auto& l : mtp_layers) add(l);
  return total;
}

}  // namespace dsv4
