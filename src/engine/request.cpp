#include "engine/request.h"

#include <chrono>

#include "core/machine.h"

namespace dsv4 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
    default: return "";
  }
}

bool RequestHandle::wait(std::vector<TokenEvent>& out, double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (events_.empty()) cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !events_.empty(); });
  if (events_.empty()) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

void RequestHandle::cancel() { cancelled_ = true; }

RequestTimes RequestHandle::times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return times_;
}

void RequestHandle::push(TokenEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    double now = now_seconds();
    if (event.has_token && times_.first_token == 0) times_.first_token = now;
    if (event.finished) times_.finished = now;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

}  // namespace dsv4
