#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace dsv4::text {

namespace {

using json = nlohmann::json;

// GPT-2 byte-to-unicode table: printable bytes map to themselves, the rest to
// U+0100.. in order. Token strings in tokenizer.json are written in this
// alphabet.
std::array<uint32_t, 256> make_byte_to_codepoint() {
  std::array<uint32_t, 256> table{};
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
  }
  return table;
}

void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes one code point from valid UTF-8; returns its byte length.
size_t next_codepoint(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n = b0 >= 0xF0 ? 4 : (b0 >= 0xE0 ? 3 : 2);
  if (i + n > s.size()) {
    *cp = 0xFFFD;
    return s.size() - i;
  }
  uint32_t v = b0 & (n == 2 ? 0x1F : (n == 3 ? 0x0F : 0x07));
  for (size_t k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *cp = v;
  return n;
}

// Open-addressing map (pair of ids) -> (rank, merged id). The merge lookup is
// the innermost operation of BPE, so it avoids std::unordered_map's node
// chasing.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, {0, 0});
    mask_ = cap - 1;
  }
  static uint64_t key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void insert(TokenId a, TokenId b, int32_t rank, TokenId merged) {
    const uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    if (keys_[i] == k) return;  // first (lowest-rank) definition wins, as in HF
    keys_[i] = k;
    values_[i] = {rank, merged};
  }
  const std::pair<int32_t, TokenId>* find(TokenId a, TokenId b) const {
    const uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (true) {
      const uint64_t cur = keys_[i];
      if (cur == k) return &values_[i];
      if (cur == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, TokenId>> values_;
  size_t mask_ = 0;
};

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
};

std::atomic<uint64_t> g_instance_counter{1};

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> id_bytes;
  std::vector<std::string> id_token;
  std::vector<uint8_t> id_flags;  // bit0: added, bit1: special
  std::unordered_map<std::string, TokenId> token_index;
  MergeTable merges;
  std::array<TokenId, 256> byte_token{};
  std::vector<Regex> splits;
  SpecialTokenIds special;
  uint64_t instance_id = 0;

  // Trie over added-token bytes, for leftmost-longest matching.
  struct TrieNode {
    TokenId token = -1;
  };
  std::vector<TrieNode> trie{TrieNode{}};
  std::unordered_map<uint64_t, int32_t> trie_edges;  // (node << 8 | byte) -> child
  std::array<bool, 256> added_first_byte{};

  ~Impl() {
    for (auto& r : splits) pcre2_code_free(r.code);
  }

  void add_to_trie(const std::string& s, TokenId id) {
    int32_t node = 0;
    for (unsigned char c : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = trie_edges.find(key);
      if (it == trie_edges.end()) {
        trie.push_back(TrieNode{});
        const int32_t child = static_cast<int32_t>(trie.size() - 1);
        trie_edges.emplace(key, child);
        node = child;
      } else {
        node = it->second;
      }
    }
    if (!s.empty()) {
      trie[node].token = id;
      added_first_byte[static_cast<unsigned char>(s[0])] = true;
    }
  }

  // Longest added token starting at text[pos]: returns its length (0 if none).
  size_t match_added(std::string_view text, size_t pos, TokenId* id) const {
    int32_t node = 0;
    size_t best = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]);
      auto it = trie_edges.find(key);
      if (it == trie_edges.end()) break;
      node = it->second;
      if (trie[node].token >= 0) {
        best = i + 1 - pos;
        *id = trie[node].token;
      }
    }
    return best;
  }

  void encode_plain(std::string_view text, std::vector<TokenId>& out) const;
  void split_level(std::string_view piece, size_t level, std::vector<TokenId>& out) const;
  void bpe(std::string_view word, std::vector<TokenId>& out) const;
  void bpe_uncached(std::string_view word, std::vector<TokenId>& out) const;
};

namespace {

struct MatchData {
  pcre2_match_data* md = nullptr;
  MatchData() { md = pcre2_match_data_create(4, nullptr); }
  ~MatchData() { pcre2_match_data_free(md); }
};

struct BpeCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<TokenId>> words;
};

constexpr size_t kCacheMaxEntries = 1 << 17;
constexpr size_t kCacheMaxWordBytes = 96;

}  // namespace

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  split_level(text, 0, out);
}

