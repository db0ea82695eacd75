// DSML scanning helpers of the output parser: tag spellings, attribute
// parsing and marker searches, each answering only from the text it is given
// so that the streaming parser stays independent of how the text is cut.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/output_parser.h"

namespace dsv4::text::dsml {

inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Longest suffix of `buf` that is a proper prefix of one of `patterns`: text
// that may still turn into a marker and therefore cannot be released yet.
size_t pending_marker_suffix(std::string_view buf, const std::vector<std::string>& patterns);

struct Found {
  size_t pos = std::string_view::npos;
  size_t marker = 0;
};
// The first of `markers` in `buf` (the longest at a tie).
Found find_first(std::string_view buf, const std::vector<std::string>& markers);

// Decodes &lt; &gt; &amp; &quot; (ds4's tolerance).
std::string decode_entities(std::string_view s);

// DSML tag spellings for one dialect.
struct DsmlTags {
  std::vector<std::string> block_open, block_close, invoke_open, invoke_close, param_open, param_close;
};
DsmlTags tags_for(ToolParserKind kind, bool accept_short);

bool starts_with_any(std::string_view s, const std::vector<std::string>& pats, size_t* len);
bool is_proper_prefix_of_any(std::string_view s, const std::vector<std::string>& pats);

// parse_attributes: the tag may still be completed by text yet to come.
constexpr size_t kNeedMore = std::string_view::npos - 1;
// A DSML tag still open after this many bytes is malformed: waiting longer
// would rescan an ever longer attribute on every chunk.
constexpr size_t kMaxTagBytes = 4096;

// Parses `key="value"` attributes up to the closing '>'. Returns the offset
// just past '>', npos when malformed, or kNeedMore when `s` ends first; each
// answer but kNeedMore holds for every continuation of `s`, which keeps the
// streaming parser independent of how the text is cut.
size_t parse_attributes(std::string_view s, std::vector<std::pair<std::string, std::string>>& attrs);

// The earliest of the tags in `s` from `from`; pos npos when none occurs.
struct TagHit {
  size_t pos = std::string_view::npos;
  size_t len = 0;
  size_t list = 0;  // which of the lists the tag is from
};
TagHit find_earliest(std::string_view s, size_t from, std::initializer_list<const std::vector<std::string>*> lists);

// The value of attribute `key`, or null.
const std::string* attr(const std::vector<std::pair<std::string, std::string>>& attrs, std::string_view key);

}  // namespace dsv4::text::dsml
