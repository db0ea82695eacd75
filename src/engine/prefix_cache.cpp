#include "engine/prefix_cache.h"

#include <algorithm>

namespace dsv4 {

bool PrefixCache::lookup(const std::vector<int32_t>& tokens, Hit* hit) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* best = nullptr;
  for (auto& e : entries_) {
    const size_t n = e->tokens.size();
    if (n > tokens.size() || n == 0) continue;
    if (n == tokens.size() && e->last_logits.empty()) continue;
    if (!std::equal(e->tokens.begin(), e->tokens.end(), tokens.begin())) continue;
    if (!best || n > best->tokens.size()) best = e.get();
  }
  if (!best) return false;
  best->last_used = ++clock_;
  hit->matched = int64_t(best->tokens.size());
  hit->state = best->state;
  hit->last_logits = best->tokens.size() == tokens.size() ? best->last_logits : std::vector<float>{};
  return true;
}

void PrefixCache::insert(const std::vector<int32_t>& tokens, const SequenceState& state,
                         std::vector<float> last_logits) {
  if (budget_ <= 0 || tokens.empty()) return;
  auto e = std::make_unique<Entry>();
  e->tokens = tokens;
  e->state = state;
  e->last_logits = std::move(last_logits);
  e->bytes = state.memory_bytes() + int64_t(tokens.size() * 4 + e->last_logits.size() * 4);
  if (e->bytes > budget_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& old : entries_)
    if (old->tokens == tokens) {  // already stored: just refresh it
      old->last_used = ++clock_;
      return;
    }
  e->last_used = ++clock_;
  used_ += e->bytes;
  entries_.push_back(std::move(e));
  evict_locked();
}

void PrefixCache::evict_locked() {
  while (used_ > budget_ && !entries_.empty()) {
    auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                   [](const auto& a, const auto& b) { return a->last_used < b->last_used; });
    used_ -= (*oldest)->bytes;
    entries_.erase(oldest);
  }
}

void PrefixCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  used_ = 0;
}

int64_t PrefixCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

int64_t PrefixCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(entries_.size());
}

}  // namespace dsv4
