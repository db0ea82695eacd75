#include "model/state_parts.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace dsv4 {

namespace {

constexpr uint64_t kRowsMagic = 0x53574f52;  // "ROWS"
constexpr uint64_t kTailMagic = 0x4c494154;  // "TAIL"

struct Out {
  std::vector<uint8_t> bytes;
  void u64(uint64_t v) { raw(&v, 8); }
  void raw(const void* p, size_t n) {
    if (n == 0) return;  // (an empty vector's data() may be null)
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  uint8_t* grow(size_t n) {
    bytes.resize(bytes.size() + n);
    return bytes.data() + bytes.size() - n;
  }
};

struct In {
  const uint8_t* data;
  size_t size, pos = 0;
  const uint8_t* take(size_t n) {
    if (n > size - pos) throw Error("prefix-cache state part is truncated");
    const uint8_t* p = data + pos;
    pos += n;
    return p;
  }
  uint64_t u64() {
    uint64_t v;
    std::memcpy(&v, take(8), 8);
    return v;
  }
};

std::vector<const LayerState*> all_layers(const SequenceState& s) {
  std::vector<const LayerState*> out;
  for (auto& l : s.layers) out.push_back(&l);
  for (auto& l : s.mtp_layers) out.push_back(&l);
  return out;
}

// Rows of a container after `t` tokens: t / ratio for a container the layer
// fills (it holds rows, or none are complete yet), none for one it does not.
int64_t rows_at(int64_t rows_now, int64_t ratio, int64_t t) { return ratio > 0 && rows_now > 0 ? t / ratio : 0; }

template <typename Rows>
void put_rows(Out& o, const Rows& rows, int64_t ratio, int64_t from, int64_t to) {
  const int64_t r0 = rows_at(rows.rows(), ratio, from), r1 = rows_at(rows.rows(), ratio, to);
  if (r1 > rows.rows()) throw Error("prefix cache: the state holds fewer rows than its token count");
  o.u64(uint64_t(r1 - r0));
  rows.copy_rows(r0, r1, o.grow(size_t((r1 - r0) * rows.row_bytes())));
}

template <typename Rows>
void get_rows(In& in, Rows& rows, int64_t ratio, int64_t from, int64_t to) {
  const int64_t n = int64_t(in.u64());
  if (n < 0 || n > int64_t(1) << 40) throw Error("prefix-cache rows: bad row count");
  if (n > 0 && (ratio <= 0 || rows.rows() != from / ratio || n != to / ratio - from / ratio))
    throw Error("prefix-cache rows do not continue the state at this position");
  if (n == 0 && rows.rows() > 0 && ratio > 0 && to / ratio != from / ratio)
    throw Error("prefix-cache rows miss rows the state needs");
  const size_t bytes = size_t(n * rows.row_bytes());
  rows.append_rows(in.take(bytes), n);
}

// Slots of a compressor's partial window that a later token reads, as a
// count of floats from the start: a non-overlapping compressor rewrites
// every slot of a window before pooling it, so only the first `tokens %
// ratio` slots (this window's tokens so far) matter; an overlapping one
// reads the previous window too: all of them.
size_t live_floats(const CompressorState& c, const LayerLayout& layout, int64_t tokens) {
  if (c.kv.empty() || layout.overlapping() || layout.ratio <= 0) return c.kv.size();
  const size_t slot = c.kv.size() / size_t(layout.ratio);
  return slot * size_t(tokens % layout.ratio);
}

void put_floats(Out& o, const std::vector<float>& v, size_t n) {
  o.u64(n);
  o.raw(v.data(), n * sizeof(float));
}

// The stale slots get the values of a fresh state (never read either way).
void get_floats(In& in, std::vector<float>& v, float fill) {
  const uint64_t n = in.u64();
  if (n > v.size()) throw Error("prefix-cache tail does not match the model's compressor layout");
  const uint8_t* src = in.take(n * sizeof(float));
  if (n > 0) std::memcpy(v.data(), src, n * sizeof(float));  // (an empty vector's data() may be null)
  std::fill(v.begin() + int64_t(n), v.end(), fill);
}

}  // namespace

std::vector<uint8_t> state_rows(const SequenceState& s, int64_t from, int64_t to) {
  if (from < 0 || to < from || to > s.n_tokens) throw Error("prefix cache: rows outside the state");
  Out o;
  o.u64(kRowsMagic);
  o.u64(uint64_t(from));
  o.u64(uint64_t(to));
  const auto layers = all_layers(s);
  o.u64(layers.size());
  for (const LayerState* l : layers) {
    const int64_t ratio = l->layout.compresses() ? l->layout.ratio : 0;
    put_rows(o, l->compressed, ratio, from, to);
    put_rows(o, l->index_keys, ratio, from, to);
    put_rows(o, l->compressed_fp4, ratio, from, to);
  }
  return std::move(o.bytes);
}

void append_state_rows(SequenceState& s, const uint8_t* data, size_t size, int64_t from, int64_t to) {
  In in{data, size};
  if (in.u64() != kRowsMagic) throw Error("not a prefix-cache rows part");
  if (int64_t(in.u64()) != from || int64_t(in.u64()) != to)
    throw Error("prefix-cache rows belong to other positions");
  if (in.u64() != s.layers.size() + s.mtp_layers.size())
    throw Error("prefix-cache rows belong to a model with another layer count");
  std::vector<LayerState*> layers;
  for (auto& l : s.layers) layers.push_back(&l);
  for (auto& l : s.mtp_layers) layers.push_back(&l);
  // Row counts are checked per container before it grows, and a failure
  // leaves the caller's state half-extended: callers build states from
  // scratch and drop them on any error.
  for (LayerState* l : layers) {
    const int64_t ratio = l->layout.compresses() ? l->layout.ratio : 0;
    get_rows(in, l->compressed, ratio, from, to);
    get_rows(in, l->index_keys, ratio, from, to);
    get_rows(in, l->compressed_fp4, ratio, from, to);
  }
  if (in.pos != size) throw Error("prefix-cache rows part has trailing bytes");
}

std::vector<uint8_t> state_tail(const SequenceState& s) {
  if (s.has_checkpoint()) throw Error("prefix cache: a state with an open checkpoint has no tail");
  Out o;
  o.u64(kTailMagic);
  o.u64(uint64_t(s.n_tokens));
  o.u64(uint64_t(s.mtp_tokens));
  o.u64(s.tokens.size());
  const auto layers = all_layers(s);
  o.u64(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerState& l = *layers[i];
    const int64_t tokens = i < s.layers.size() ? s.n_tokens : s.mtp_tokens;
    o.u64(uint64_t(l.window.rows()));
    l.window.copy_rows(0, l.window.rows(), o.grow(size_t(l.window.memory_bytes())));
    const size_t live = live_floats(l.compressor, l.layout, tokens);
    put_floats(o, l.compressor.kv, live);
    put_floats(o, l.compressor.score, live);
    put_floats(o, l.index_compressor.kv, l.index_compressor.kv.size());
    put_floats(o, l.index_compressor.score, l.index_compressor.score.size());
  }
  return std::move(o.bytes);
}

int64_t state_tail_tokens(const uint8_t* data, size_t size) {
  if (size < 16) return -1;
  uint64_t magic, n;
  std::memcpy(&magic, data, 8);
  std::memcpy(&n, data + 8, 8);
  return magic == kTailMagic ? int64_t(n) : -1;
}

void restore_state_tail(SequenceState& s, const uint8_t* data, size_t size, const std::vector<int32_t>& tokens) {
  In in{data, size};
  if (in.u64() != kTailMagic) throw Error("not a prefix-cache tail");
  const int64_t n = int64_t(in.u64()), mtp = int64_t(in.u64());
  const uint64_t n_ids = in.u64();
  if (n < 0 || mtp < 0 || mtp > n || n_ids > uint64_t(n) || n_ids > tokens.size())
    throw Error("prefix-cache tail has bad token counts");
  if (in.u64() != s.layers.size() + s.mtp_layers.size())
    throw Error("prefix-cache tail belongs to a model with another layer count");
  SequenceState r = s;  // s stays as it was if anything below fails
  r.end_checkpoint();
  for (size_t i = 0; i < r.layers.size() + r.mtp_layers.size(); ++i) {
    const bool main = i < r.layers.size();
    LayerState& l = main ? r.layers[i] : r.mtp_layers[i - r.layers.size()];
    const int64_t at = main ? n : mtp;
    // The rows must be those of the tail's position.
    if (l.layout.compresses())
      for (int64_t rows : {l.compressed.rows(), l.index_keys.rows(), l.compressed_fp4.rows()})
        if (rows > 0 && rows != at / l.layout.ratio)
          throw Error("prefix-cache tail does not sit where the state's rows end");
    if (int64_t(in.u64()) != l.window.rows()) throw Error("prefix-cache tail has another window size");
    const int64_t window_rows = l.window.rows();
    l.window.resize(0);
    l.window.append_rows(in.take(size_t(window_rows * l.window.row_bytes())), window_rows);
    const float inf = std::numeric_limits<float>::infinity();
    get_floats(in, l.compressor.kv, 0.0f);
    get_floats(in, l.compressor.score, -inf);
    get_floats(in, l.index_compressor.kv, 0.0f);
    get_floats(in, l.index_compressor.score, -inf);
  }
  if (in.pos != size) throw Error("prefix-cache tail has trailing bytes");
  r.n_tokens = n;
  r.mtp_tokens = mtp;
  r.tokens.assign(tokens.begin(), tokens.begin() + int64_t(n_ids));
  s = std::move(r);
}

}  // namespace dsv4
