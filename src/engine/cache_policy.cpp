#include "engine/cache_policy.h"

namespace dsv4 {

CachePolicy::CachePolicy(std::shared_ptr<const Model> model, HiCacheOptions options, bool in_prompt_checkpoints)
    : cache_(std::move(model), std::move(options)), in_prompt_checkpoints_(in_prompt_checkpoints) {}

bool CachePolicy::ready(const PrefetchTicket* ticket, double now) const {
  if (!ticket || ticket->done) return true;
  switch (cache_.options().prefetch_policy) {
    case PrefetchPolicy::BestEffort: return true;
    case PrefetchPolicy::WaitComplete: return false;
    case PrefetchPolicy::Timeout: return now >= ticket->deadline;
  }
  return true;
}

int64_t CachePolicy::next_checkpoint(int64_t fed, int64_t prompt_len) const {
  const int64_t k = cache_.options().checkpoint_interval;
  if (!enabled() || !in_prompt_checkpoints_ || k <= 0) return -1;
  const int64_t next = (fed / k + 1) * k;
  return next < prompt_len ? next : -1;
}

void CachePolicy::on_prefilled(const std::vector<int32_t>& prompt, int64_t fed, const SequenceState& state) {
  const int64_t k = cache_.options().checkpoint_interval;
  if (!enabled() || !in_prompt_checkpoints_ || k <= 0 || fed <= 0 || fed % k || fed >= int64_t(prompt.size()))
    return;
  cache_.insert(std::vector<int32_t>(prompt.begin(), prompt.begin() + fed), state, nullptr);
}

void CachePolicy::on_sampled(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, int64_t fed,
                             const SequenceState& state, const float* logits) {
  if (output.empty() && int64_t(prompt.size()) == fed) cache_.insert(prompt, state, logits);
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
  cache_.insert(tokens, state, nullptr);
}

}  // namespace dsv4
