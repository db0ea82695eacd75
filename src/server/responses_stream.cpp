#include "server/responses_stream.h"

#include "server/responses_format.h"

namespace dsv4 {

namespace {

ojson output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
}

ojson reasoning_text_part(const std::string& text) { return {{"type", "reasoning_text"}, {"text", text}}; }

}  // namespace

bool ResponsesEventStream::send(ojson event) {
  event["sequence_number"] = sequence_++;
  return emit_(event);
}

// An event about content part 0 of the open item.
ojson ResponsesEventStream::part_event(const char* type, ojson fields) const {
  ojson event = {{"type", type}, {"item_id", item_id_}, {"output_index", output_index()}, {"content_index", 0}};
  event.update(fields);
  return event;
}

bool ResponsesEventStream::open(const ojson& in_progress_response) {
  return send({{"type", "response.created"}, {"response", in_progress_response}}) &&
         send({{"type", "response.in_progress"}, {"response", in_progress_response}});
}

bool ResponsesEventStream::start(Kind kind, const std::string& id, ojson item) {
  if (!close_items("completed")) return false;
  kind_ = kind;
  item_id_ = id;
  text_.clear();
  return send({{"type", "response.output_item.added"}, {"output_index", output_index()}, {"item", std::move(item)}});
}

bool ResponsesEventStream::start_call(const text::ToolCallDelta& call) {
  const std::string id = "fc_" + random_hex(24);
  // The parser names a call in its first delta; the fallbacks only guard a
  // parser that did not.
  const std::string call_id = call.id.value_or("call_" + random_hex(24));
  const std::string name = call.name.value_or("");
  if (!start(Kind::Call, id, function_call_item(id, call_id, name, "", "in_progress"))) return false;
  call_id_ = call_id;
  call_name_ = name;
  call_index_ = call.index;
  return true;
}

bool ResponsesEventStream::delta(const text::ParserDelta& d) {
  if (!d.reasoning_content.empty()) {
    if (kind_ != Kind::Reasoning) {
      const std::string id = "rs_" + random_hex(24);
      ojson item = reasoning_item(id, "", "in_progress");
      item["content"] = ojson::array();
      if (!start(Kind::Reasoning, id, std::move(item)) ||
          !send(part_event("response.content_part.added", {{"part", reasoning_text_part("")}})))
        return false;
    }
    text_ += d.reasoning_content;
    reasoning_ += d.reasoning_content;
    if (!send(part_event("response.reasoning_text.delta", {{"delta", d.reasoning_content}}))) return false;
  }
  if (!d.content.empty()) {
    if (kind_ != Kind::Message) {
      const std::string id = "msg_" + random_hex(24);
      if (!start(Kind::Message, id, message_item(id, "", "in_progress")) ||
          !send(part_event("response.content_part.added", {{"part", output_text_part("")}})))
        return false;
    }
    text_ += d.content;
    if (!send(part_event("response.output_text.delta", {{"delta", d.content}, {"logprobs", ojson::array()}})))
      return false;
  }
  for (const text::ToolCallDelta& call : d.tool_calls) {
    if ((kind_ != Kind::Call || call.index != call_index_) && !start_call(call)) return false;
    if (call.arguments.empty()) continue;
    text_ += call.arguments;
    if (!send({{"type", "response.function_call_arguments.delta"},
               {"item_id", item_id_},
               {"output_index", output_index()},
               {"delta", call.arguments}}))
      return false;
    // The invoke closed: its item is done now rather than with the next item.
    if (call.closes && !close_items("completed")) return false;
  }
  return true;
}

bool ResponsesEventStream::close_items(const std::string& item_status) {
  ojson item;
  switch (kind_) {
    case Kind::None: return true;
    case Kind::Reasoning:
      item = reasoning_item(item_id_, text_, item_status);
      if (!send(part_event("response.reasoning_text.done", {{"text", text_}})) ||
          !send(part_event("response.content_part.done", {{"part", reasoning_text_part(text_)}})))
        return false;
      break;
    case Kind::Message:
      item = message_item(item_id_, text_, item_status);
      if (!send(part_event("response.output_text.done", {{"text", text_}, {"logprobs", ojson::array()}})) ||
          !send(part_event("response.content_part.done", {{"part", output_text_part(text_)}})))
        return false;
      break;
    case Kind::Call:
      item = function_call_item(item_id_, call_id_, call_name_, text_, item_status);
      if (!send({{"type", "response.function_call_arguments.done"},
                 {"item_id", item_id_},
                 {"output_index", output_index()},
                 {"name", call_name_},
                 {"arguments", text_}}))
        return false;
      break;
  }
  kind_ = Kind::None;
  const bool sent = send({{"type", "response.output_item.done"}, {"output_index", output_index()}, {"item", item}});
  items_.push_back(std::move(item));
  return sent;
}

bool ResponsesEventStream::finish(const ojson& response, const std::string& failure) {
  if (!failure.empty() &&
      !send({{"type", "error"}, {"code", "server_error"}, {"message", failure}, {"param", nullptr}}))
    return false;
  const std::string status = response.value("status", "");
  const char* type = status == "completed"    ? "response.completed"
                     : status == "incomplete" ? "response.incomplete"
                                              : "response.failed";
  return send({{"type", type}, {"response", response}});
}

}  // namespace dsv4
