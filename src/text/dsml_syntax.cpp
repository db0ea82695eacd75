#include "text/dsml_syntax.h"

#include <algorithm>
#include <cctype>

namespace dsv4::text::dsml {

size_t pending_marker_suffix(std::string_view buf, const std::vector<std::string>& patterns) {
  size_t best = 0;
  for (const auto& p : patterns) {
    const size_t max_len = std::min(p.size() - 1, buf.size());
    for (size_t len = max_len; len > best; --len) {
      if (buf.compare(buf.size() - len, len, p, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

Found find_first(std::string_view buf, const std::vector<std::string>& markers) {
  Found f;
  for (size_t i = 0; i < markers.size(); ++i) {
    const size_t p = buf.find(markers[i]);
    if (p == std::string_view::npos) continue;
    if (p < f.pos || (p == f.pos && markers[i].size() > markers[f.marker].size())) {
      f.pos = p;
      f.marker = i;
    }
  }
  return f;
}

std::string decode_entities(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '&') {
      static const std::pair<std::string_view, char> ents[] = {
          {"&lt;", '<'}, {"&gt;", '>'}, {"&amp;", '&'}, {"&quot;", '"'}};
      bool matched = false;
      for (const auto& [e, c] : ents) {
        if (s.compare(i, e.size(), e) == 0) {
          out.push_back(c);
          i += e.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    out.push_back(s[i++]);
  }
  return out;
}

DsmlTags tags_for(ToolParserKind kind, bool accept_short) {
  const bool v41 = kind == ToolParserKind::DeepSeekV41;
  const std::string block = v41 ? " calls" : "tool_calls";
  const std::string invoke = v41 ? " invoke" : "invoke";
  const std::string param = v41 ? " parameter" : "parameter";
  DsmlTags t;
  std::vector<std::string> markers = {"｜DSML｜"};
  if (accept_short) markers.push_back("DSML｜");
  for (const auto& m : markers) {
    t.block_open.push_back("<" + m + block + ">");
    t.block_close.push_back("</" + m + block + ">");
    t.invoke_open.push_back("<" + m + invoke);
    t.invoke_close.push_back("</" + m + invoke + ">");
    t.param_open.push_back("<" + m + param);
    t.param_close.push_back("</" + m + param + ">");
  }
  return t;
}

bool starts_with_any(std::string_view s, const std::vector<std::string>& pats, size_t* len) {
  for (const auto& p : pats) {
    if (s.size() >= p.size() && s.compare(0, p.size(), p) == 0) {
      *len = p.size();
      return true;
    }
  }
  return false;
}

bool is_proper_prefix_of_any(std::string_view s, const std::vector<std::string>& pats) {
  for (const auto& p : pats) {
    if (s.size() < p.size() && p.compare(0, s.size(), s) == 0) return true;
  }
  return false;
}

size_t parse_attributes(std::string_view s, std::vector<std::pair<std::string, std::string>>& attrs) {
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i < s.size();
  };
  while (true) {
    if (!skip_ws()) return kNeedMore;
    if (s[i] == '>') return i + 1;
    size_t k = i;
    while (k < s.size() && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_' || s[k] == '-')) ++k;
    if (k == s.size()) return kNeedMore;
    if (k == i) return std::string_view::npos;
    std::string key(s.substr(i, k - i));
    i = k;
    if (!skip_ws()) return kNeedMore;
    if (s[i] != '=') return std::string_view::npos;
    ++i;
    if (!skip_ws()) return kNeedMore;
    if (s[i] != '"') return std::string_view::npos;
    const size_t close = s.find('"', i + 1);
    if (close == std::string_view::npos) return kNeedMore;
    attrs.emplace_back(std::move(key), std::string(s.substr(i + 1, close - i - 1)));
    i = close + 1;
  }
}

TagHit find_earliest(std::string_view s, size_t from, std::initializer_list<const std::vector<std::string>*> lists) {
  TagHit hit;
  size_t which = 0;
  for (const auto* tags : lists) {
    for (const auto& tag : *tags) {
      const size_t p = s.find(tag, from);
      if (p != std::string_view::npos && p < hit.pos) hit = {p, tag.size(), which};
    }
    ++which;
  }
  return hit;
}

const std::string* attr(const std::vector<std::pair<std::string, std::string>>& attrs, std::string_view key) {
  for (const auto& [k, v] : attrs) {
    if (k == key) return &v;
  }
  return nullptr;
}

}  // namespace dsv4::text::dsml
