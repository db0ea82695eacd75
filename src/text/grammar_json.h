// JSON Schema (the structured-outputs subset) and free-form JSON compiled to the
// grammar IR (grammar.h).
//
// Output is compact, bounded JSON: no whitespace except an optional single
// space after ':' and ','; numbers have at most 16 integer and 15 fraction
// digits and a two-digit exponent (always a finite double); free-form values
// nest at most kAnyJsonDepth deep. Bounds keep a sampler that draws from a
// weak model inside structures it can finish.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "text/grammar.h"

namespace dsv4::text {

constexpr int kAnyJsonDepth = 8;

struct JsonGrammarOptions {
  // Strings without a maxLength (free-form keys included) hold at most this
  // many characters; 0: unlimited. A server option: a model that never closes
  // a string (a test's random weights, a looping real one) ends anyway.
  int64_t max_string_chars = 0;
};

// The rule of a JSON value that validates against `schema` (added to
// `builder`). Supported: type (and lists of types), properties, required,
// additionalProperties, items, minItems, maxItems, enum, const, anyOf, $ref
// into $defs / definitions / the root, minLength, maxLength, pattern (the
// regex subset of grammar_regex.h; generated strings match it as a whole) and
// format date-time, date, time, uuid, email, ipv4; annotations (title, description, default, examples, ...) are
// ignored. Anything else is a GrammarError that names the keywords. Objects
// with `properties` get exactly those keys, in schema order (required ones
// always, optional ones maybe): additional properties are never generated,
// which any schema allows.
uint32_t add_json_schema(GrammarBuilder& builder, const nlohmann::ordered_json& schema,
                         const JsonGrammarOptions& options = {});
// The rule of any JSON value / object (nesting bounded by kAnyJsonDepth).
uint32_t add_any_json_value(GrammarBuilder& builder, const JsonGrammarOptions& options = {});
uint32_t add_any_json_object(GrammarBuilder& builder, const JsonGrammarOptions& options = {});

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonGrammarOptions& options = {});
Grammar json_object_grammar(const JsonGrammarOptions& options = {});

}  // namespace dsv4::text
