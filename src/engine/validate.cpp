#include "engine/validate.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "model/model.h"

namespace dsv4 {

ValidatedRequest validate_request(const RequestLimits& limits, std::vector<int32_t> prompt, SamplingParams params,
                                  const char* length_name) {
  if (prompt.empty()) throw Error("the prompt is empty");
  check_token_ids(limits.vocab_size, prompt.data(), int64_t(prompt.size()), "token id");
  check_token_ids(limits.vocab_size, params.stop_token_ids.data(), int64_t(params.stop_token_ids.size()),
                  "stop token id");
  for (auto& [t, bias] : params.logit_bias) check_token_ids(limits.vocab_size, &t, 1, "logit_bias token id");
  const int64_t n = int64_t(prompt.size()), ctx = limits.context_length;
  if (n >= ctx)
    throw Error("The input (" + std::to_string(n) + " tokens) is longer than the model's context length (" +
                std::to_string(ctx) + " tokens).");
  if (params.max_new_tokens_explicit && n + params.max_new_tokens > ctx) {
    if (!limits.clamp_max_tokens || params.max_new_tokens > ctx)
      throw Error("Requested token count exceeds the model's maximum context length of " + std::to_string(ctx) +
                  " tokens: prompt has " + std::to_string(n) + " tokens, " + length_name + " " +
                  std::to_string(params.max_new_tokens) + " (" + std::to_string(n + params.max_new_tokens) +
                  " in all). Lower the prompt or the completion length.");
  }
  params.max_new_tokens = std::min(params.max_new_tokens, ctx - n);
  ValidatedRequest r;
  r.prompt_ = std::move(prompt);
  r.params_ = std::move(params);
  return r;
}

}  // namespace dsv4
