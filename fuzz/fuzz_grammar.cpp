// Grammar front ends fuzz target: JSON Schema (first byte even), regex
// (odd, bit 1 clear) and EBNF (odd, bit 1 set) from the rest of the input.
// Properties: nothing but GrammarError escapes a compiler; compiling and
// matching stay bounded in time and memory on hostile input (deep $ref
// chains, huge counts, left recursion, ambiguity); a compiled grammar runs
// over the input's bytes and computes masks over a small vocabulary.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/grammar.h"
#include "text/grammar_json.h"
#include "text/grammar_matcher.h"
#include "text/grammar_regex.h"

using namespace dsv4::text;

namespace {

const std::shared_ptr<const TokenTrie>& small_trie() {
  static const auto trie = std::make_shared<const TokenTrie>(std::vector<std::string>{
      "{", "}", "[", "]", "\"", ",", ":", " ", "a", "ab", "1", "12", "-", ".", "e", "true", "null", "\\", "\\n",
      "\xc3\xa9", "x\"", "\",", "(", ")", "0", "9", "\n", "é€", "{\"a\":"});
  return trie;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  Grammar grammar;
  try {
    if ((mode & 1) == 0) {
      const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
      if (schema.is_discarded()) return 0;
      grammar = json_schema_grammar(schema, {int64_t(mode >> 4)});
    } else if ((mode & 2) == 0) {
      grammar = regex_grammar(text);
    } else {
      grammar = ebnf_grammar(text);
    }
  } catch (const GrammarError&) {
    return 0;
  }
  // Run the text itself through the matcher (usually rejected early), then a
  // few masks along a greedy path over the small vocabulary.
  (void)grammar_accepts(grammar, text);
  auto compiled = std::make_shared<const CompiledGrammar>(grammar, small_trie());
  GrammarMatcher matcher(compiled);
  for (int step = 0; step < 16; ++step) {
    TokenMask mask((small_trie()->vocab_size() + 63) / 64, 0);
    matcher.fill_mask(mask);
    int32_t pick = -1;
    for (size_t t = 0; t < small_trie()->vocab_size(); ++t)
      if (mask_has(mask, int64_t(t)) && (pick < 0 || (t + size_t(step) * 7) % 5 == 0)) pick = int32_t(t);
    if (pick < 0) break;
    if (!matcher.accept(pick)) __builtin_trap();  // a masked-in token must be accepted
  }
  return 0;
}
