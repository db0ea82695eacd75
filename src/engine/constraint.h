// Constrained decoding as the engine sees it: a per-sequence object that says
// which tokens may come next. The engine knows nothing about grammars, JSON or
// tokenizers (text/ implements this for JSON schemas, regexes, EBNF and DSML
// tool calls); it only asks for a mask before each draw and reports the
// token it drew.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace dsv4 {

// A set of token ids as a bitmask: bit (t % 64) of word t / 64.
using TokenMask = std::vector<uint64_t>;

inline bool mask_has(const TokenMask& mask, int64_t token) {
  return token >= 0 && size_t(token / 64) < mask.size() && (mask[size_t(token / 64)] >> (token % 64)) & 1;
}
inline void mask_set(TokenMask& mask, int64_t token) {
  if (token >= 0 && size_t(token / 64) < mask.size()) mask[size_t(token / 64)] |= uint64_t(1) << (token % 64);
}

// The state of one sequence's constraint. Not thread-safe: the engine calls it
// from the thread that samples that sequence only.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Fills `mask` (vocab bits, already sized and zeroed by the caller) with the
  // tokens that keep the output inside the language. Returns false when the
  // constraint is not active at this step (e.g. inside a reasoning span that
  // comes before the constrained part): every token is then allowed.
  virtual bool fill_mask(TokenMask& mask) = 0;
  // The language is complete here: the end-of-sequence / stop tokens may be
  // drawn. (The engine adds them to the mask; they have no bytes.)
  virtual bool can_finish() const = 0;
  // Advances by the drawn token. Returns false if the token was not allowed
  // (then the state is unchanged).
  virtual bool accept(int32_t token) = 0;
  // Undoes the last n accepted tokens (speculative decoding walks its drafts
  // through the constraint, then undoes them). At most max_rollback().
  virtual void rollback(int64_t n_tokens) = 0;
  virtual int64_t max_rollback() const = 0;
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
};

// What a request carries: a compiled constraint that starts one fresh state per
// sequence (n choices of a request share the compiled grammar). Immutable and
// shared between threads.
class ConstraintFactory {
 public:
  virtual ~ConstraintFactory() = default;
  virtual std::unique_ptr<TokenConstraint> start() const = 0;
};

}  // namespace dsv4
