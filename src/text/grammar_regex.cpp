#include "text/grammar_regex.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace dsv4::text {

namespace {

using Sequence = GrammarBuilder::Sequence;
using Symbol = GrammarBuilder::Symbol;
// Sorted, disjoint code point ranges.
using CodeSet = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kMaxCode = 0x10FFFF;
constexpr int kMaxNesting = 200;  // groups inside groups: bounds the parser's recursion

CodeSet normalized(CodeSet set) {
  std::sort(set.begin(), set.end());
  CodeSet out;
  for (auto [lo, hi] : set) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.push_back({lo, hi});
  }
  return out;
}

// Everything but `set`, without the surrogates (not characters in UTF-8).
CodeSet complement(const CodeSet& set) {
  CodeSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalized(set)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCode) out.push_back({next, kMaxCode});
  CodeSet cut;
  for (auto [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      cut.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) cut.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) cut.push_back({0xE000, hi});
  }
  return cut;
}

std::string encode_utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6)), s += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += char(0xE0 | (c >> 12)), s += char(0x80 | ((c >> 6) & 0x3F)), s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xF0 | (c >> 18)), s += char(0x80 | ((c >> 12) & 0x3F)), s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
  return s;
}

// A code point range of one encoded length as byte-range sequences (RE2's
// split: ranges whose low continuation bits are all-0 .. all-1 encode as a
// product of byte ranges).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  static const uint32_t kBandEnd[] = {0x7F, 0x7FF, 0xFFFF, kMaxCode};
  for (int band = 0; band < 4; ++band) {
    const uint32_t start = band == 0 ? 0 : kBandEnd[band - 1] + 1;
    if (lo > kBandEnd[band] || hi < start) continue;
    if (lo < start || hi > kBandEnd[band]) {
      utf8_sequences(std::max(lo, start), std::min(hi, kBandEnd[band]), out);
      continue;
    }
    for (int i = 1; i <= band; ++i) {
      const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_sequences(lo, lo | m, out);
          utf8_sequences((lo | m) + 1, hi, out);
          return;
        }
        if ((hi & m) != m) {
          utf8_sequences(lo, (hi & ~m) - 1, out);
          utf8_sequences(hi & ~m, hi, out);
          return;
        }
      }
    }
    const std::string a = encode_utf8(lo), b = encode_utf8(hi);
    std::vector<std::pair<uint8_t, uint8_t>> seq;
    for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
    out.push_back(seq);
    return;
  }
}

// The set without what a JSON string must escape.
CodeSet json_safe(const CodeSet& set) {
  CodeSet out;
  const CodeSet banned = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  for (auto [lo, hi] : normalized(set)) {
    uint32_t next = lo;
    for (auto [blo, bhi] : banned) {
      if (bhi < next || blo > hi) continue;
      if (blo > next) out.push_back({next, blo - 1});
      next = bhi + 1;
    }
    if (next <= hi) out.push_back({next, hi});
  }
  return out;
}

Symbol code_set_symbol(GrammarBuilder& b, const CodeSet& raw, bool json_string) {
  const CodeSet set = normalized(json_string ? json_safe(raw) : raw);
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : set) utf8_sequences(lo, hi, seqs);
  ByteSet ascii{};
  std::vector<Sequence> alternatives;
  for (const auto& seq : seqs) {
    if (seq.size() == 1) {
      for (unsigned c = seq[0].first; c <= seq[0].second; ++c) ascii[c / 64] |= uint64_t(1) << (c % 64);
      continue;
    }
    Sequence s;
    for (auto [lo, hi] : seq) s.push_back(b.byte_range(lo, hi));
    alternatives.push_back(s);
  }
  const bool has_ascii = ascii != ByteSet{};
  if (alternatives.empty()) return b.byte_set(ascii);  // (an empty class matches nothing)
  if (has_ascii) alternatives.insert(alternatives.begin(), Sequence{b.byte_set(ascii)});
  return b.choice(alternatives, "class");
}

