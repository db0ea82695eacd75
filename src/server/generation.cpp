#include "server/generation.h"

#include "text/utf8.h"

namespace dsv4 {

ChoiceStream::ChoiceStream(std::shared_ptr<RequestHandle> handle, std::shared_ptr<const text::Tokenizer> tokenizer,
                           std::vector<std::string> stop_strings, bool skip_special_tokens)
    : handle_(std::move(handle)), decoder_(std::move(tokenizer), skip_special_tokens), stops_(std::move(stop_strings)) {
  for (auto& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
}

std::string ChoiceStream::release(bool everything) {
  size_t n = pending_.size();
  if (!everything && longest_stop_ > 0) {
    // Hold back what could still grow into a stop string, on a UTF-8 boundary.
    n = pending_.size() >= longest_stop_ - 1 ? pending_.size() - (longest_stop_ - 1) : 0;
    while (n > 0 && n < pending_.size() && (uint8_t(pending_[n]) & 0xC0) == 0x80) --n;
  }
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string ChoiceStream::apply(const TokenEvent& e) {
  if (finished_) return {};
  if (e.has_token) {
    output_ids_.push_back(e.sampled.token);
    if (e.is_stop_token) {
      matched_stop_token = e.sampled.token;
    } else {
      pending_ += decoder_.push(e.sampled.token);
      sampled_.push_back(e.sampled);
    }
  }
  if (!stops_.empty()) {
    size_t best = std::string::npos;
    const std::string* which = nullptr;
    for (const auto& s : stops_) {
      if (s.empty()) continue;
      size_t p = pending_.find(s);
      if (p != std::string::npos && p < best) best = p, which = &s;
    }
    if (which) {
      pending_.resize(best);
      matched_stop_string = *which;
      matched_stop_token.reset();
      finished_ = true;
      reason_ = FinishReason::Stop;
      handle_->cancel();  // nothing after the stop string is needed
      return release(true);
    }
  }
  if (e.finished) {
    finished_ = true;
    reason_ = e.reason;
    error_ = e.error;
    if (!e.is_stop_token) pending_ += decoder_.finish();
    return release(true);
  }
  return release(false);
}

text::StopReason parser_stop(const ChoiceStream& c) {
  switch (c.reason()) {
    case FinishReason::Length: return text::StopReason::Length;
    case FinishReason::Abort:
    case FinishReason::Error: return text::StopReason::Abort;
    default: return text::StopReason::Stop;
  }
}

}  // namespace dsv4
