// A running request inside the engine: its tokens, decode state, sampling
// state and speculative-decoding state. Private to the engine's sources.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace dsv4 {

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
  // draws this sequence's token touches it. Such a sequence does not draft
  // (propose_drafts): verifying drafts would need the mask at every drafted
  // position (the constraint's rollback/clone allow it; not done yet).
  std::unique_ptr<TokenConstraint> constraint;

  // Speculative decoding. `drafts`: proposed tokens after the last known
  // one, verified in this step's forward pass (the decode state is
  // checkpointed while they are in it).
  std::vector<int32_t> drafts;
  int64_t mtp_checkpoint = -1;  // EAGLE: MTP positions when the checkpoint was taken
  // NGRAM: the tokens so far and their n-gram index.
  std::vector<int32_t> history;
  NgramIndex ngram;
  // EAGLE: the main model's final HC rows of positions [hc_start, fed) that
  // the MTP block has not consumed yet (at most a window of them: the MTP
  // block attends a window only).
  std::vector<float> hc;
  int64_t hc_start = 0;
  // DSPARK: the target-layer states of positions [dspark_start, fed) that
  // the head's rings have not learned yet (at most a window: the rings hold
  // no more). They are learned just before a draft, all sequences at once,
  // so that steps the gate runs without speculation do not pay for them.
  std::vector<float> dspark_rows;
  int64_t dspark_start = 0;

  int64_t known() const { return int64_t(prompt.size() + output.size()); }
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
