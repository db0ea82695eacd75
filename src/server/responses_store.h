// The Responses API's stored responses: what GET /v1/responses/{id} returns
// and what previous_response_id continues. Held in memory only, bounded by
// an entry count and a byte budget, the least recently used dropped first,
// so that a long-running server's memory does not grow with its traffic.
#pragma once
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/http_common.h"

namespace dsv4 {

struct StoredResponse {
  ojson response;  // the Response object as the API returned it
  // The conversation up to and including this response's output, as chat
  // messages (without the request's instructions, which a continuation does
  // not inherit): the history that previous_response_id puts before a new
  // request's input.
  ojson messages;
};

class ResponsesStore {
 public:
  // max_entries 0 stores nothing (every previous_response_id is unknown).
  ResponsesStore(int64_t max_entries, int64_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // Adds or replaces; evicts the least recently used entries past either
  // bound. An entry larger than the whole byte budget is not kept.
  void put(const std::string& id, StoredResponse entry);
  // A copy (the caller builds on it while others may evict it), refreshed as
  // most recently used.
  std::optional<StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);

  int64_t size() const;
  int64_t bytes() const;

 private:
  struct Slot {
    std::string id;
    StoredResponse entry;
    int64_t bytes = 0;
  };
  void evict_locked();

  const int64_t max_entries_, max_bytes_;
  mutable std::mutex mutex_;
  std::list<Slot> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Slot>::iterator> index_;
  int64_t bytes_ = 0;
};

}  // namespace dsv4