void Tokenizer::Impl::split_level(std::string_view piece, size_t level, std::vector<TokenId>& out) const {
  if (level == splits.size()) {
    bpe(piece, out);
    return;
  }
  thread_local MatchData match;
  const Regex& re = splits[level];
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  const size_t len = piece.size();
  size_t start = 0;
  size_t emitted = 0;
  while (start < len) {
    const int rc = re.jit ? pcre2_jit_match(re.code, subject, len, start, 0, match.md, nullptr)
                          : pcre2_match(re.code, subject, len, start, PCRE2_NO_UTF_CHECK, match.md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.md);
    const size_t ms = ov[0], me = ov[1];
    if (me == ms) {
      // Empty matches cannot split anything; step one character forward.
      uint32_t cp;
      start = ms + next_codepoint(piece, ms, &cp);
      continue;
    }
    if (ms > emitted) split_level(piece.substr(emitted, ms - emitted), level + 1, out);
    split_level(piece.substr(ms, me - ms), level + 1, out);
    emitted = me;
    start = me;
  }
  if (emitted < len) split_level(piece.substr(emitted), level + 1, out);
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<TokenId>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_token[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > kCacheMaxWordBytes) {
    bpe_uncached(word, out);
    return;
  }
  thread_local BpeCache cache;
  if (cache.owner != instance_id) {
    cache.words.clear();
    cache.owner = instance_id;
  }
  // Heterogeneous lookup is C++20 for unordered containers but needs a
  // transparent hash; a short-lived key string is cheap next to BPE itself.
  std::string key(word);
  auto it = cache.words.find(key);
  if (it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t before = out.size();
  bpe_uncached(word, out);
  if (cache.words.size() >= kCacheMaxEntries) cache.words.clear();
  cache.words.emplace(std::move(key), std::vector<TokenId>(out.begin() + before, out.end()));
}

// Same algorithm as HF `Word::merge_all`: a min-heap on (rank, position) with
// lazy invalidation, so ties and overlapping pairs resolve exactly as there.
void Tokenizer::Impl::bpe_uncached(std::string_view word, std::vector<TokenId>& out) const {
  struct Symbol {
    TokenId c;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Merge {
    int32_t rank;
    int32_t pos;
    TokenId new_id;
  };
  const size_t n = word.size();
  std::vector<Symbol> sym(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {byte_token[static_cast<unsigned char>(word[i])], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  }
  auto greater = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::vector<Merge> heap;
  heap.reserve(n * 2);
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = merges.find(sym[i].c, sym[i + 1].c)) {
      heap.push_back({m->first, static_cast<int32_t>(i), m->second});
    }
  }
  std::make_heap(heap.begin(), heap.end(), greater);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    const Merge top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[next_pos];
    const auto* m = merges.find(cur.c, right.c);
    if (!m || m->second != top.new_id) continue;  // stale entry
    cur.c = top.new_id;
    cur.next = right.next;
    sym[next_pos].alive = false;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = merges.find(sym[cur.prev].c, cur.c)) {
        heap.push_back({pm->first, cur.prev, pm->second});
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = merges.find(cur.c, sym[cur.next].c)) {
        heap.push_back({nm->first, top.pos, nm->second});
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].c);
}

