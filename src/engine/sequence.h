// A running request inside the engine: its tokens, decode state, sampling
// state and speculative-decoding state. Private to the engine's sources.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/constraint.h"
#include "engine/engine.h"

namespace dsv4 {

// What a constrained sequence's grammar allows at one position.
struct ConstrainedRow {
  bool active = false;  // false: the grammar does not limit this draw (e.g. during reasoning)
  // Whether min_new_tokens still blocks the stop tokens: not where the
  // grammar lets the output end (or cannot continue it), which outranks it.
  bool keep_blocked = true;
  TokenMask mask;  // the allowed tokens, stop tokens included where the output may end
};

struct Engine::Sequence {
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> prompt;
  SamplingParams params;
  Phase phase = Phase::Queued;
  SequenceState state;
  int64_t fed = 0;              // tokens of prompt+output already in `state`
  std::vector<int32_t> output;  // generated tokens
  PenaltyState penalties;
  std::vector<int32_t> stop_ids;     // stop_token_ids plus EOS unless ignore_eos
  std::vector<float> cached_logits;  // after the prompt, from a full prefix-cache hit
  std::shared_ptr<void> cache_lease;  // the cached parts it started from, locked while it runs
  std::shared_ptr<PrefetchTicket> prefetch;  // its prompt's read from storage, until it starts
  int64_t reserved_tokens = 0;
  // Constrained decoding state (null: unconstrained); only the thread that
  // draws this sequence's token touches it.
  std::unique_ptr<TokenConstraint> constraint;

  // Speculative decoding. `drafts`: proposed tokens after the last known
  // one, verified in this step's forward pass (the decode state is
  // checkpointed while they are in it).
  std::vector<int32_t> drafts;
  int64_t mtp_checkpoint = -1;  // EAGLE: MTP positions when the checkpoint was taken
  // A constrained sequence's grammar at verify rows 0..drafts.size() (row j:
  // after drafts 0..j-1), computed when the drafts were fitted to it
  // (Engine::fit_drafts). Rows after a drafted stop token are not kept:
  // verification ends there.
  std::vector<ConstrainedRow> draft_rows;
  // A constrained sequence's grammar rows that EAGLE's MTP chain or DSpark's
  // Markov chain computed while drawing each draft inside the grammar
  // (Engine::propose_mtp, propose_dspark), handed to fit_drafts so that it
  // does not compute them again.
  std::vector<ConstrainedRow> chain_rows;
  // One step of such a chain (constraint set): the highest logit of `row`
  // among the tokens the grammar allows at its current state (that row is
  // appended to chain_rows), walked through the grammar; the caller rolls
  // the walked tokens back after the chain. Returns whether the chain goes
  // on: false after a stop token, a token the grammar refuses, or a row
  // that allows none (then *token is the plain argmax).
  bool draw_in_grammar(const float* row, int64_t vocab, int32_t* token);
  // NGRAM: the tokens so far and their n-gram index.
  std::vector<int32_t> history;
  NgramIndex ngram;
  // EAGLE: the main model's final HC rows of positions [hc_start, fed) that
  // the MTP block has not consumed yet (at most a window and a half of
  // them, trimmed in steps: the MTP block attends the last window only).
  RowBuffer hc;
  int64_t hc_start = 0;
  // DSPARK: the target-layer states of positions [dspark_start, fed) that
  // the head's rings have not learned yet (at most a window and a half,
  // trimmed in steps: the rings hold the last window only). They are
  // learned just before a draft, all sequences at once, so that steps the
  // gate runs without speculation do not pay for them.
  RowBuffer dspark_rows;
  int64_t dspark_start = 0;

  int64_t known() const { return int64_t(prompt.size() + output.size()); }
  // The grammar's row at the constraint's current state (constraint set).
  ConstrainedRow constraint_row(int64_t vocab) const {
    ConstrainedRow row;
    row.mask.assign(size_t(vocab + 63) / 64, 0);
    row.active = constraint->fill_mask(row.mask);
    if (!row.active) return row;
    // A complete output may end; an output the grammar cannot continue
    // (never for a well-formed grammar) ends rather than drawing at random.
    bool any = false;
    for (uint64_t word : row.mask) any = any || word != 0;
    if (constraint->can_finish() || !any) {
      for (int32_t t : stop_ids) mask_set(row.mask, t);
      row.keep_blocked = false;
    }
    return row;
  }
  bool is_stop(int32_t token) const { return std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end(); }
  std::vector<int32_t> tokens(int64_t start, int64_t n) const {
    std::vector<int32_t> t;
    t.reserve(size_t(n));
    for (int64_t i = start; i < start + n; ++i)
      t.push_back(i < int64_t(prompt.size()) ? prompt[size_t(i)] : output[size_t(i) - prompt.size()]);
    return t;
  }
  RunningSummary summary() const {
    RunningSummary r;
    r.phase = phase;
    r.fed = fed;
    r.known = known();
    r.cached_logits = !cached_logits.empty();
    r.cancelled = handle->cancelled();
    r.draft_tokens = int64_t(drafts.size());
    return r;
  }
};

}  // namespace dsv4
