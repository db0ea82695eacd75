#include "model/state.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace dsv4 {

void CompressorState::reset(int64_t slots, int64_t slot_width) {
  kv.assign(size_t(slots * slot_width), 0.0f);
  score.assign(size_t(slots * slot_width), -std::numeric_limits<float>::infinity());
  journal.clear();
}

void CompressorState::save(int64_t position, int64_t offset, int64_t count) {
  if (!journaling) return;
  journal.push_back({position, offset, std::vector<float>(kv.begin() + offset, kv.begin() + offset + count),
                     std::vector<float>(score.begin() + offset, score.begin() + offset + count)});
}

// Entries are recorded in position order for each slot, so undoing the
// later ones newest first leaves each slot as its last earlier write left it.
void CompressorState::undo_from(int64_t position) {
  while (!journal.empty() && journal.back().position >= position) {
    const Undo& u = journal.back();
    std::copy(u.kv.begin(), u.kv.end(), kv.begin() + u.offset);
    std::copy(u.score.begin(), u.score.end(), score.begin() + u.offset);
    journal.pop_back();
  }
}

void LayerState::write_window(int64_t position, const float* row) {
  const int64_t slot = position % window.rows();
  if (journaling) {
    WindowUndo u{position, slot, std::vector<uint8_t>(size_t(window.row_bytes()))};
    window.copy_row_bytes(slot, u.bytes.data());
    window_journal.push_back(std::move(u));
  }
  window.set(slot, row);
}

void LayerState::set_journaling(bool on) {
  journaling = compressor.journaling = index_compressor.journaling = on;
  if (!on) {
    window_journal.clear();
    compressor.journal.clear();
    index_compressor.journal.clear();
  }
}

void LayerState::rollback(int64_t tokens) {
  while (!window_journal.empty() && window_journal.back().position >= tokens) {
    window.restore_row_bytes(window_journal.back().slot, window_journal.back().bytes.data());
    window_journal.pop_back();
  }
  compressor.undo_from(tokens);
  index_compressor.undo_from(tokens);
  if (layout.compresses()) {
    compressed.resize(std::min(compressed.rows(), tokens / layout.ratio));
    compressed_fp4.resize(std::min(compressed_fp4.rows(), tokens / layout.ratio));
    index_keys.resize(std::min(index_keys.rows(), tokens / layout.ratio));
  }
}

// V4 rounds a window row's first `nope` dims in 64-blocks and keeps the
// rotated dims; V4.1 rounds the whole row in 32-blocks.
static KvRows window_rows(const ModelConfig& c) {
  return c.v41 ? KvRows(c.head_dim, c.head_dim, 32) : KvRows(c.head_dim, c.nope_dim());
}

static void reset_layer(LayerState& s, const ModelConfig& c, const LayerLayout& layout, int64_t layer) {
  s.layout = layout;
  s.window = window_rows(c);
  s.window.resize(c.window);
  s.compressed = KvRows(c.head_dim, c.nope_dim());
  s.compressed_fp4 = Fp4Rows(c.head_dim, 16, Fp4Scale::E4m3);
  s.index_keys = Fp4Rows(c.index_head_dim > 0 ? c.index_head_dim : 2);
  s.compressor = {};
  s.index_compressor = {};
  s.set_journaling(false);
  if (layout.kind == LayerKind::Grouped) {
    // Only the KV source keeps a partial group (ratio 1 completes a row
    // with every token).
    if (layout.owns_compressor(layer) && layout.ratio > 1) s.compressor.reset(layout.ratio, c.head_dim);
  } else if (layout.compresses()) {
    const int64_t copies = layout.overlapping() ? 2 : 1;
    s.compressor.reset(copies * layout.ratio, copies * c.head_dim);
    if (layout.has_indexer()) s.index_compressor.reset(2 * layout.ratio, 2 * c.index_head_dim);
  }
}

