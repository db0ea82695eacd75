#include "text/grammar_matcher.h"

#include <algorithm>
#include <deque>
#include <list>
#include <map>

namespace dsv4::text {

// ---- the vocabulary trie ----

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes) : token_bytes_(token_bytes) {
  std::vector<int32_t> order;
  for (size_t t = 0; t < token_bytes.size(); ++t)
    if (!token_bytes[t].empty() && token_bytes[t].size() < 65535) order.push_back(int32_t(t));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int c = token_bytes[size_t(a)].compare(token_bytes[size_t(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  // Sorted strings visit the trie in preorder: each string shares a prefix
  // with the previous one, closes the nodes below that prefix and opens its own.
  bytes_ = {0};
  depth_ = {0};
  subtree_end_ = {0};
  tokens_begin_ = {0};
  std::vector<uint32_t> path = {0};  // node at each depth of the current string
  const std::string* previous = nullptr;
  for (int32_t token : order) {
    const std::string& s = token_bytes[size_t(token)];
    size_t common = 0;
    if (previous)
      while (common < s.size() && common < previous->size() && s[common] == (*previous)[common]) ++common;
    while (path.size() > common + 1) {
      subtree_end_[path.back()] = uint32_t(bytes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(uint32_t(bytes_.size()));
      bytes_.push_back(uint8_t(s[d]));
      depth_.push_back(uint16_t(d + 1));
      subtree_end_.push_back(0);
      tokens_begin_.push_back(uint32_t(token_ids_.size()));
    }
    token_ids_.push_back(token);
    previous = &s;
  }
  while (!path.empty()) {
    subtree_end_[path.back()] = uint32_t(bytes_.size());
    path.pop_back();
  }
  tokens_begin_.push_back(uint32_t(token_ids_.size()));
}

std::shared_ptr<const TokenTrie> TokenTrie::for_tokenizer(const std::shared_ptr<const Tokenizer>& tokenizer) {
  // One per tokenizer (a server has one): building it takes ~100 ms.
  static std::mutex mutex;
  static std::map<const Tokenizer*, std::pair<std::weak_ptr<const Tokenizer>, std::shared_ptr<const TokenTrie>>> tries;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = tries.find(tokenizer.get());
  if (it != tries.end() && !it->second.first.expired()) return it->second.second;
  std::vector<std::string> bytes(tokenizer->vocab_size());
  const TokenId dsml = tokenizer->special_ids().dsml;
  for (size_t t = 0; t < bytes.size(); ++t)
    if (!tokenizer->is_special(TokenId(t)) || TokenId(t) == dsml) bytes[t] = tokenizer->token_bytes(TokenId(t));
  auto trie = std::make_shared<const TokenTrie>(bytes);
  tries[tokenizer.get()] = {tokenizer, trie};
  return trie;
}

// ---- per-position token classes ----

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTrie> trie)
    : grammar_(std::move(grammar)), trie_(std::move(trie)) {}

std::shared_ptr<const CompiledGrammar::PositionTokens> CompiledGrammar::tokens_at(const ParseState& state,
                                                                                  size_t i) const {
  size_t length = 0;
  const uint32_t* frames = state.stack(i, &length);
  const size_t n = std::min(length, kContextFrames);
  thread_local std::vector<uint32_t> key;
  key.assign(frames + length - n, frames + length);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  // Computed outside the lock (two threads may both compute it: same result).
  auto tokens = std::make_shared<const PositionTokens>(classify(key));
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_.size() < kMaxCachedContexts) cache_.emplace(key, tokens);
  return tokens;
}

CompiledGrammar::PositionTokens CompiledGrammar::classify(const std::vector<uint32_t>& frames) const {
  const TokenTrie& t = *trie_;
  PositionTokens out;
  out.accepted.assign((t.vocab_size() + 63) / 64, 0);
  uint16_t max_depth = 0;
  for (uint16_t d : t.depth_) max_depth = std::max(max_depth, d);
  std::vector<ParseState> states(size_t(max_depth) + 1);
  std::vector<char> escaped(size_t(max_depth) + 1, 0);  // some parse left the rule on the path here
  states[0] = ParseState::from_stack(frames.data(), frames.size());
  auto tokens_of = [&](uint32_t from, uint32_t to, auto&& action) {
    for (uint32_t k = t.tokens_begin_[from]; k < t.tokens_begin_[to]; ++k) action(t.token_ids_[k]);
  };
  for (uint32_t node = 1; node < t.nodes();) {
    const uint16_t d = t.depth_[node];
    states[d - 1].advance(grammar_, t.bytes_[node], states[d]);
    const bool alive = !states[d].empty(), left_rule = states[d].complete();
    escaped[d] = escaped[d - 1] || left_rule;
    if (alive || left_rule)
      tokens_of(node, node + 1, [&](int32_t id) { mask_set(out.accepted, id); });
    else if (escaped[d - 1])
      tokens_of(node, node + 1, [&](int32_t id) { out.uncertain.push_back(id); });
    if (!alive) {
      // Nothing inside the rule reads further: longer tokens are rejected,
      // or decided by the caller's frames when some parse left the rule.
      if (escaped[d]) tokens_of(node + 1, t.subtree_end_[node], [&](int32_t id) { out.uncertain.push_back(id); });
      node = t.subtree_end_[node];
      continue;
    }
    ++node;
  }
  return out;
}

bool CompiledGrammar::advance(ParseState& state, int32_t token) const {
  if (token < 0 || size_t(token) >= trie_->vocab_size()) return false;
  const std::string& bytes = trie_->token_bytes(token);
  if (bytes.empty()) return false;
  ParseState current = state, next;
  for (char c : bytes) {
    current.advance(grammar_, uint8_t(c), next);
    std::swap(current, next);
    if (current.empty() && !current.complete()) return false;
  }
  state = std::move(current);
  return true;
}

void CompiledGrammar::warm_start() const {
  const ParseState start = ParseState::initial(grammar_);
  for (size_t i = 0; i < start.size(); ++i) tokens_at(start, i);
}

void CompiledGrammar::fill_mask(const ParseState& state, TokenMask& mask) const {
  for (size_t i = 0; i < state.size(); ++i) {
    const std::shared_ptr<const PositionTokens> held = tokens_at(state, i);
    const PositionTokens& tokens = *held;
    const size_t words = std::min(mask.size(), tokens.accepted.size());
    for (size_t w = 0; w < words; ++w) mask[w] |= tokens.accepted[w];
    if (tokens.uncertain.empty()) continue;
    const ParseState one = state.single(i);
    for (int32_t token : tokens.uncertain) {
      if (mask_has(mask, token) || size_t(token / 64) >= mask.size()) continue;
      ParseState probe = one;
      if (advance(probe, token)) mask_set(mask, token);
    }
  }
}

// ---- one sequence's matcher ----

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, int32_t activate_after,
                               std::string trigger)
    : grammar_(std::move(grammar)), activate_after_(activate_after), trigger_(std::move(trigger)) {
  history_.push_back(started(activate_after_ >= 0 ? Phase::AwaitToken : Phase::AwaitTrigger));
}

// The step that enters `phase` (AwaitTrigger without a trigger is Active).
GrammarMatcher::Step GrammarMatcher::started(Phase phase) const {
  if (phase == Phase::AwaitTrigger && trigger_.empty()) phase = Phase::Active;
  Step step;
  step.phase = phase;
  if (phase == Phase::Active) step.state = ParseState::initial(grammar_->grammar());
  return step;
}

bool GrammarMatcher::fill_mask(TokenMask& mask) const {
  const Step& now = history_.back();
  if (now.phase != Phase::Active) return false;
  grammar_->fill_mask(now.state, mask);
  return true;
}

bool GrammarMatcher::can_finish() const {
  return history_.back().phase != Phase::Active || history_.back().state.complete();
}

bool GrammarMatcher::accept(int32_t token) {
  const Step& now = history_.back();
  Step next = now;
  if (now.phase == Phase::AwaitToken) {
    if (token == activate_after_) next = started(Phase::AwaitTrigger);
  } else if (now.phase == Phase::AwaitTrigger) {
    if (token >= 0 && size_t(token) < grammar_->trie().vocab_size()) next.tail += grammar_->trie().token_bytes(token);
    const size_t at = next.tail.find(trigger_);
    if (at != std::string::npos) {
      // The grammar starts right after the trigger, with whatever this token
      // wrote after it. If that does not fit (the token was drawn freely), the
      // block cannot be held to the grammar: keep watching.
      const std::string rest = next.tail.substr(at + trigger_.size());
      Step active = started(Phase::Active);
      bool fits = true;
      ParseState step_state;
      for (char c : rest) {
        active.state.advance(grammar_->grammar(), uint8_t(c), step_state);
        std::swap(active.state, step_state);
        fits = fits && !(active.state.empty() && !active.state.complete());
      }
      next = fits ? std::move(active) : Step{Phase::AwaitTrigger, {}, {}};
    } else if (next.tail.size() >= trigger_.size()) {
      next.tail.erase(0, next.tail.size() - (trigger_.size() - 1));
    }
  } else if (!grammar_->advance(next.state, token)) {
    return false;
  }
  history_.push_back(std::move(next));
  // Speculative decoding rolls back a few tokens: a bounded history suffices.
  if (history_.size() > kHistory + 1) history_.pop_front();
  return true;
}

void GrammarMatcher::rollback(int64_t n_tokens) {
  for (int64_t i = 0; i < n_tokens && history_.size() > 1; ++i) history_.pop_back();
}

std::shared_ptr<const CompiledGrammar> cached_grammar(const std::string& key,
                                                      const std::shared_ptr<const Tokenizer>& tokenizer,
                                                      const std::function<Grammar()>& compile) {
  constexpr size_t kEntries = 32;
  static std::mutex mutex;
  static std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru;  // most recent first
  const std::string full_key = std::to_string(reinterpret_cast<uintptr_t>(tokenizer.get())) + "\n" + key;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = lru.begin(); it != lru.end(); ++it)
      if (it->first == full_key) {
        lru.splice(lru.begin(), lru, it);
        return it->second;
      }
  }
  auto compiled = std::make_shared<const CompiledGrammar>(compile(), TokenTrie::for_tokenizer(tokenizer));
  std::lock_guard<std::mutex> lock(mutex);
  lru.emplace_front(full_key, compiled);
  if (lru.size() > kEntries) lru.pop_back();
  return compiled;
}

}  // namespace dsv4::text