namespace {

Regex compile_regex(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE erroff = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &erroff, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    throw std::runtime_error("tokenizer: cannot compile pre-tokenizer regex '" + pattern +
                             "': " + reinterpret_cast<char*>(buf));
  }
  Regex r;
  r.code = code;
  r.jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

// GPT-2's pattern, used when a ByteLevel pre-tokenizer has use_regex = true.
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void collect_pre_tokenizers(const json& pt, std::vector<std::string>& patterns) {
  if (pt.is_null()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pt.at("pretokenizers")) collect_pre_tokenizers(p, patterns);
  } else if (type == "Split") {
    const auto& pat = pt.at("pattern");
    if (!pat.contains("Regex")) throw std::runtime_error("tokenizer: only Regex Split patterns are supported");
    if (pt.value("behavior", "") != "Isolated" || pt.value("invert", false)) {
      throw std::runtime_error("tokenizer: only Split behavior Isolated (not inverted) is supported");
    }
    patterns.push_back(pat.at("Regex").get<std::string>());
  } else if (type == "ByteLevel") {
    if (pt.value("add_prefix_space", false)) {
      throw std::runtime_error("tokenizer: ByteLevel add_prefix_space=true is not supported");
    }
    if (pt.value("use_regex", true)) patterns.push_back(kGpt2Pattern);
  } else {
    throw std::runtime_error("tokenizer: unsupported pre_tokenizer type '" + type + "'");
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer: cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return from_json_text(ss.str());
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json_text(std::string_view text) {
  json j = json::parse(text.begin(), text.end());
  auto impl = std::make_unique<Impl>();
  impl->instance_id = g_instance_counter.fetch_add(1);

  const auto& model = j.at("model");
  if (model.value("type", "BPE") != "BPE") throw std::runtime_error("tokenizer: only BPE models are supported");
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>()) {
    throw std::runtime_error("tokenizer: byte_fallback BPE is not supported");
  }
  const auto& norm = j["normalizer"];
  if (!norm.is_null() && !(norm.value("type", "") == "Sequence" && norm["normalizers"].empty())) {
    throw std::runtime_error("tokenizer: normalizers are not supported");
  }

  // Byte-level alphabet.
  const auto byte_cp = make_byte_to_codepoint();
  std::unordered_map<uint32_t, uint8_t> cp_byte;
  for (int b = 0; b < 256; ++b) cp_byte[byte_cp[b]] = static_cast<uint8_t>(b);

  // HF's ByteLevel decoder maps a token's chars back to bytes only when every
  // char is in the alphabet; otherwise it keeps the token's UTF-8 as is.
  auto token_to_bytes = [&](const std::string& tok) {
    std::string bytes;
    size_t i = 0;
    while (i < tok.size()) {
      uint32_t cp;
      i += next_codepoint(tok, i, &cp);
      auto it = cp_byte.find(cp);
      if (it == cp_byte.end()) return tok;
      bytes.push_back(static_cast<char>(it->second));
    }
    return bytes;
  };

  auto ensure_size = [&](size_t id) {
    if (impl->id_bytes.size() <= id) {
      impl->id_bytes.resize(id + 1);
      impl->id_token.resize(id + 1);
      impl->id_flags.resize(id + 1, 0);
    }
  };

  const auto& vocab = model.at("vocab");
  impl->token_index.reserve(vocab.size() + 2048);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = it.value().get<int64_t>();
    if (id < 0 || id > (1 << 30)) throw std::runtime_error("tokenizer: bad vocab id");
    ensure_size(static_cast<size_t>(id));
    impl->id_token[id] = it.key();
    impl->id_bytes[id] = token_to_bytes(it.key());
    impl->token_index[it.key()] = static_cast<TokenId>(id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_codepoint(s, byte_cp[b]);
    auto it = impl->token_index.find(s);
    if (it == impl->token_index.end()) throw std::runtime_error("tokenizer: byte-level alphabet incomplete");
    impl->byte_token[b] = it->second;
  }

  const auto& merges = model.at("merges");
  impl->merges.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos) throw std::runtime_error("tokenizer: bad merge '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      a = m.at(0).get<std::string>();
      b = m.at(1).get<std::string>();
    }
    auto ia = impl->token_index.find(a), ib = impl->token_index.find(b), im = impl->token_index.find(a + b);
    if (ia == impl->token_index.end() || ib == impl->token_index.end() || im == impl->token_index.end()) {
      throw std::runtime_error("tokenizer: merge refers to unknown token '" + a + " " + b + "'");
    }
    impl->merges.insert(ia->second, ib->second, rank++, im->second);
  }

  if (j.contains("added_tokens")) {
    for (const auto& at : j["added_tokens"]) {
      const auto id = at.at("id").get<int64_t>();
      const auto content = at.at("content").get<std::string>();
      if (id < 0 || id > (1 << 30)) throw std::runtime_error("tokenizer: bad added token id");
      if (at.value("lstrip", false) || at.value("rstrip", false) || at.value("single_word", false)) {
        throw std::runtime_error("tokenizer: lstrip/rstrip/single_word added tokens are not supported");
      }
      ensure_size(static_cast<size_t>(id));
      impl->id_token[id] = content;
      impl->id_bytes[id] = token_to_bytes(content);
      impl->id_flags[id] = 1 | (at.value("special", false) ? 2 : 0);
      impl->token_index[content] = static_cast<TokenId>(id);
      impl->add_to_trie(content, static_cast<TokenId>(id));
    }
  }

  std::vector<std::string> patterns;
  collect_pre_tokenizers(j["pre_tokenizer"], patterns);
  for (const auto& p : patterns) impl->splits.push_back(compile_regex(p));

  auto lookup = [&](const char* s) {
    auto it = impl->token_index.find(s);
    return it == impl->token_index.end() ? TokenId{-1} : it->second;
  };
  auto& sp = impl->special;
  sp.bos = lookup("<｜begin▁of▁sentence｜>");
  sp.eos = lookup("<｜end▁of▁sentence｜>");
  sp.pad = lookup("<｜▁pad▁｜>");
  sp.user = lookup("<｜User｜>");
  sp.assistant = lookup("<｜Assistant｜>");
  sp.system = lookup("<｜System｜>");
  sp.think_begin = lookup("<think>");
  sp.think_end = lookup("</think>");
  sp.dsml = lookup("｜DSML｜");
  sp.latest_reminder = lookup("<｜latest_reminder｜>");

  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const { return encode(text, {}); }

