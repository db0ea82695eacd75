// The compressed token map of DeepSeek-V4.1's Engram layers. Engram hashes
// n-grams of *compressed* token ids: every token id is mapped to the class of
// tokens whose text normalizes alike (" The", "the", "THE" share one class),
// so the map must equal the official one id for id, or every n-gram lands in
// a different embedding row. The class count must equal the config's
// engram_compressed_vocab_size (99092 for the V4.1 tokenizer); the hash
// multipliers are derived from it (core/numpy_random.h).
//
// Key of token i:
//   text = decode([i]) alone, special tokens kept;
//   text holds U+FFFD (a partial UTF-8 byte sequence)  -> its raw vocabulary
//       piece (the tokenizer.json string, e.g. "<0x80>" or "Ġ...");
//   otherwise engram_normalize(text), or text itself when that is empty.
// Classes are numbered in the order their key is first seen, scanning ids
// upwards.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace dsv4::text {

struct EngramTokenMap {
  std::vector<int32_t> ids;  // token id -> compressed id
  int64_t classes = 0;       // number of distinct compressed ids
};

// The Hugging Face `tokenizers` normalizer sequence the official code uses:
// NFKC, NFD, strip combining marks (General_Category Mark), per-character
// lowercase, runs of [ \t\r\n] -> one space, then Strip (White_Space on both
// sides) except that a string that is exactly one space stays one space.
// Input is UTF-8 (invalid bytes are read as U+FFFD); output is UTF-8.
std::string engram_normalize(std::string_view text);

// texts[i]: what id i decodes to alone; pieces[i]: its vocabulary string.
// Throws std::invalid_argument when the sizes differ.
EngramTokenMap build_engram_token_map(const std::vector<std::string>& texts, const std::vector<std::string>& pieces);

// Over every id in [0, tokenizer.vocab_size()).
EngramTokenMap build_engram_token_map(const Tokenizer& tokenizer);

}  // namespace dsv4::text
