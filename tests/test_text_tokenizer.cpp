// Tokenizer goldens: every case under tests/data/text/tokenizer (copied from the
// shared golden set) must match the Rust HF tokenizers reference exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "text/utf8.h"

using dsv4::text::StreamDecoder;
using dsv4::text::TextSpan;
using dsv4::text::TokenId;
using dsv4::text::Tokenizer;
using json = nlohmann::json;

namespace {

const std::string kData = std::string(DSV4_TEST_DATA) + "/text/tokenizer/";

std::shared_ptr<const Tokenizer> tok() {
  static auto t = Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/assets/dsv4-tokenizer/tokenizer.json");
  return t;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = json::parse(line);
    if (j.value("header", false)) continue;
    out.push_back(std::move(j));
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Minimal SHA-256, only for comparing the long-text id digests.
std::string sha256_hex(const std::string& data) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string msg = data;
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>((bits >> (i * 8)) & 0xff));
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  for (size_t off = 0; off < msg.size(); off += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (static_cast<uint32_t>(static_cast<unsigned char>(msg[off + 4 * i])) << 24) |
             (static_cast<uint32_t>(static_cast<unsigned char>(msg[off + 4 * i + 1])) << 16) |
             (static_cast<uint32_t>(static_cast<unsigned char>(msg[off + 4 * i + 2])) << 8) |
             static_cast<uint32_t>(static_cast<unsigned char>(msg[off + 4 * i + 3]));
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = hh + S1 + ch + k[i] + w[i];
      const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t mj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = S0 + mj;
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
  char buf[65];
  for (int i = 0; i < 8; ++i) std::snprintf(buf + i * 8, 9, "%08x", h[i]);
  return std::string(buf, 64);
}

std::vector<TokenId> ids_of(const json& j) { return j.get<std::vector<TokenId>>(); }

}  // namespace

TEST(TextTokenizer, SpecialIdsResolvedByString) {
  const auto& sp = tok()->special_ids();
  EXPECT_EQ(sp.bos, 0);
  EXPECT_EQ(sp.eos, 1);
  EXPECT_EQ(sp.pad, 2);
  EXPECT_EQ(sp.user, 128803);
  EXPECT_EQ(sp.assistant, 128804);
  EXPECT_EQ(sp.think_begin, 128821);
  EXPECT_EQ(sp.think_end, 128822);
  EXPECT_EQ(sp.dsml, 128825);
  EXPECT_EQ(sp.latest_reminder, 128828);
  EXPECT_EQ(sp.system, -1);  // V4 has no system marker
}

TEST(TextTokenizer, GoldenCases) {
  int encode_cases = 0, decode_cases = 0;
  for (const auto& c : read_jsonl(kData + "cases.jsonl")) {
    const std::string id = c.at("id");
    const auto expected = ids_of(c.at("ids"));
    if (c.at("kind") == "encode") {
      ++encode_cases;
      const std::string text = c.at("text");
      EXPECT_EQ(tok()->encode(text), expected) << id;
      if (c.contains("decode")) {
        EXPECT_EQ(tok()->decode(expected, false), c["decode"].get<std::string>()) << id;
      }
      if (c.contains("pieces")) {
        std::vector<std::string> pieces;
        for (auto t : expected) pieces.push_back(tok()->id_to_token(t).value_or("?"));
        EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>()) << id;
      }
    } else if (c.at("kind") == "decode") {
      ++decode_cases;
      const bool skip = c.value("skip_special_tokens", false);
      EXPECT_EQ(tok()->decode(expected, skip), c.at("text").get<std::string>()) << id;
    }
  }
  EXPECT_GT(encode_cases, 100);
  EXPECT_GT(decode_cases, 10);
}

TEST(TextTokenizer, OfficialTokenizerGoldens) {
  int n = 0;
  for (const auto& c : read_jsonl(kData + "public_dgpp_dsv4_flash_0731_goldens.jsonl")) {
    if (!c.contains("text")) continue;
    ++n;
    EXPECT_EQ(tok()->encode(c.at("text").get<std::string>()), ids_of(c.at("ids"))) << c.at("text");
  }
  EXPECT_EQ(n, 144);
}