std::vector<TokenId> Tokenizer::encode_ordinary(std::string_view text) const {
  return encode(text, {TextSpan{0, text.size()}});
}

namespace {

// Sorted, clamped, with overlapping and touching spans merged, empty ones dropped.
std::vector<TextSpan> normalize_spans(std::vector<TextSpan> spans, size_t size) {
  for (auto& s : spans) {
    s.end = std::min(s.end, size);
    s.begin = std::min(s.begin, s.end);
  }
  std::erase_if(spans, [](const TextSpan& s) { return s.begin == s.end; });
  std::sort(spans.begin(), spans.end(), [](const TextSpan& a, const TextSpan& b) { return a.begin < b.begin; });
  std::vector<TextSpan> out;
  for (const auto& s : spans) {
    if (!out.empty() && s.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, s.end);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

// Repairs invalid UTF-8 piece by piece (pieces cut at span boundaries) and
// moves the spans onto the repaired text.
std::string repair_with_spans(std::string_view text, std::vector<TextSpan>& spans) {
  std::string out;
  size_t pos = 0;
  auto piece = [&](size_t end) {
    const std::string_view p = text.substr(pos, end - pos);
    out += utf8::is_valid(p) ? std::string(p) : utf8::to_valid_lossy(p);
    pos = end;
  };
  for (auto& s : spans) {
    piece(s.begin);
    s.begin = out.size();
    piece(s.end);
    s.end = out.size();
  }
  piece(text.size());
  return out;
}

}  // namespace

std::vector<TokenId> Tokenizer::encode(std::string_view text, const std::vector<TextSpan>& plain_spans) const {
  std::vector<TextSpan> spans = normalize_spans(plain_spans, text.size());
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = repair_with_spans(text, spans);
    text = repaired;
  }
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  const Impl& im = *impl_;
  size_t seg_start = 0;
  size_t i = 0;
  size_t next_span = 0;
  const size_t n = text.size();
  while (i < n) {
    while (next_span < spans.size() && spans[next_span].end <= i) ++next_span;
    size_t limit = n;
    if (next_span < spans.size()) {
      if (spans[next_span].begin <= i) {
        // Inside a plain span: its bytes join the ordinary text segment.
        i = spans[next_span].end;
        continue;
      }
      limit = spans[next_span].begin;
    }
    if (!im.added_first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    TokenId id = -1;
    const size_t len = im.match_added(text.substr(0, limit), i, &id);
    if (len == 0) {
      ++i;
      continue;
    }
    im.encode_plain(text.substr(seg_start, i - seg_start), out);
    out.push_back(id);
    i += len;
    seg_start = i;
  }
  im.encode_plain(text.substr(seg_start), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) continue;
    if (skip_special_tokens && (impl_->id_flags[id] & 2)) continue;
    bytes += impl_->id_bytes[id];
  }
  if (utf8::is_valid(bytes)) return bytes;
  return utf8::to_valid_lossy(bytes);
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) return {};
  return impl_->id_bytes[id];
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_flags.size() && (impl_->id_flags[id] & 2);
}

bool Tokenizer::is_added(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_flags.size() && (impl_->id_flags[id] & 1);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_index.find(std::string(token));
  if (it == impl_->token_index.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_token.size()) return std::nullopt;
  if (impl_->id_token[id].empty()) return std::nullopt;
  return impl_->id_token[id];
}

size_t Tokenizer::vocab_size() const { return impl_->id_bytes.size(); }

const SpecialTokenIds& Tokenizer::special_ids() const { return impl_->special; }

// ---------------------------------------------------------------------------

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(TokenId id) {
  if (!(skip_special_ && tokenizer_->is_special(id))) pending_ += tokenizer_->token_bytes(id);
  return drain(false);
}

std::string StreamDecoder::push(const std::vector<TokenId>& ids) {
  for (TokenId id : ids) {
    if (!(skip_special_ && tokenizer_->is_special(id))) pending_ += tokenizer_->token_bytes(id);
  }
  return drain(false);
}

std::string StreamDecoder::finish() { return drain(true); }

std::string StreamDecoder::drain(bool final) {
  const size_t stable = final ? pending_.size() : utf8::stable_prefix_length(pending_);
  if (stable == 0) return {};
  std::string_view ready(pending_.data(), stable);
  std::string out = utf8::is_valid(ready) ? std::string(ready) : utf8::to_valid_lossy(ready);
  pending_.erase(0, stable);
  return out;
}

}  // namespace dsv4::text
