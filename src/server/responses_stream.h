// The Responses API's typed stream for one response, built from the output
// parser's deltas: which item is open, the events that open, extend and
// close it, and the sequence numbers. Kept apart from the SSE loop
// (responses_routes.cpp) so that the event order can be tested with made-up
// deltas, tool calls included, which a random-weight model never produces.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "server/http_common.h"
#include "text/output_parser.h"

namespace dsv4 {

// Events, in order: response.created, response.in_progress; per output item
// response.output_item.added, then for reasoning response.content_part.added
// (a reasoning_text part), response.reasoning_text.delta...,
// response.reasoning_text.done, response.content_part.done; for a message the
// same with output_text parts and response.output_text.*; for a function
// call response.function_call_arguments.delta... / .done; then
// response.output_item.done. At the end response.completed,
// response.incomplete, or an `error` event and response.failed. Every event
// carries its sequence_number, from 0.
class ResponsesEventStream {
 public:
  // Sends one event; false once the client is gone.
  using Emit = std::function<bool(const ojson&)>;
  explicit ResponsesEventStream(Emit emit) : emit_(std::move(emit)) {}

  // response.created and response.in_progress with the in_progress object.
  bool open(const ojson& in_progress_response);
  // One parser delta: reasoning, then content, then tool-call pieces, each
  // opening its item when another one was open.
  bool delta(const text::ParserDelta& d);
  // Closes the open item, its status "completed" or "incomplete".
  bool close_items(const std::string& item_status);
  // The end: an `error` event first when `failure` is set, then the event
  // of the final response's status.
  bool finish(const ojson& response, const std::string& failure);

  // The finished output items, and the reasoning text of all of them.
  const ojson& items() const { return items_; }
  const std::string& reasoning() const { return reasoning_; }

 private:
  enum class Kind { None, Reasoning, Message, Call };

  bool send(ojson event);
  int64_t output_index() const { return int64_t(items_.size()); }
  ojson part_event(const char* type, ojson fields) const;
  bool start(Kind kind, const std::string& id, ojson item);
  bool start_call(const text::ToolCallDelta& call);

  Emit emit_;
  Kind kind_ = Kind::None;
  int64_t sequence_ = 0;
  ojson items_ = ojson::array();
  // The open item: its id, its text so far (reasoning, answer or arguments),
  // and for a call its call_id, name and the parser's index of the call.
  std::string item_id_, text_, call_id_, call_name_;
  int call_index_ = -1;
  std::string reasoning_;
};

}  // namespace dsv4