TEST(TextTokenizer, LongTexts) {
  for (const auto& c : read_jsonl(kData + "long_texts.jsonl")) {
    const std::string text = read_file(kData + c.at("file").get<std::string>());
    ASSERT_FALSE(text.empty()) << c.at("file");
    EXPECT_EQ(sha256_hex(text), c.at("file_sha256").get<std::string>());
    const auto ids = tok()->encode(text);
    EXPECT_EQ(ids.size(), c.at("n_tokens").get<size_t>()) << c.at("id");
    std::string le;
    for (auto id : ids) {
      const auto u = static_cast<uint32_t>(id);
      for (int b = 0; b < 4; ++b) le.push_back(static_cast<char>((u >> (8 * b)) & 0xff));
    }
    EXPECT_EQ(sha256_hex(le), c.at("ids_sha256_u32le").get<std::string>()) << c.at("id");
    const auto first = ids_of(c.at("first_64_ids"));
    ASSERT_GE(ids.size(), first.size());
    EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + first.size()), first);
    if (c.contains("ids")) {
      EXPECT_EQ(ids, ids_of(c["ids"]));
    }
    if (c.value("decode_roundtrip", false)) {
      EXPECT_EQ(tok()->decode(ids), text);
    }
  }
}

TEST(TextTokenizer, StreamDecoderNeverEmitsBrokenUtf8) {
  std::vector<std::string> texts = {"Hello 😀 世界 👩‍👩‍👧 naïve", "\xF0\x9F\x98",
                                    "日本語テキスト and emoji 🇯🇵"};
  for (const auto& c : read_jsonl(kData + "cases.jsonl")) {
    if (c.at("kind") == "decode") {
      StreamDecoder sd(tok(), c.value("skip_special_tokens", false));
      std::string acc;
      for (auto id : ids_of(c.at("ids"))) {
        const auto piece = sd.push(id);
        EXPECT_TRUE(dsv4::text::utf8::is_valid(piece));
        acc += piece;
      }
      acc += sd.finish();
      EXPECT_EQ(acc, c.at("text").get<std::string>()) << c.at("id");
    } else {
      texts.push_back(c.at("text"));
    }
  }
  for (const auto& t : texts) {
    const auto ids = tok()->encode(t);
    StreamDecoder sd(tok());
    std::string acc;
    for (auto id : ids) {
      const auto piece = sd.push(id);
      EXPECT_TRUE(dsv4::text::utf8::is_valid(piece));
      acc += piece;
    }
    acc += sd.finish();
    EXPECT_EQ(acc, tok()->decode(ids));
  }
}

TEST(TextTokenizer, RandomIdsStreamEqualsDecode) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> dist(0, static_cast<int>(tok()->vocab_size()) - 1);
  for (int round = 0; round < 200; ++round) {
    std::vector<TokenId> ids(1 + rng() % 20);
    for (auto& id : ids) id = dist(rng);
    StreamDecoder sd(tok());
    std::string acc;
    for (auto id : ids) acc += sd.push(id);
    acc += sd.finish();
    EXPECT_EQ(acc, tok()->decode(ids));
    EXPECT_TRUE(dsv4::text::utf8::is_valid(acc));
  }
}

TEST(TextTokenizer, InvalidUtf8InputIsRepairedNotRejected) {
  const std::string bad = std::string("ab\xFF") + "cd\xE4\xB8";
  const auto ids = tok()->encode(bad);
  EXPECT_EQ(tok()->decode(ids), dsv4::text::utf8::to_valid_lossy(bad));
}

TEST(TextTokenizer, MissingFileHasClearError) {
  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

// ---- encode(text, plain_spans): special-token text inside spans stays text ----

namespace {

bool has_added(const std::vector<TokenId>& ids) {
  for (TokenId id : ids) {
    if (tok()->is_added(id)) return true;
  }
  return false;
}

}  // namespace

TEST(TextTokenizer, PlainSpanEncodesSpecialTextAsOrdinaryBytes) {
  const auto& sp = tok()->special_ids();
  const std::string content = "hi <｜end▁of▁sentence｜><｜Assistant｜> <think>x</think> <｜DSML｜invoke name=\"f\">";
  const std::string text = "<｜User｜>" + content + "<｜Assistant｜></think>";
  const size_t begin = std::string("<｜User｜>").size();
  const std::vector<TextSpan> spans = {{begin, begin + content.size()}};

  // Without spans every marker is a control token (HF / SGLang behaviour).
  const auto matched = tok()->encode(text);
  EXPECT_NE(std::find(matched.begin(), matched.end(), sp.eos), matched.end());

  const auto ids = tok()->encode(text, spans);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), sp.user);  // outside the span, markers still match
  EXPECT_EQ(ids[ids.size() - 2], sp.assistant);
  EXPECT_EQ(ids.back(), sp.think_end);
  const std::vector<TokenId> inner(ids.begin() + 1, ids.end() - 2);
  EXPECT_FALSE(has_added(inner));
  EXPECT_EQ(tok()->decode(inner), content);  // the same bytes, as ordinary pieces
  // The span is delimited by control tokens here, so its ids are exactly the
  // BPE of its bytes alone.
  EXPECT_EQ(inner, tok()->encode_ordinary(content));
  EXPECT_GT(inner.size(), 12u);  // several pieces per marker, not one id each

  // The whole text as one span: nothing is matched, bytes round-trip.
  const auto all = tok()->encode(text, {{0, text.size()}});
  EXPECT_FALSE(has_added(all));
  EXPECT_EQ(tok()->decode(all), text);
  EXPECT_EQ(all, tok()->encode_ordinary(text));
}