// A cursor over the pattern / grammar text with the parsing shared by the
// regex and EBNF front ends: escapes, classes, quantifiers.
class Reader {
 public:
  Reader(GrammarBuilder& builder, std::string_view text, const char* what, bool json_string = false)
      : b_(builder), s_(text), what_(what), json_string_(json_string) {}
  Symbol set_symbol(const CodeSet& set) { return code_set_symbol(b_, set, json_string_); }
  Sequence char_literal(uint32_t code) {
    if (json_string_ && (code < 0x20 || code == '"' || code == '\\'))
      fail("a pattern that needs a quote, backslash or control character is not supported");
    return b_.literal(encode_utf8(code));
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw GrammarError(std::string(what_) + ": " + message + " at offset " + std::to_string(pos_));
  }
  bool done() const { return pos_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  bool eat(char c) {
    if (peek() != c || done()) return false;
    ++pos_;
    return true;
  }
  bool eat(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  // One UTF-8 character of the text.
  uint32_t read_char() {
    if (done()) fail("unexpected end");
    const uint8_t c = uint8_t(s_[pos_]);
    const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || pos_ + size_t(n) > s_.size()) fail("invalid UTF-8");
    uint32_t code = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) code = (code << 6) | (uint8_t(s_[pos_ + size_t(k)]) & 0x3F);
    pos_ += size_t(n);
    return code;
  }
  uint32_t read_hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = peek();
      if (!std::isxdigit(uint8_t(c))) fail("bad hex escape");
      v = v * 16 + uint32_t(std::isdigit(uint8_t(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
      ++pos_;
    }
    return v;
  }

  // A code point that UTF-8 can encode (not a surrogate, not past U+10FFFF).
  uint32_t checked(uint32_t code) {
    if (code > kMaxCode || (code >= 0xD800 && code <= 0xDFFF)) fail("escape of a code point that is not a character");
    return code;
  }

  // After a backslash: a class escape (\d ...) into `set`, or one character.
  // Returns false when it was a class.
  bool read_escape(uint32_t* code, CodeSet* set) {
    if (done()) fail("dangling backslash");
    const char c = s_[pos_++];
    const CodeSet digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                  space = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd': *set = digit; return false;
      case 'D': *set = complement(digit); return false;
      case 'w': *set = word; return false;
      case 'W': *set = complement(word); return false;
      case 's': *set = space; return false;
      case 'S': *set = complement(space); return false;
      case 'n': *code = '\n'; return true;
      case 't': *code = '\t'; return true;
      case 'r': *code = '\r'; return true;
      case 'f': *code = '\f'; return true;
      case 'v': *code = '\v'; return true;
      case '0': *code = 0; return true;
      case 'x': *code = read_hex(2); return true;
      case 'u': *code = checked(read_hex(4)); return true;
      case 'U': *code = checked(read_hex(8)); return true;
      default: break;
    }
    if (std::isalnum(uint8_t(c))) fail(std::string("unsupported escape \\") + c);
    --pos_;
    *code = read_char();
    return true;
  }

  // After '[': the class up to ']'.
  Symbol read_class() {
    const bool negated = eat('^');
    CodeSet set;
    // A ']' right after '[' or '[^' is a literal.
    for (bool first = true;; first = false) {
      if (done()) fail("unterminated character class");
      if (!first && eat(']')) break;
      uint32_t lo = 0;
      if (eat('\\')) {
        CodeSet escaped;
        if (!read_escape(&lo, &escaped)) {
          set.insert(set.end(), escaped.begin(), escaped.end());
          continue;
        }
      } else {
        lo = read_char();
      }
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        ++pos_;
        if (eat('\\')) {
          CodeSet escaped;
          if (!read_escape(&hi, &escaped)) fail("a class escape cannot end a range");
        } else {
          hi = read_char();
        }
        if (hi < lo) fail("reversed range in a character class");
      }
      set.push_back({lo, hi});
    }
    return set_symbol(negated ? complement(set) : set);
  }

  // After an atom: its quantifiers applied.
  Sequence quantified(Sequence atom) {
    for (;;) {
      int64_t min = 0, max = -1;
      if (eat('*')) {
      } else if (eat('+')) {
        min = 1;
      } else if (eat('?')) {
        max = 1;
      } else if (peek() == '{' && std::isdigit(uint8_t(peek(1)))) {
        ++pos_;
        min = read_count();
        max = min;
        if (eat(',')) max = peek() == '}' ? -1 : read_count();
        if (!eat('}')) fail("bad {m,n} quantifier");
        if (max >= 0 && max < min) fail("{m,n} with n < m");
      } else {
        return atom;
      }
      eat('?');  // lazy: the same language
      if (peek() == '+') fail("possessive quantifiers are not supported");
      atom = {b_.repeat(atom, min, max, {}, "repeat")};
    }
  }
  int64_t read_count() {
    int64_t v = 0;
    while (std::isdigit(uint8_t(peek()))) {
      v = v * 10 + (peek() - '0');
      if (v > 10000) fail("repetition counts above 10000 are not supported");
      ++pos_;
    }
    return v;
  }

  GrammarBuilder& b_;
  std::string_view s_;
  const char* what_;
  bool json_string_;
  size_t pos_ = 0;
};

class RegexParser : public Reader {
 public:
  using Reader::Reader;

  Sequence alternation(int depth) {
    if (depth > kMaxNesting) fail("groups nest too deep");
    std::vector<Sequence> alternatives = {concatenation(depth)};
    while (eat('|')) alternatives.push_back(concatenation(depth));
    if (alternatives.size() == 1) return alternatives[0];
    return {b_.choice(alternatives, "alt")};
  }

 private:
  Sequence concatenation(int depth) {
    Sequence out;
    while (!done() && peek() != '|' && peek() != ')') {
      if (eat('^')) {
        if (pos_ != 1) fail("'^' is only supported at the start");
        continue;
      }
      if (eat('$')) {
        if (!done()) fail("'$' is only supported at the end");
        continue;
      }
      out = out + quantified(atom(depth));
    }
    return out;
  }

