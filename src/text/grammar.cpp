#include "text/grammar.h"

#include <algorithm>

namespace dsv4::text {

using Sequence = GrammarBuilder::Sequence;
using Symbol = GrammarBuilder::Symbol;

Sequence operator+(Sequence a, const Sequence& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void GrammarBuilder::count(size_t symbols) {
  symbols_ += symbols;
  if (symbols_ > kMaxSymbols || rules_.size() > kMaxRules)
    throw GrammarError("the grammar is too large (more than " + std::to_string(kMaxRules) + " rules or " +
                       std::to_string(kMaxSymbols) + " symbols)");
}

uint32_t GrammarBuilder::new_rule(std::string name) {
  rules_.emplace_back();
  names_.push_back(std::move(name));
  count(0);
  return uint32_t(rules_.size() - 1);
}

void GrammarBuilder::add_alternative(uint32_t rule, Sequence sequence) {
  count(sequence.size() + 1);
  rules_.at(rule).push_back(std::move(sequence));
}

Symbol GrammarBuilder::byte_set(const ByteSet& set) {
  // Few distinct sets exist (JSON uses a dozen), so a linear search is fine.
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == set) return {false, uint32_t(i)};
  sets_.push_back(set);
  return {false, uint32_t(sets_.size() - 1)};
}

Symbol GrammarBuilder::byte_range(uint8_t lo, uint8_t hi) {
  ByteSet set{};
  for (unsigned b = lo; b <= hi; ++b) set[b / 64] |= uint64_t(1) << (b % 64);
  return byte_set(set);
}

Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence out;
  for (char c : text) out.push_back(byte_range(uint8_t(c), uint8_t(c)));
  return out;
}

Symbol GrammarBuilder::literals(std::vector<std::string> texts, const std::string& name) {
  std::sort(texts.begin(), texts.end());
  texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
  if (texts.empty()) throw GrammarError("no literal to choose from");
  return call(literal_tree(texts, 0, texts.size(), 0, name));
}

// texts[begin, end) (sorted, distinct) share their first `depth` bytes: a rule
// with one alternative per next byte, each the group's common part and then,
// where the group still branches, the subtree.
uint32_t GrammarBuilder::literal_tree(const std::vector<std::string>& texts, size_t begin, size_t end, size_t depth,
                                      const std::string& name) {
  const uint32_t rule = new_rule(name);
  size_t i = begin;
  if (texts[i].size() == depth) add_alternative(rule, {}), ++i;  // sorted: a text that ends here comes first
  while (i < end) {
    size_t j = i + 1;
    while (j < end && texts[j][depth] == texts[i][depth]) ++j;
    if (j - i == 1) {
      add_alternative(rule, literal(std::string_view(texts[i]).substr(depth)));
    } else {
      // Sorted: the first and last of the group bound its common prefix.
      size_t common = depth;
      while (common < texts[i].size() && common < texts[j - 1].size() && texts[i][common] == texts[j - 1][common])
        ++common;
      add_alternative(rule, literal(std::string_view(texts[i]).substr(depth, common - depth)) +
                                Sequence{call(literal_tree(texts, i, j, common, name))});
    }
    i = j;
  }
  return rule;
}

Symbol GrammarBuilder::choice(const std::vector<Sequence>& alternatives, const std::string& name) {
  const uint32_t rule = new_rule(name);
  for (const Sequence& s : alternatives) add_alternative(rule, s);
  return call(rule);
}

Symbol GrammarBuilder::optional(Sequence body, const std::string& name) {
  const uint32_t rule = new_rule(name);
  add_alternative(rule, std::move(body));
  add_alternative(rule, {});
  return call(rule);
}

Symbol GrammarBuilder::star(Sequence body, const std::string& name) {
  // R := body R | ε: the call of R is last, so it runs without stack growth.
  const uint32_t rule = new_rule(name);
  body.push_back(call(rule));
  add_alternative(rule, std::move(body));
  add_alternative(rule, {});
  return call(rule);
}