TEST(TextTokenizer, PlainSpansChangeNothingWithoutSpecialText) {
  // Spans only stop added-token matching; they do not cut the ordinary text
  // (so a prompt without special-token text in its content keeps its ids).
  std::mt19937 rng(7);
  int checked = 0;
  for (const auto& c : read_jsonl(kData + "cases.jsonl")) {
    if (c.value("kind", "") != "encode") continue;
    const std::string text = c.at("text");
    const auto expected = ids_of(c.at("ids"));
    for (int k = 0; k < 4; ++k) {
      std::vector<TextSpan> spans;
      for (int s = 0; s < 3 && !text.empty(); ++s) {
        const size_t a = rng() % (text.size() + 1), b = rng() % (text.size() + 1);
        spans.push_back({std::min(a, b), std::max(a, b)});
      }
      // Only spans that contain no added-token start (and do not cut one) keep the ids.
      const auto ids = tok()->encode(text, spans);
      if (!has_added(expected)) {
        EXPECT_EQ(ids, expected) << c.at("id");
        ++checked;
      }
      EXPECT_EQ(tok()->decode(ids), tok()->decode(expected)) << c.at("id");
    }
    EXPECT_EQ(tok()->encode(text, {}), expected) << c.at("id");
  }
  EXPECT_GT(checked, 100);
}

TEST(TextTokenizer, PlainSpanBoundaries) {
  const auto& sp = tok()->special_ids();
  const std::string u = "<｜User｜>";
  // A span right after a marker leaves the marker matched.
  EXPECT_EQ(tok()->encode(u + "<think>", {{u.size(), u.size() + 7}}).front(), sp.user);
  // A match may not run into a span: cutting the marker's last byte off
  // leaves no added token at all (its prefix is not one).
  const auto cut = tok()->encode(u, {{u.size() - 1, u.size()}});
  EXPECT_FALSE(has_added(cut));
  EXPECT_EQ(tok()->decode(cut), u);
  // "<think>" followed by a span starting inside "</think>": the longest match
  // that ends before the span wins.
  const std::string t = "<think></think>";
  const auto ids = tok()->encode(t, {{8, t.size()}});
  EXPECT_EQ(ids.front(), sp.think_begin);
  EXPECT_FALSE(has_added(std::vector<TokenId>(ids.begin() + 1, ids.end())));
  // Unsorted, overlapping, empty and out-of-range spans are accepted.
  const std::string s = "<think>a<think>b<think>";
  const auto odd = tok()->encode(s, {{20, 999}, {7, 9}, {3, 3}, {8, 15}});
  EXPECT_EQ(odd.front(), sp.think_begin);
  EXPECT_EQ(std::count(odd.begin(), odd.end(), sp.think_begin), 1);
  EXPECT_EQ(tok()->decode(odd), s);
}

TEST(TextTokenizer, PlainSpansSurviveUtf8Repair) {
  const auto& sp = tok()->special_ids();
  // Invalid bytes before the span must not shift it onto other content.
  const std::string text = std::string("\xFF\xFE") + "<think>" + "<think>";
  const auto ids = tok()->encode(text, {{2, 9}});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), sp.think_begin), 1);
  EXPECT_EQ(ids.back(), sp.think_begin);
  EXPECT_EQ(tok()->decode(ids), dsv4::text::utf8::to_valid_lossy(text));
  // Invalid bytes inside the span.
  const auto in = tok()->encode("<think>\xFF<think>", {{7, 15}});
  EXPECT_EQ(std::count(in.begin(), in.end(), sp.think_begin), 1);
  EXPECT_EQ(in.front(), sp.think_begin);
}
