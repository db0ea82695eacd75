// The one check of a request's token ids and length. Every way into the
// engine goes through it exactly once: Engine::submit runs it, and a front
// end that wants to answer in its own error format before queueing runs it
// itself and hands the engine the ValidatedRequest it returns (which only
// this function makes), so nothing between here and the model checks again.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/sampler.h"

namespace dsv4 {

struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // prompt + generated tokens
  // A max_new_tokens the client asked for that does not fit after the
  // prompt: an error (SGLang's and vLLM's answer), or cut to fit.
  bool clamp_max_tokens = false;
};

class ValidatedRequest {
 public:
  const std::vector<int32_t>& prompt() const { return prompt_; }
  const SamplingParams& params() const { return params_; }
  // A copy with another seed (the choices of one request); the seed is not
  // part of what is checked.
  ValidatedRequest with_seed(uint64_t seed) const {
    ValidatedRequest r = *this;
    r.params_.seed = seed;
    return r;
  }

 private:
  friend ValidatedRequest validate_request(const RequestLimits&, std::vector<int32_t>, SamplingParams, const char*);
  std::vector<int32_t> prompt_;
  SamplingParams params_;
};

// Throws dsv4::Error for a request that can never run: an empty prompt, a
// prompt, stop or logit_bias token id outside the vocabulary, a prompt that
// fills the context, or (unless limits.clamp_max_tokens) an explicit
// max_new_tokens that does not fit after the prompt. max_new_tokens comes
// back lowered to the room the context leaves after the prompt, so that a
// sequence ends by its max_new_tokens alone and never outgrows its context.
// `length_name` names max_new_tokens in messages (the client's field).
ValidatedRequest validate_request(const RequestLimits& limits, std::vector<int32_t> prompt, SamplingParams params,
                                  const char* length_name = "max_tokens");

}  // namespace dsv4
