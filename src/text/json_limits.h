// JSON parsing with a nesting limit, for every JSON text that comes from
// outside (HTTP request bodies, request files of the CLI, tool-call
// arguments). Nesting is refused before anything is built: the walks over a
// parsed value (copies, dumps, the Python-style dumper in pyjson) recurse
// once per level, so ~60k nested arrays would overflow the stack.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsv4::text {

using ojson = nlohmann::ordered_json;

// The deepest nesting allowed: arrays and objects, the outermost counting 1.
inline constexpr int kMaxJsonDepth = 128;

// A JSON text nested deeper than the limit; what() is
// "JSON nesting deeper than N levels".
struct JsonDepthError : std::runtime_error {
  explicit JsonDepthError(int max_depth);
};

// The deepest nesting of arrays and objects in `text`, counted over the
// brackets outside strings in one pass (no recursion): exact for valid JSON.
// Counting stops above `stop_above` (the result is then stop_above + 1).
int json_nesting_depth(std::string_view text, int stop_above = 1 << 30);

// ojson::parse of `text` after checking its nesting: throws JsonDepthError
// for a text nested deeper than max_depth, nlohmann's parse_error for
// malformed JSON.
ojson parse_json_limited(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace dsv4::text
