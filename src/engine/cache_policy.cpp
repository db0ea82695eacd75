#include "engine/cache_policy.h"

namespace dsv4 {

void CachePolicy::on_sampled(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                             const SequenceState& state, const float* logits, int64_t vocab) {
  if (output.empty() && int64_t(prompt.size()) == fed)
    cache_.insert(prompt, state, std::vector<float>(logits, logits + vocab));
}

void CachePolicy::on_finished(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                              const SequenceState& state) {
  if (output.empty()) return;
  // Only when the state holds exactly prompt + output minus the last token,
  // and more than the prompt alone (which on_sampled stored already).
  const int64_t conversation = int64_t(prompt.size() + output.size()) - 1;
  if (conversation != fed || fed <= int64_t(prompt.size())) return;
  std::vector<int32_t> tokens(prompt);
  tokens.insert(tokens.end(), output.begin(), output.end() - 1);
  cache_.insert(tokens, state);
}

}  // namespace dsv4
