#include "text/engram_token_map.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <stdexcept>
#include <string>
#include <unordered_map>

#include "text/utf8.h"

namespace dsv4::text {
namespace {

// A private-use character: the official pipeline turns a string that is
// exactly " " into it before Strip, and back into " " after, so that a
// single-space token does not normalize to "" (which would fall back to its
// raw text and keep it apart from "  ", "\n", ...). Like the official
// pipeline, any U+E000 already in the text also becomes a space.
constexpr UChar32 kSentinel = 0xE000;

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

void append_utf8(std::string& out, UChar32 cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// NFKC, NFD, mark stripping and lowercase: code points after the
// character-level steps. ASCII is invariant under both normalization forms
// and has no marks, so it skips ICU (most of a vocabulary is ASCII).
std::u32string fold_characters(std::string_view text) {
  std::u32string out;
  if (is_ascii(text)) {
    out.reserve(text.size());
    for (unsigned char c : text) out += static_cast<char32_t>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(status);
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU normalizer unavailable: ") + u_errorName(status));
  const icu::UnicodeString src =
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  const icu::UnicodeString decomposed = nfd->normalize(nfkc->normalize(src, status), status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU normalization failed: ") + u_errorName(status));
  for (int32_t i = 0; i < decomposed.length(); i = decomposed.moveIndex32(i, 1)) {
    const UChar32 cp = decomposed.char32At(i);
    // `tokenizers` StripAccents drops General_Category Mark (Mn, Mc and
    // Me), not just the nonspacing marks.
    if (U_GET_GC_MASK(cp) & U_GC_M_MASK) continue;
    // Rust's char::to_lowercase: each character on its own, so no
    // final-sigma or language rules; the root locale with a one-character
    // context gives exactly that, including one-to-many mappings.
    if (cp < 0x80) {
      out += static_cast<char32_t>(cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp);
      continue;
    }
    icu::UnicodeString one(cp);
    one.toLower(icu::Locale::getRoot());
    for (int32_t k = 0; k < one.length(); k = one.moveIndex32(k, 1)) out += static_cast<char32_t>(one.char32At(k));
  }
  return out;
}

bool is_collapsed_space(char32_t c) { return c == U' ' || c == U'\t' || c == U'\r' || c == U'\n'; }

}  // namespace

std::string engram_normalize(std::string_view text) {
  const std::u32string folded = fold_characters(text);
  // Replace [ \t\r\n]+ with one space.
  std::u32string collapsed;
  collapsed.reserve(folded.size());
  for (size_t i = 0; i < folded.size();) {
    if (is_collapsed_space(folded[i])) {
      collapsed += U' ';
      while (i < folded.size() && is_collapsed_space(folded[i])) ++i;
    } else {
      collapsed += folded[i++];
    }
  }
  // The pattern ^ $ of the official pipeline: its ^ and $ are line anchors,
  // but no '\n' survives the step above, so it matches only a string that is
  // exactly one space.
  if (collapsed == U" ") collapsed = std::u32string(1, static_cast<char32_t>(kSentinel));
  // Strip: Rust's char::is_whitespace is the White_Space property.
  size_t b = 0, e = collapsed.size();
  while (b < e && u_isUWhiteSpace(static_cast<UChar32>(collapsed[b]))) ++b;
  while (e > b && u_isUWhiteSpace(static_cast<UChar32>(collapsed[e - 1]))) --e;
  std::string out;
  out.reserve(e - b);
  for (size_t i = b; i < e; ++i) append_utf8(out, collapsed[i] == static_cast<char32_t>(kSentinel) ? U' ' : collapsed[i]);
  return out;
}

EngramTokenMap build_engram_token_map(const std::vector<std::string>& texts, const std::vector<std::string>& pieces) {
  if (texts.size() != pieces.size())
    throw std::invalid_argument("engram token map: " + std::to_string(texts.size()) + " texts but " +
                                std::to_string(pieces.size()) + " pieces");
  EngramTokenMap map;
  map.ids.resize(texts.size());
  std::unordered_map<std::string, int32_t> classes;
  classes.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string key;
    if (texts[i].find(utf8::kReplacement) != std::string::npos) {
      key = pieces[i];
    } else {
      key = engram_normalize(texts[i]);
      if (key.empty()) key = texts[i];
    }
    const auto [it, inserted] = classes.try_emplace(std::move(key), static_cast<int32_t>(classes.size()));
    map.ids[i] = it->second;
  }
  map.classes = static_cast<int64_t>(classes.size());
  return map;
}

EngramTokenMap build_engram_token_map(const Tokenizer& tokenizer) {
  const size_t n = tokenizer.vocab_size();
  std::vector<std::string> texts(n), pieces(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    texts[i] = tokenizer.decode({id}, /*skip_special_tokens=*/false);
    pieces[i] = tokenizer.id_to_token(id).value_or("");
  }
  return build_engram_token_map(texts, pieces);
}

}  // namespace dsv4::text
