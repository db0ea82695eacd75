// JSON text exactly as Python's `json.dumps(obj, ensure_ascii=False)` writes
// it. The DeepSeek encoders embed tool schemas and tool arguments in the
// prompt with that function, so any other formatting (nlohmann's compact
// output, different float spelling) changes the prompt bytes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dsv4::text {

using ojson = nlohmann::ordered_json;

// Separators ", " and ": ", object keys in insertion order, non-ASCII raw,
// floats in Python repr form (1.0, 1e-05, 1e+16).
std::string python_json_dumps(const ojson& value);

// Python repr of a float (shortest round-trip digits, Python's layout).
std::string python_float_repr(double v);

// What Python's str() gives for a scalar JSON value used in str.format():
// strings verbatim, null -> "None", booleans -> "True"/"False".
std::string python_str(const ojson& value);

// Python truthiness of a JSON value (empty string/array/object, 0, null, false
// are falsy), which the reference encoder relies on in `if tools:` etc.
bool python_truthy(const ojson& value);

}  // namespace dsv4::text
