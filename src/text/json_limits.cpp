#include "text/json_limits.h"

namespace dsv4::text {

JsonDepthError::JsonDepthError(int max_depth)
    : std::runtime_error("JSON nesting deeper than " + std::to_string(max_depth) + " levels") {}

int json_nesting_depth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > stop_above) return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return deepest;
}

ojson parse_json_limited(std::string_view text, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth) throw JsonDepthError(max_depth);
  return ojson::parse(text.begin(), text.end());
}

}  // namespace dsv4::text