Symbol GrammarBuilder::repeat(const Sequence& body, int64_t min, int64_t max, const Sequence& separator,
                              const std::string& name) {
  if (min < 0 || (max >= 0 && max < min)) throw GrammarError("invalid repetition bounds");
  if (min > 10000 || max > 10000) throw GrammarError("repetition bounds above 10000 are not supported");
  // tail := (separator body){0..max-min} after the first; the whole is
  // ε (only when min == 0) | body tail.
  Symbol tail;
  if (max < 0) {
    tail = star(separator + body, name + "_more");
  } else {
    // Optional extra items as a chain of rules, innermost first.
    const uint32_t none = new_rule(name + "_end");
    add_alternative(none, {});
    tail = call(none);
    for (int64_t i = 0; i < max - std::max<int64_t>(min, 1); ++i) tail = optional(separator + body + Sequence{tail});
  }
  for (int64_t i = 1; i < min; ++i) tail = choice({separator + body + Sequence{tail}}, name + "_req");
  const uint32_t rule = new_rule(name);
  if (max != 0) add_alternative(rule, body + Sequence{tail});
  if (min == 0) add_alternative(rule, {});
  return call(rule);
}

Grammar GrammarBuilder::build(uint32_t root) const {
  const size_t n = rules_.size();
  if (root >= n) throw GrammarError("no root rule");
  // Productive rules (can finish on a finite string), then nullable ones.
  std::vector<char> productive(n, 0), nullable(n, 0);
  auto fixpoint = [&](std::vector<char>& flag, bool bytes_ok) {
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (flag[r]) continue;
        for (const Sequence& s : rules_[r]) {
          bool ok = true;
          for (const Symbol& sym : s) ok = ok && (sym.is_rule ? flag[sym.id] && productive[sym.id] : bytes_ok);
          if (ok) {
            flag[r] = 1, changed = true;
            break;
          }
        }
      }
    }
  };
  fixpoint(productive, true);
  if (!productive[root]) throw GrammarError("the grammar cannot produce any finite text");
  fixpoint(nullable, false);

  // Left recursion: a cycle of calls at the left edge of alternatives
  // (behind nullable symbols only). Iterative DFS: a chain of 20000 $refs
  // must not exhaust the stack.
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& s : rules_[r]) {
      for (const Symbol& sym : s) {
        if (!sym.is_rule) break;
        if (!productive[sym.id]) break;
        left[r].push_back(sym.id);
        if (!nullable[sym.id]) break;
      }
    }
  std::vector<char> color(n, 0);  // 0 new, 1 on the path, 2 done
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<uint32_t, size_t>> path = {{uint32_t(start), 0}};
    color[start] = 1;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      if (next == left[rule].size()) {
        color[rule] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t callee = left[rule][next++];
      if (color[callee] == 1)
        throw GrammarError("the grammar is left-recursive (rule '" + names_[callee] +
                           "' can call itself before reading any text)");
      if (color[callee] == 0) {
        color[callee] = 1;
        path.push_back({callee, 0});
      }
    }
  }

  Grammar g;
  g.byte_sets = sets_;
  g.rule_names = names_;
  g.root = root;
  g.rule_starts.resize(n);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& s : rules_[r]) {
      bool ok = true;
      for (const Symbol& sym : s) ok = ok && (!sym.is_rule || productive[sym.id]);
      if (!ok) continue;  // can never finish: drop it, so the matcher never enters a dead end
      g.rule_starts[r].push_back(uint32_t(g.positions.size()));
      for (const Symbol& sym : s)
        g.positions.push_back({sym.is_rule ? Grammar::Kind::Call : Grammar::Kind::Bytes, sym.id});
      g.positions.push_back({Grammar::Kind::End, 0});
    }
  return g;
}

// ---- the matcher ----

