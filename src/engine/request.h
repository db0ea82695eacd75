// What a caller holds for one request: its handle, the token events the
// engine pushes to it, and why it finished.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace dsv4 {

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);

struct TokenEvent {
  SampledToken sampled;
  bool has_token = false;
  bool is_stop_token = false;  // EOS / stop_token_ids: counted, not shown as text
  bool finished = false;
  FinishReason reason = FinishReason::None;
  std::string error;
};

struct RequestTimes {
  double submitted = 0, first_token = 0, finished = 0;
};

class Engine;

// The caller's side of one request: a queue of token events.
class RequestHandle {
 public:
  const std::string& id() const { return id_; }
  // Waits up to timeout_s for events; appends them to `out`. Returns false on
  // timeout with nothing new.
  bool wait(std::vector<TokenEvent>& out, double timeout_s);
  // Stops generation (client disconnected, stop string matched, abort); the
  // engine frees the sequence's state before its next step.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_.load(); }
  RequestTimes times() const;
  // Speculative decoding of this request: verify steps, drafted tokens,
  // accepted drafts (SGLang's meta_info spec_verify_ct etc.).
  int64_t spec_verify_ct() const { return spec_verify_ct_.load(); }
  int64_t spec_draft_tokens() const { return spec_draft_tokens_.load(); }
  int64_t spec_accepted_tokens() const { return spec_accepted_tokens_.load(); }

 private:
  friend class Engine;
  void push(TokenEvent event);
  std::string id_;
  int64_t prompt_tokens_ = 0;
  std::atomic<int64_t> cached_tokens_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> spec_verify_ct_{0}, spec_draft_tokens_{0}, spec_accepted_tokens_{0};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  RequestTimes times_;
};

}  // namespace dsv4
