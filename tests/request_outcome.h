// What a request's handle delivered, waited for to its last event: shared
// by the speculative-decoding tests of EAGLE, NGRAM and DSpark.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace dsv4::test {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> tops;
  FinishReason reason = FinishReason::None;
  int64_t verifies = 0, drafted = 0, accepted = 0;
};

inline Outcome drain(const std::shared_ptr<RequestHandle>& h) {
  Outcome o;
  std::vector<TokenEvent> ev;
  for (bool done = false; !done;) {
    h->wait(ev, 5.0);
    for (auto& e : ev) {
      if (e.has_token) {
        o.tokens.push_back(e.sampled.token);
        o.logprobs.push_back(e.sampled.logprob);
        o.tops.push_back(e.sampled.top);
      }
      if (e.finished) done = true, o.reason = e.reason;
    }
    ev.clear();
  }
  o.verifies = h->spec_verify_ct();
  o.drafted = h->spec_draft_tokens();
  o.accepted = h->spec_accepted_tokens();
  return o;
}

}  // namespace dsv4::test
