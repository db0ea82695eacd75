// Engram compressed token map: the builder must reproduce the official
// build_compressed_token_map id for id. tests/data/models/tiny-v41-flash/
// engram_tokenizer.json holds a stand-in tokenizer of the tiny V4.1 test model
// (what each id decodes to, its vocabulary piece) and the official map of it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "text/engram_token_map.h"
#include "text/tokenizer.h"

using dsv4::text::build_engram_token_map;
using dsv4::text::engram_normalize;
using dsv4::text::EngramTokenMap;
using dsv4::text::Tokenizer;
using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// Every class is numbered when first seen, so an id is at most one more than
// the largest before it, and the largest is classes - 1.
void expect_first_seen_numbering(const EngramTokenMap& map) {
  int32_t next = 0;
  for (size_t i = 0; i < map.ids.size(); ++i) {
    ASSERT_GE(map.ids[i], 0) << i;
    ASSERT_LE(map.ids[i], next) << i;
    if (map.ids[i] == next) ++next;
  }
  EXPECT_EQ(next, map.classes);
}

}  // namespace

TEST(EngramTokenMap, MatchesOfficialMapOfTinyModel) {
  const json j = read_json(std::string(DSV4_TEST_DATA) + "/models/tiny-v41-flash/engram_tokenizer.json");
  const auto texts = j.at("token_texts").get<std::vector<std::string>>();
  const auto pieces = j.at("raw_pieces").get<std::vector<std::string>>();
  const auto expected = j.at("token_map").get<std::vector<int32_t>>();
  const EngramTokenMap map = build_engram_token_map(texts, pieces);
  EXPECT_EQ(map.classes, j.at("compressed_vocab_size").get<int64_t>());
  ASSERT_EQ(map.ids.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(map.ids[i], expected[i]) << "id " << i << " text " << json(texts[i]).dump();
  // The pad token's class is what the hash uses before the sequence start.
  EXPECT_EQ(map.ids.at(j.at("pad_compressed_id").get<size_t>()), expected.at(2));
  expect_first_seen_numbering(map);
}

TEST(EngramTokenMap, Normalizer) {
  // Whitespace: runs of space / tab / CR / LF become one space, which is then
  // stripped, except that a lone space survives.
  EXPECT_EQ(engram_normalize(" "), " ");
  EXPECT_EQ(engram_normalize("  "), " ");
  EXPECT_EQ(engram_normalize("\n"), " ");
  EXPECT_EQ(engram_normalize("\r\n\t "), " ");
  EXPECT_EQ(engram_normalize(" Hello"), "hello");
  EXPECT_EQ(engram_normalize("\nas"), "as");
  EXPECT_EQ(engram_normalize("a \t b"), "a b");
  EXPECT_EQ(engram_normalize(""), "");
  // Other White_Space characters are not collapsed but are stripped; NFKC
  // first turns no-break and ideographic spaces into plain spaces.
  EXPECT_EQ(engram_normalize("\u0085x\u2028"), "x");
  EXPECT_EQ(engram_normalize("a\u0085\u0085b"), "a\u0085\u0085b");
  EXPECT_EQ(engram_normalize("\u00A0"), " ");
  EXPECT_EQ(engram_normalize("\u3000a\u00A0"), "a");
  EXPECT_EQ(engram_normalize("\v"), "");  // stripped, not collapsed: empty
  // NFKC compatibility forms, accents, case.
  EXPECT_EQ(engram_normalize("ｈａｌａ"), "hala");
  EXPECT_EQ(engram_normalize("ﬁ"), "fi");
  EXPECT_EQ(engram_normalize("Café"), "cafe");
  EXPECT_EQ(engram_normalize("CAFE\u0301"), "cafe");
  EXPECT_EQ(engram_normalize("cœur"), "cœur");
  EXPECT_EQ(engram_normalize("Ǆ"), "dz");  // NFKC splits it; the caron is stripped
  EXPECT_EQ(engram_normalize("<｜begin▁of▁sentence｜>"), "<|begin▁of▁sentence|>");
  // Lowercase is per character: no final-sigma rule.
  EXPECT_EQ(engram_normalize("ΟΔΟΣ"), "οδοσ");
  EXPECT_EQ(engram_normalize("İstanbul"), "istanbul");
  EXPECT_EQ(engram_normalize("ẞ"), "ß");
  // Marks of every kind go: nonspacing, spacing (Devanagari visarga) and
  // enclosing (combining enclosing circle).
  EXPECT_EQ(engram_normalize("\u0301"), "");
  EXPECT_EQ(engram_normalize("क\u0903"), "क");
  EXPECT_EQ(engram_normalize("a\u20DD"), "a");
  // The private-use sentinel of the official pipeline reads as a space.
  EXPECT_EQ(engram_normalize("\uE000"), " ");
  EXPECT_EQ(engram_normalize("x\uE000y"), "x y");
  // Invalid UTF-8 reads as U+FFFD (the builder never normalizes such text:
  // it keys by the piece).
  EXPECT_EQ(engram_normalize("A\xFF"), "a\uFFFD");
}

TEST(EngramTokenMap, KeyRules) {
  // Text with U+FFFD keys by its piece; an empty normalization keys by the
  // text itself; otherwise tokens that normalize alike share a class.
  const std::vector<std::string> texts = {"\xEF\xBF\xBD", "\xEF\xBF\xBD", "The", " the", "\u0301", "\u0300", "THE", ""};
  const std::vector<std::string> pieces = {"<0x80>", "<0x81>", "The", "Ġthe", "x", "y", "THE", ""};
  const EngramTokenMap map = build_engram_token_map(texts, pieces);
  EXPECT_EQ(map.ids, (std::vector<int32_t>{0, 1, 2, 2, 3, 4, 2, 5}));
  EXPECT_EQ(map.classes, 6);
  EXPECT_THROW(build_engram_token_map(texts, std::vector<std::string>(3)), std::invalid_argument);
}

// The real DeepSeek tokenizer shipped in assets/. V4.1's config sets
// engram_compressed_vocab_size = 99092 for its tokenizer, and this one gives
// exactly that; near misses move the count (stripping only nonspacing marks,
// Mn, instead of every Mark gives 99510). Prints the count and the time the
// build takes.
TEST(EngramTokenMap, RealTokenizer) {
  auto tok = Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/assets/dsv4-tokenizer/tokenizer.json");
  const auto t0 = std::chrono::steady_clock::now();
  const EngramTokenMap map = build_engram_token_map(*tok);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("engram token map of assets/dsv4-tokenizer: %zu ids -> %lld classes in %.3f s\n", map.ids.size(),
              static_cast<long long>(map.classes), seconds);
  ASSERT_EQ(map.ids.size(), tok->vocab_size());
  EXPECT_EQ(map.classes, 99092);
  expect_first_seen_numbering(map);
  // Casing and a leading space do not matter; different words do.
  auto id = [&](const char* s) {
    const auto t = tok->token_to_id(s);
    EXPECT_TRUE(t.has_value()) << s;
    return t ? map.ids[*t] : -1;
  };
  EXPECT_EQ(id("the"), id("Ġthe"));
  EXPECT_EQ(id("the"), id("The"));
  EXPECT_EQ(id("the"), id("ĠThe"));
  EXPECT_NE(id("the"), id("a"));
}
