// One generated choice as the HTTP layer sees it: token events turned into
// released text (stop strings held back and cut), token ids and logprobs.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace dsv4 {

class ChoiceStream {
 public:
  ChoiceStream(std::shared_ptr<RequestHandle> handle, std::shared_ptr<const text::Tokenizer> tokenizer,
               std::vector<std::string> stop_strings, bool skip_special_tokens);

  // Applies one engine event; returns the text that became final.
  std::string apply(const TokenEvent& event);

  RequestHandle& handle() { return *handle_; }
  bool finished() const { return finished_; }
  FinishReason reason() const { return reason_; }
  const std::string& error() const { return error_; }
  // The stop string or stop token id that ended generation, if any.
  std::optional<std::string> matched_stop_string;
  std::optional<int32_t> matched_stop_token;
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  const std::vector<SampledToken>& sampled() const { return sampled_; }  // tokens shown as text
  const std::string& text() const { return text_; }                      // all released text
  int64_t completion_tokens() const { return int64_t(output_ids_.size()); }

 private:
  std::string release(bool everything);

  std::shared_ptr<RequestHandle> handle_;
  text::StreamDecoder decoder_;
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::string pending_, text_, error_;
  std::vector<int32_t> output_ids_;
  std::vector<SampledToken> sampled_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::None;
};

// How a choice's end reads to the output parser: cut by the length limit,
// aborted (or failed), or stopped; every route's parser takes it from here.
text::StopReason parser_stop(const ChoiceStream& c);

}  // namespace dsv4