void ParseState::push_stack(const std::vector<uint32_t>& stack) {
  // Parses that reach the same stack are one parse from here on.
  const size_t length = stack.size();
  for (size_t i = 0; i + 1 < starts_.size(); ++i)
    if (starts_[i + 1] - starts_[i] == length && std::equal(stack.begin(), stack.end(), data_.begin() + starts_[i]))
      return;
  if (size() >= kMaxParses) return;
  data_.insert(data_.end(), stack.begin(), stack.end());
  starts_.push_back(uint32_t(data_.size()));
}

// Expands `stack` until every parse has a byte set on top: calls push the
// callee's alternatives, ends return to the caller. Other alternatives wait
// in a pool of vectors that keep their capacity (this runs once per byte of
// every token walk: no allocation in the steady state).
void ParseState::settle(const Grammar& grammar, std::vector<uint32_t>& stack) {
  thread_local std::vector<std::vector<uint32_t>> pool;
  thread_local size_t pooled = 0;
  const size_t base = pooled;
  size_t budget = 100000;  // bounds the expansion of pathological grammars
  for (;;) {
    while (budget > 0) {
      --budget;
      if (stack.empty()) {
        complete_ = true;
        break;
      }
      const uint32_t position = stack.back();
      const Grammar::Position& at = grammar.positions[position];
      if (at.kind == Grammar::Kind::Bytes) {
        push_stack(stack);
        break;
      }
      if (at.kind == Grammar::Kind::End) {
        stack.pop_back();
        continue;
      }
      // A call: the caller resumes after it (no frame when nothing follows).
      stack.back() = position + 1;
      if (grammar.positions[position + 1].kind == Grammar::Kind::End) stack.pop_back();
      const std::vector<uint32_t>& starts = grammar.rule_starts[at.arg];
      if (starts.empty() || stack.size() >= kMaxDepth) break;
      for (size_t i = 0; i + 1 < starts.size(); ++i) {
        if (pooled == pool.size()) pool.emplace_back();
        pool[pooled].assign(stack.begin(), stack.end());
        pool[pooled++].push_back(starts[i]);
      }
      stack.push_back(starts.back());
    }
    if (pooled == base) break;
    stack.swap(pool[--pooled]);
  }
}

ParseState ParseState::initial(const Grammar& grammar) {
  ParseState state;
  for (uint32_t start : grammar.rule_starts[grammar.root]) {
    std::vector<uint32_t> stack = {start};
    state.settle(grammar, stack);
  }
  return state;
}

ParseState ParseState::from_stack(const uint32_t* frames, size_t count) {
  ParseState state;
  state.data_.assign(frames, frames + count);
  state.starts_ = {0, uint32_t(count)};
  return state;
}

ParseState ParseState::single(size_t i) const {
  ParseState state;
  state.data_.assign(data_.begin() + starts_[i], data_.begin() + starts_[i + 1]);
  state.starts_ = {0, uint32_t(state.data_.size())};
  return state;
}

void ParseState::advance(const Grammar& grammar, uint8_t byte, ParseState& out) const {
  out.clear();
  thread_local std::vector<uint32_t> stack;
  for (size_t i = 0; i + 1 < starts_.size(); ++i) {
    const uint32_t position = data_[starts_[i + 1] - 1];
    if (!byteset_has(grammar.byte_sets[grammar.positions[position].arg], byte)) continue;
    stack.assign(data_.begin() + starts_[i], data_.begin() + starts_[i + 1]);
    stack.back() = position + 1;
    out.settle(grammar, stack);
  }
}

bool grammar_accepts(const Grammar& grammar, std::string_view text) {
  ParseState state = ParseState::initial(grammar), next;
  if (text.empty()) {
    // The root is nullable when an empty alternative completes at once.
    return state.complete();
  }
  for (char c : text) {
    state.advance(grammar, uint8_t(c), next);
    std::swap(state, next);
    if (state.empty() && !state.complete()) return false;
  }
  return state.complete();
}

}  // namespace dsv4::text
