// The grammar IR of constrained decoding: a context-free grammar over bytes,
// which JSON schemas, DSML tool calls (and the regex / EBNF front ends) compile
// to, and the pushdown matcher that runs it one byte at a time.
//
// A grammar is a list of rules; a rule is a list of alternatives; an
// alternative is a sequence of symbols, each a byte class (a set of bytes) or
// a call of a rule. The matcher keeps every live parse as a stack of
// positions (where it is in which alternative), bottom first: the parse of a
// deterministic grammar such as JSON is a single stack. A call that is the
// last symbol of its alternative does not keep a return frame, so right
// recursion (repetition) runs in constant stack depth. Left recursion cannot
// run on such a machine and is rejected when the grammar is built.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

// A grammar or schema the engine cannot compile: the message is for the client
// (HTTP 400).
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using ByteSet = std::array<uint64_t, 4>;
inline bool byteset_has(const ByteSet& set, uint8_t byte) { return (set[byte / 64] >> (byte % 64)) & 1; }

// A flattened grammar: every symbol of every alternative is a position, and an
// alternative's positions are consecutive and end with an End position.
struct Grammar {
  enum class Kind : uint8_t { Bytes, Call, End };
  struct Position {
    Kind kind;
    uint32_t arg;  // Bytes: index into byte_sets; Call: the rule
  };
  std::vector<Position> positions;
  std::vector<ByteSet> byte_sets;
  std::vector<std::vector<uint32_t>> rule_starts;  // per rule: the first position of each alternative
  std::vector<std::string> rule_names;
  uint32_t root = 0;
};

// Builds a Grammar. Rules are made first and given alternatives later, so that
// recursive structures (JSON values, $ref) can refer to themselves.
class GrammarBuilder {
 public:
  struct Symbol {
    bool is_rule = false;
    uint32_t id = 0;  // a byte-set index or a rule
  };
  using Sequence = std::vector<Symbol>;

  // Bounds on hostile input (deep $ref chains, huge enums, big counts).
  static constexpr size_t kMaxRules = 20000;
  static constexpr size_t kMaxSymbols = 400000;

  uint32_t new_rule(std::string name);
  void add_alternative(uint32_t rule, Sequence sequence);
  size_t rule_count() const { return rules_.size(); }

  Symbol byte_set(const ByteSet& set);
  Symbol byte_range(uint8_t lo, uint8_t hi);
  static Symbol call(uint32_t rule) { return {true, rule}; }
  // The bytes of `text`, one symbol each.
  Sequence literal(std::string_view text);
  // One of `texts`, as a prefix tree: one parse however many texts share a
  // start (a flat choice would keep a parse per text, at most 256).
  Symbol literals(std::vector<std::string> texts, const std::string& name = "literals");

  // New rules for the usual combinators.
  Symbol choice(const std::vector<Sequence>& alternatives, const std::string& name = "choice");
  Symbol optional(Sequence body, const std::string& name = "opt");
  Symbol star(Sequence body, const std::string& name = "star");
  // body repeated min..max times (max < 0: unbounded), separated by `separator`.
  Symbol repeat(const Sequence& body, int64_t min, int64_t max, const Sequence& separator = {},
                const std::string& name = "rep");

  // Checks (every rule can finish, no left recursion) and flattens. Throws
  // GrammarError.
  Grammar build(uint32_t root) const;

 private:
  void count(size_t symbols);
  uint32_t literal_tree(const std::vector<std::string>& texts, size_t begin, size_t end, size_t depth,
                        const std::string& name);
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> rules_;
  std::vector<ByteSet> sets_;
  size_t symbols_ = 0;
};

GrammarBuilder::Sequence operator+(GrammarBuilder::Sequence a, const GrammarBuilder::Sequence& b);

// The live parses after some input: stacks of positions stored back to back
// (stack i is data[starts[i] .. starts[i+1]) ), each with a byte-set position
// on top. `complete`: some parse finished the root rule with the last byte.
class ParseState {
 public:
  bool empty() const { return starts_.size() <= 1; }
  size_t size() const { return starts_.size() - 1; }
  bool complete() const { return complete_; }
  const uint32_t* stack(size_t i, size_t* length) const {
    *length = starts_[i + 1] - starts_[i];
    return data_.data() + starts_[i];
  }
  uint32_t top(size_t i) const { return data_[starts_[i + 1] - 1]; }
  void clear() {
    data_.clear();
    starts_.assign(1, 0);
    complete_ = false;
  }
  bool operator==(const ParseState& other) const = default;

  // The start of the grammar (the root's alternatives, expanded).
  static ParseState initial(const Grammar& grammar);
  // One parse from the given stack (bottom first) alone: popping its bottom
  // frame is `complete` (used to classify tokens by the top of a stack).
  static ParseState from_stack(const uint32_t* frames, size_t count);
  // One stack of this state as a state of its own.
  ParseState single(size_t i) const;

  // The parses after one more byte (into `out`, cleared first); at most
  // kMaxParses survive (ambiguous grammars), which keeps every survivor sound.
  void advance(const Grammar& grammar, uint8_t byte, ParseState& out) const;
  static constexpr size_t kMaxParses = 256;
  static constexpr size_t kMaxDepth = 4096;

 private:
  // Expands `stack` (used as scratch) into parses with a byte set on top.
  void settle(const Grammar& grammar, std::vector<uint32_t>& stack);
  void push_stack(const std::vector<uint32_t>& stack);
  std::vector<uint32_t> data_;
  std::vector<uint32_t> starts_ = {0};
  bool complete_ = false;
};

// Whether `text` is a complete sentence of the grammar (tests, tools).
bool grammar_accepts(const Grammar& grammar, std::string_view text);

}  // namespace dsv4::text
