// Token masks from a grammar (grammar.h) over the tokenizer's byte-level
// vocabulary. The server wraps GrammarMatcher into the engine's
// TokenConstraint (text does not see the engine; the mask layouts agree).
//
// Why it is fast: the vocabulary is a trie of token byte strings (shared per
// tokenizer), so a prefix common to many tokens is matched once and a dead
// prefix drops its whole subtree. And most of a token's fate depends only on
// the grammar position at the top of the parse stack, not on what is below:
// per position, a walk over the trie with that position alone sorts tokens
// into accepted (consumed inside the position's rule), rejected, and
// uncertain (they leave the rule, so the rest of the stack decides). The
// "position" is the top kContextFrames frames of a stack: one frame alone
// would leave a JSON string's one-character rule after every byte, three
// cover the whole string. That walk is done once per such context and kept
// with the compiled grammar; a mask is then the accepted set of each live
// parse plus an exact check of its few uncertain tokens (in a JSON string,
// those with a quote in them).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "text/grammar.h"
#include "text/tokenizer.h"

namespace dsv4::text {

// A set of token ids: bit (t % 64) of word t / 64 (the engine's TokenMask).
using TokenMask = std::vector<uint64_t>;
inline bool mask_has(const TokenMask& mask, int64_t token) {
  return token >= 0 && size_t(token / 64) < mask.size() && (mask[size_t(token / 64)] >> (token % 64)) & 1;
}
inline void mask_set(TokenMask& mask, int64_t token) {
  if (token >= 0 && size_t(token / 64) < mask.size()) mask[size_t(token / 64)] |= uint64_t(1) << (token % 64);
}

// The vocabulary as a trie in preorder: node i has its byte, its depth and the
// index one past its subtree, so a walk skips a dead subtree in one step.
class TokenTrie {
 public:
  // Every token except special ones (whose text a client never sees as
  // such), but with the DSML marker, which tool-call blocks contain.
  static std::shared_ptr<const TokenTrie> for_tokenizer(const std::shared_ptr<const Tokenizer>& tokenizer);
  // From explicit byte strings (token id = index; empty = not a candidate).
  explicit TokenTrie(const std::vector<std::string>& token_bytes);

  size_t nodes() const { return bytes_.size(); }
  size_t vocab_size() const { return token_bytes_.size(); }
  const std::string& token_bytes(int32_t token) const { return token_bytes_[size_t(token)]; }

  std::vector<uint8_t> bytes_;          // node -> the byte on the edge into it (node 0 is the root)
  std::vector<uint16_t> depth_;         // node -> length of its prefix
  std::vector<uint32_t> subtree_end_;   // node -> one past its last descendant
  std::vector<uint32_t> tokens_begin_;  // node -> its tokens: token_ids_[tokens_begin_[i] .. tokens_begin_[i+1])
  std::vector<int32_t> token_ids_;

 private:
  std::vector<std::string> token_bytes_;
};

// A grammar bound to a vocabulary, with the per-position token classes filled
// in as positions are reached. Shared by every request that uses the same
// grammar; thread-safe.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTrie> trie);
  const Grammar& grammar() const { return grammar_; }
  const TokenTrie& trie() const { return *trie_; }

  struct PositionTokens {
    TokenMask accepted;
    std::vector<int32_t> uncertain;
  };
  static constexpr size_t kContextFrames = 3;
  // The classes of the top frames of `state`'s stack i.
  std::shared_ptr<const PositionTokens> tokens_at(const ParseState& state, size_t i) const;
  // Kept classes per grammar (16 KB each for the V4 vocabulary): typical
  // schemas need tens; beyond this, classes are computed and dropped.
  static constexpr size_t kMaxCachedContexts = 512;

  // Adds the tokens `state` can read next to `mask`.
  void fill_mask(const ParseState& state, TokenMask& mask) const;
  // Computes the token classes of the start state now (the server calls it on
  // the request's thread, so the engine's first draw does not wait for them).
  void warm_start() const;
  // `state` after the token's bytes; false (state unchanged) if it cannot read them.
  bool advance(ParseState& state, int32_t token) const;

 private:
  PositionTokens classify(const std::vector<uint32_t>& frames) const;
  Grammar grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  mutable std::mutex mutex_;
  mutable std::map<std::vector<uint32_t>, std::shared_ptr<const PositionTokens>> cache_;
};

// One sequence's matcher. The grammar may start later than the first token:
// `activate_after` >= 0: after that token (</think>: a reasoning model's
// reasoning comes first and unconstrained); a non-empty `trigger`: after the
// output contains that text (a tool-call block opener under tool_choice
// "auto": the model decides to call, the grammar makes the call complete),
// both in that order when both are given. Copyable (a clone).
class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, int32_t activate_after = -1, std::string trigger = {});
  // Fills `mask` with the tokens allowed next; false while not active yet
  // (every token allowed).
  bool fill_mask(TokenMask& mask) const;
  // The text so far is a sentence of the grammar (or the grammar is not active).
  bool can_finish() const;
  // False (and no change) when the token is not allowed.
  bool accept(int32_t token);
  // Undoes the last n accepted tokens (at most kHistory).
  void rollback(int64_t n_tokens);
  bool active() const { return history_.back().phase == Phase::Active; }
  static constexpr size_t kHistory = 64;

 private:
  enum class Phase : uint8_t { AwaitToken, AwaitTrigger, Active };
  struct Step {
    Phase phase = Phase::Active;
    ParseState state;
    std::string tail;  // AwaitTrigger: the last bytes, which may start the trigger
  };
  Step started(Phase phase) const;
  std::shared_ptr<const CompiledGrammar> grammar_;
  int32_t activate_after_;
  std::string trigger_;
  std::deque<Step> history_;
};

// Compiled grammars by a key the caller chooses (the kind and the canonical
// text of a schema, regex or EBNF): a repeated schema compiles once and keeps
// its warm per-position classes. Bounded (the 32 least recently used stay).
std::shared_ptr<const CompiledGrammar> cached_grammar(const std::string& key,
                                                      const std::shared_ptr<const Tokenizer>& tokenizer,
                                                      const std::function<Grammar()>& compile);

}  // namespace dsv4::text
