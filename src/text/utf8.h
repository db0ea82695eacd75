// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the
// output parsers. Replacement follows the Unicode "maximal subpart" rule,
// which is what Rust's String::from_utf8_lossy (and therefore HF tokenizers)
// does, so our decode output is byte-identical to the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::text::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes at
// i do not start a complete valid sequence. `*maximal_subpart` receives the
// number of bytes that form the maximal invalid subpart (>= 1) when 0 is
// returned and the sequence is complete-but-invalid; when the input ends in
// the middle of a still-valid prefix, `*truncated` is set.
inline size_t sequence_length(std::string_view s, size_t i, size_t* maximal_subpart, bool* truncated) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *truncated = false;
  *maximal_subpart = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      *truncated = true;
      *maximal_subpart = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = (k == 1) ? lo : 0x80;
    const unsigned char h = (k == 1) ? hi : 0xBF;
    if (b < l || b > h) {
      *maximal_subpart = k;
      return 0;
    }
  }
  return need;
}

inline bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path: most text is ASCII and this loop dominates validation.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t sub;
    bool trunc;
    const size_t n = sequence_length(s, i, &sub, &trunc);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// Lossy conversion: every maximal invalid subpart becomes U+FFFD.
inline std::string to_valid_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t sub;
    bool trunc;
    const size_t n = sequence_length(s, i, &sub, &trunc);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += sub;
    }
  }
  return out;
}

// Number of leading bytes of `s` that can be emitted now without ever having to
// be changed later: everything except a trailing incomplete-but-still-valid
// prefix of a multi-byte sequence.
inline size_t stable_prefix_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t sub;
    bool trunc;
    const size_t n = sequence_length(s, i, &sub, &trunc);
    if (n) {
      i += n;
    } else if (trunc) {
      return i;
    } else {
      i += sub;
    }
  }
  return i;
}

// Length of the longest prefix of `s` that does not end inside a UTF-8
// sequence (assuming `s` is valid up to a possibly truncated tail).
inline size_t complete_prefix_length(std::string_view s) {
  size_t n = s.size();
  size_t back = 0;
  while (back < 4 && back < n) {
    const auto b = static_cast<unsigned char>(s[n - 1 - back]);
    if ((b & 0xC0) != 0x80) {
      size_t len = b < 0x80 ? 1 : (b >= 0xF0 ? 4 : (b >= 0xE0 ? 3 : (b >= 0xC0 ? 2 : 1)));
      if (len > back + 1) return n - 1 - back;
      return n;
    }
    ++back;
  }
  return n;
}

}  // namespace dsv4::text::utf8
