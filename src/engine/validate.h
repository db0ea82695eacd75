// The one check of a request's token ids and length. The engine's submit
// runs it; a front end may run it earlier to answer with its own error
// format, but nothing between submit and the model checks again.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/sampler.h"

namespace dsv4 {

struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // prompt + generated tokens
};

// Throws dsv4::Error for a request that can never run: an empty prompt, a
// prompt, stop or logit_bias token id outside the vocabulary, a prompt that fills the
// context. Returns `params` with max_new_tokens lowered to the room the
// context leaves after the prompt, so that a sequence can end by its
// max_new_tokens alone and never outgrow its context.
SamplingParams validate_request(const RequestLimits& limits, const std::vector<int32_t>& prompt, SamplingParams params);

}  // namespace dsv4
