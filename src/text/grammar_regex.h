// SGLang's `regex` and `ebnf` constraints compiled to the grammar IR
// (grammar.h), and the regex subset JSON Schema's `pattern` uses.
#pragma once

#include <string_view>

#include "text/grammar.h"

namespace dsv4::text {

// The rule of strings that fully match `pattern` (the output must match as a
// whole; ^ and $ at the ends are allowed and mean nothing more). Supported:
// literals (UTF-8), '.', classes [...] / [^...] with ranges and \d \w \s \D
// \W \S, escapes (\n \t \r \f \v \xHH \uHHHH, escaped punctuation), groups
// (...) (?:...) (?<name>...) (?P<name>...), alternation, quantifiers * + ?
// {m} {m,} {m,n} (a lazy '?' after them changes nothing here). Not supported
// (GrammarError naming it): backreferences, lookaround, other anchors.
// `inside_json_string`: for JSON Schema's `pattern`, the characters JSON must
// escape ('"', '\\', controls) are left out of every class, so what the regex
// produces can be written between quotes as is (a subset of its matches).
uint32_t add_regex(GrammarBuilder& builder, std::string_view pattern, bool inside_json_string = false);
Grammar regex_grammar(std::string_view pattern);

// An EBNF grammar in the GBNF / xgrammar notation SGLang takes: rules
// `name ::= expression`, the start rule `root`; expressions of "strings",
// 'strings', [classes], rule names, ( groups ), | alternatives and the
// quantifiers * + ? {m} {m,} {m,n}; # comments.
Grammar ebnf_grammar(std::string_view text);

}  // namespace dsv4::text