  Sequence atom(int depth) {
    if (eat('(')) {
      if (eat("?:") || eat("?P<") || eat("?<")) {
        if (s_[pos_ - 1] == '<') {  // a named group: skip the name
          while (!done() && peek() != '>') ++pos_;
          if (!eat('>')) fail("unterminated group name");
        }
      } else if (peek() == '?') {
        fail("lookaround and inline flags are not supported");
      }
      Sequence inner = alternation(depth + 1);
      if (!eat(')')) fail("missing ')'");
      // A group is one unit for the quantifier after it.
      return {b_.choice({inner}, "group")};
    }
    if (eat('[')) return {read_class()};
    if (eat('.')) return {set_symbol(complement({{'\n', '\n'}}))};
    if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == ')') fail("nothing to repeat");
    uint32_t code = 0;
    if (eat('\\')) {
      if (std::isdigit(uint8_t(peek())) && peek() != '0') fail("backreferences are not supported");
      if (peek() == 'b' || peek() == 'B' || peek() == 'A' || peek() == 'z' || peek() == 'Z')
        fail(std::string("the anchor \\") + peek() + " is not supported");
      CodeSet set;
      if (!read_escape(&code, &set)) return {set_symbol(set)};
    } else {
      code = read_char();
    }
    return char_literal(code);
  }
};

class EbnfParser : public Reader {
 public:
  using Reader::Reader;

  Grammar parse() {
    skip_space();
    while (!done()) {
      const std::string name = identifier();
      if (name.empty()) fail("expected a rule name");
      skip_space();
      if (!eat("::=")) fail("expected '::=' after '" + name + "'");
      const uint32_t rule = rule_id(name);
      if (defined_.count(name)) fail("rule '" + name + "' is defined twice");
      defined_[name] = true;
      for (const Sequence& alternative : alternatives(0)) b_.add_alternative(rule, alternative);
    }
    for (auto& [name, id] : rules_)
      if (!defined_.count(name)) throw GrammarError("ebnf: rule '" + name + "' is used but not defined");
    auto root = rules_.find("root");
    if (root == rules_.end()) throw GrammarError("ebnf: no 'root' rule");
    return b_.build(root->second);
  }

 private:
  void skip_space() {
    for (;;) {
      while (!done() && std::isspace(uint8_t(peek()))) ++pos_;
      if (peek() != '#') return;
      while (!done() && peek() != '\n') ++pos_;
    }
  }
  static bool name_char(char c) { return std::isalnum(uint8_t(c)) || c == '_' || c == '-' || c == '.'; }
  std::string identifier() {
    const size_t start = pos_;
    while (!done() && name_char(peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  uint32_t rule_id(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    return rules_[name] = b_.new_rule(name);
  }
  // The next rule starts here ("name ::=").
  bool at_rule_start() {
    const size_t save = pos_;
    const std::string name = identifier();
    skip_space();
    const bool yes = !name.empty() && s_.substr(pos_, 3) == "::=";
    pos_ = save;
    return yes;
  }

  std::vector<Sequence> alternatives(int depth) {
    if (depth > kMaxNesting) fail("groups nest too deep");
    std::vector<Sequence> out = {sequence(depth)};
    while (eat('|')) out.push_back(sequence(depth));
    return out;
  }
  Sequence sequence(int depth) {
    Sequence out;
    for (;;) {
      skip_space();
      if (done() || peek() == '|' || peek() == ')' || at_rule_start()) return out;
      out = out + quantified(item(depth));
    }
  }
  Sequence item(int depth) {
    if (eat('(')) {
      std::vector<Sequence> inner = alternatives(depth + 1);
      skip_space();
      if (!eat(')')) fail("missing ')'");
      return {b_.choice(inner, "group")};
    }
    if (eat('[')) return {read_class()};
    if (peek() == '"' || peek() == '\'') {
      const char quote = peek();
      ++pos_;
      std::string text;
      while (!eat(quote)) {
        if (done()) fail("unterminated string");
        uint32_t code = 0;
        CodeSet set;
        if (eat('\\')) {
          if (!read_escape(&code, &set)) fail("class escapes are not allowed in strings");
        } else {
          code = read_char();
        }
        text += encode_utf8(code);
      }
      return b_.literal(text);
    }
    const std::string name = identifier();
    if (name.empty()) fail(std::string("unexpected '") + peek() + "'");
    return {GrammarBuilder::call(rule_id(name))};
  }

  std::map<std::string, uint32_t> rules_;
  std::map<std::string, bool> defined_;
};

}  // namespace

uint32_t add_regex(GrammarBuilder& builder, std::string_view pattern, bool inside_json_string) {
  RegexParser parser(builder, pattern, inside_json_string ? "pattern" : "regex", inside_json_string);
  Sequence body = parser.alternation(0);
  if (!parser.done()) parser.fail("unbalanced ')'");
  const uint32_t rule = builder.new_rule("regex");
  builder.add_alternative(rule, std::move(body));
  return rule;
}

Grammar regex_grammar(std::string_view pattern) {
  GrammarBuilder builder;
  const uint32_t root = add_regex(builder, pattern);
  return builder.build(root);
}

Grammar ebnf_grammar(std::string_view text) {
  GrammarBuilder builder;
  return EbnfParser(builder, text, "ebnf").parse();
}

}  // namespace dsv4::text