void SequenceState::reset(const ModelConfig& c) {
  n_tokens = 0;
  mtp_tokens = 0;
  checkpoint_tokens_ = checkpoint_mtp_tokens_ = -1;
  layers.resize(size_t(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) reset_layer(layers[size_t(l)], c, layer_layout(c, l), l);
  mtp_layers.resize(size_t(c.n_mtp_layers));
  for (int64_t k = 0; k < c.n_mtp_layers; ++k)
    reset_layer(mtp_layers[size_t(k)], c, layer_layout(c, c.n_layers + k), c.n_layers + k);
  dspark_tokens = 0;
  dspark_rings.assign(size_t(c.dspark_stages), window_rows(c));
  tokens.clear();
  for (KvRows& ring : dspark_rings) ring.resize(c.window);
}

void SequenceState::checkpoint() {
  for (auto& l : layers) l.set_journaling(false), l.set_journaling(true);
  for (auto& l : mtp_layers) l.set_journaling(false), l.set_journaling(true);
  checkpoint_tokens_ = n_tokens;
  checkpoint_mtp_tokens_ = mtp_tokens;
}

void SequenceState::rollback(int64_t tokens, int64_t mtp) {
  if (!has_checkpoint()) throw Error("rollback without a checkpoint");
  if (mtp < 0) mtp = std::min(mtp_tokens, tokens);
  if (tokens < checkpoint_tokens_ || tokens > n_tokens || mtp < checkpoint_mtp_tokens_ || mtp > mtp_tokens)
    throw Error("rollback to " + std::to_string(tokens) + " tokens is outside [" + std::to_string(checkpoint_tokens_) +
                ", " + std::to_string(n_tokens) + "]");
  for (auto& l : layers) l.rollback(tokens);
  for (auto& l : mtp_layers) l.rollback(mtp);
  if (int64_t(this->tokens.size()) > tokens) this->tokens.resize(size_t(tokens));
  n_tokens = tokens;
  mtp_tokens = mtp;
}

void SequenceState::end_checkpoint() {
  for (auto& l : layers) l.set_journaling(false);
  for (auto& l : mtp_layers) l.set_journaling(false);
  checkpoint_tokens_ = checkpoint_mtp_tokens_ = -1;
}

namespace {
constexpr uint32_t kSnapshotMagic = 0x34565344;  // "DSV4"
constexpr uint64_t kSnapshotVersion = 3;         // 2: compact rows; 3: V4.1 rows and token ids

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
  void blob(const std::vector<uint8_t>& v) {
    u64(v.size());
    bytes(v.data(), v.size());
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t pos = 0;
  void bytes(void* p, size_t n) {
    if (n > in.size() - pos) throw Error("decode-state snapshot is truncated");
    if (n > 0) std::memcpy(p, in.data() + pos, n);  // (an empty vector's data() may be null)
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
  std::vector<uint8_t> blob() {
    uint64_t n = u64();
    if (n > in.size() - pos) throw Error("decode-state snapshot is truncated");
    std::vector<uint8_t> v(n);
    bytes(v.data(), n);
    return v;
  }
};

void write_layer(Writer& w, const LayerState& s) {
  w.u64(uint64_t(s.window.rows()));
  w.blob(s.window.bytes());
  w.u64(uint64_t(s.compressed.rows()));
  w.blob(s.compressed.bytes());
  w.u64(uint64_t(s.index_keys.rows()));
  w.blob(s.index_keys.bytes());
  w.u64(uint64_t(s.compressed_fp4.rows()));
  w.blob(s.compressed_fp4.bytes());
  w.floats(s.compressor.kv);
  w.floats(s.compressor.score);
  w.floats(s.index_compressor.kv);
  w.floats(s.index_compressor.score);
}

// `s` was reset for the model: its row formats and sizes are the model's.
void read_layer(Reader& r, LayerState& s) {
  auto check_floats = [&](std::vector<float>& v) {
    const size_t expected = v.size();
    r.floats(v);
    if (v.size() != expected) throw Error("decode-state snapshot does not match the model's state layout");
  };
  int64_t rows = int64_t(r.u64());
  if (rows != s.window.rows()) throw Error("decode-state snapshot does not match the model's window");
  s.window.set_bytes(r.blob(), rows);
  rows = int64_t(r.u64());
  s.compressed.set_bytes(r.blob(), rows);
  rows = int64_t(r.u64());
  s.index_keys.set_bytes(r.blob(), rows);
  rows = int64_t(r.u64());
  s.compressed_fp4.set_bytes(r.blob(), rows);
  check_floats(s.compressor.kv);
  check_floats(s.compressor.score);
  check_floats(s.index_compressor.kv);
  check_floats(s.index_compressor.score);
}
}  // namespace

std::vector<uint8_t> SequenceState::snapshot() const {
  Writer w;
  w.u64(kSnapshotMagic);
  w.u64(kSnapshotVersion);
  w.u64(uint64_t(n_tokens));
  w.u64(uint64_t(mtp_tokens));
  w.u64(layers.size());
  w.u64(mtp_layers.size());
  for (auto& l : layers) write_layer(w, l);
  for (auto& l : mtp_layers) write_layer(w, l);
  w.u64(tokens.size());
  w.bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  return std::move(w.out);
}

// `this` must have been reset for the model the snapshot came from.
void SequenceState::restore(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  if (r.u64() != kSnapshotMagic) throw Error("not a decode-state snapshot");
  if (r.u64() != kSnapshotVersion) throw Error("decode-state snapshot of another format version");
  SequenceState s = *this;
  s.end_checkpoint();
  s.n_tokens = int64_t(r.u64());
  s.mtp_tokens = int64_t(r.u64());
  uint64_t n_layers = r.u64(), n_mtp = r.u64();
  if (n_layers != layers.size() || n_mtp != mtp_layers.size())
    throw Error("decode-state snapshot belongs to a model with a different layer count");
  for (auto& l : s.layers) read_layer(r, l);
  for (auto& l : s.mtp_layers) read_layer(r, l);
  const uint64_t n_ids = r.u64();
  if (n_ids > uint64_t(s.n_tokens)) throw Error("decode-state snapshot holds more token ids than tokens");
  s.tokens.resize(size_t(n_ids));
  r.bytes(s.tokens.data(), n_ids * sizeof(int32_t));
  if (r.pos != bytes.size()) throw Error("decode-state snapshot has trailing bytes");
  *this = std::move(s);
}

int64_t SequenceState::memory_bytes() const {
  int64_t total = 0;
  auto add = [&](const LayerState& l) {
    total += l.window.memory_bytes() + l.compressed.memory_bytes() + l.index_keys.memory_bytes() +
             l.compressed_fp4.memory_bytes() +
             int64_t(l.compressor.kv.size() + l.compressor.score.size() + l.index_compressor.kv.size() +
                     l.index_compressor.score.size()) *
                 4;
  };
  for (auto& l : layers) add(l);
  for (auto& l : mtp_layers) add(l);
  for (auto& ring : dspark_rings) total += ring.memory_bytes();
  return total + int64_t(tokens.size() * sizeof(int32_t));
}

}  // namespace dsv4
