#include "engine/validate.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsv4 {

SamplingParams validate_request(const RequestLimits& limits, const std::vector<int32_t>& prompt,
                                SamplingParams params) {
  if (prompt.empty()) throw Error("the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= limits.vocab_size) throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
  for (int32_t t : params.stop_token_ids)
    if (t < 0 || t >= limits.vocab_size)
      throw Error("stop token id " + std::to_string(t) + " is outside the vocabulary");
  for (auto& [t, bias] : params.logit_bias)
    if (t < 0 || t >= limits.vocab_size)
      throw Error("logit_bias token id " + std::to_string(t) + " is outside the vocabulary");
  const int64_t n = int64_t(prompt.size());
  if (n >= limits.context_length)
    throw Error("The input (" + std::to_string(n) + " tokens) is longer than the model's context length (" +
                std::to_string(limits.context_length) + " tokens).");
  params.max_new_tokens = std::min(params.max_new_tokens, limits.context_length - n);
  return params;
}

}  // namespace dsv4
