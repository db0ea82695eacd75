// The nesting limit of every JSON input (request bodies, CLI request files,
// tool-call arguments): counted exactly, refused before parsing.
#include <gtest/gtest.h>

#include <string>

#include "text/json_limits.h"

namespace dsv4::text {
namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(size_t(depth), open) + std::string(size_t(depth), close);
}

std::string nested_objects(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(size_t(depth), '}');
  return s;
}

TEST(JsonLimits, DepthIsCountedOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth("[[1],[[2]]]"), 3);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[{{{{","b":[1]})"), 2);
  EXPECT_EQ(json_nesting_depth(R"(["\"[[[", "\\", [[]]])"), 3);  // escaped quote and backslash
  EXPECT_EQ(json_nesting_depth(nested_objects(300)), 300);
  EXPECT_EQ(json_nesting_depth(nested(100000), 128), 129);  // stops counting past the limit
}

TEST(JsonLimits, ParsesUpToTheLimitAndRefusesDeeper) {
  EXPECT_EQ(parse_json_limited(nested(kMaxJsonDepth)).size(), 1u);
  EXPECT_TRUE(parse_json_limited(nested_objects(kMaxJsonDepth)).is_object());
  EXPECT_THROW(parse_json_limited(nested(kMaxJsonDepth + 1)), JsonDepthError);
  EXPECT_THROW(parse_json_limited(nested_objects(kMaxJsonDepth + 1)), JsonDepthError);
  try {
    parse_json_limited(nested(100000, '{', '}'));
    FAIL() << "100k nested objects parsed";
  } catch (const JsonDepthError& e) {
    EXPECT_STREQ(e.what(), "JSON nesting deeper than 128 levels");
  }
  // Deep nesting inside a string is only text.
  const std::string in_string = "{\"s\":\"" + nested(100000) + "\"}";
  EXPECT_EQ(parse_json_limited(in_string)["s"].get<std::string>().size(), 200000u);
  // Malformed JSON is still nlohmann's parse_error; a smaller limit applies.
  EXPECT_THROW(parse_json_limited("{\"a\":"), ojson::parse_error);
  EXPECT_THROW(parse_json_limited("[[1]]", 1), JsonDepthError);
  // Unbalanced deep input is refused by depth before the parser sees it.
  EXPECT_THROW(parse_json_limited(std::string(100000, '[')), JsonDepthError);
}

}  // namespace
}  // namespace dsv4::text
