#include "server/responses_store.h"

namespace dsv4 {

namespace {

// The size an entry is charged: its JSON text, which is what dominates its
// memory (the parsed form is larger by a roughly constant factor).
int64_t entry_bytes(const std::string& id, const StoredResponse& e) {
  return int64_t(id.size() + dump(e.response).size() + dump(e.messages).size());
}

}  // namespace

void ResponsesStore::put(const std::string& id, StoredResponse entry) {
  const int64_t cost = entry_bytes(id, entry);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = index_.find(id); it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (max_entries_ <= 0 || cost > max_bytes_) return;
  lru_.push_front({id, std::move(entry), cost});
  index_[id] = lru_.begin();
  bytes_ += cost;
  evict_locked();
}

std::optional<StoredResponse> ResponsesStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->entry;
}

bool ResponsesStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

int64_t ResponsesStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(lru_.size());
}

int64_t ResponsesStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

void ResponsesStore::evict_locked() {
  while (!lru_.empty() && (int64_t(lru_.size()) > max_entries_ || bytes_ > max_bytes_)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().id);
    lru_.pop_back();
  }
}

}  // namespace dsv4
