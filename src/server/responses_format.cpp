#include "server/responses_format.h"

#include <algorithm>

#include "server/request_fields.h"

namespace dsv4 {

namespace {

using namespace request_json;

// j[key] when it is a string, nullopt when absent or null, 400 otherwise.
std::optional<std::string> string_or_null(const ojson& j, const char* key, const std::string& where) {
  const ojson& v = field(j, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_string()) bad(quoted(where) + " must be a string");
  return v.get<std::string>();
}

bool optional_bool(const ojson& j, const char* key, bool fallback) {
  const ojson& v = field(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) bad(quoted(key) + " must be a boolean");
  return v.get<bool>();
}

[[noreturn]] void unsupported_part(const std::string& type, const std::string& where) {
  if (type == "input_image" || type == "input_file" || type == "input_audio")
    bad(quoted(where) + ": " + type + " content is not supported: this model reads text only");
  bad(quoted(where) + ": content type '" + type + "' is not supported here");
}

// The text of a message's content: a string, or parts of the given text
// types joined (user-side parts by blank lines, as the chat layer joins text
// parts; an assistant's output_text parts are pieces of one answer).
std::string content_text(const ojson& content, const std::string& where, bool assistant) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(quoted(where) + " must be a string or a list of content parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_where = where + "[" + std::to_string(i) + "]";
    const ojson& part = content[i];
    if (!part.is_object()) bad(quoted(part_where) + " must be a content part object");
    const std::string type = string_at(part, "type", part_where);
    std::string text;
    if (type == "input_text" || (assistant && type == "output_text")) {
      text = string_at(part, "text", part_where);
    } else if (assistant && type == "refusal") {
      text = string_at(part, "refusal", part_where);
    } else {
      unsupported_part(type, part_where);
    }
    if (i > 0 && !assistant) out += "\n\n";
    out += text;
  }
  return out;
}

// Consecutive assistant-side items (reasoning, an assistant message,
// function calls, in the order a response outputs them) make one assistant
// turn; anything else, or that order starting over, begins the next turn.
class InputTurns {
 public:
  ojson messages = ojson::array();
  bool kept_reasoning = false;

  void user_side(ojson message) {
    open_ = false;
    messages.push_back(std::move(message));
  }
  void reasoning(const std::string& text) {
    turn(Stage::Reasoning)["reasoning_content"] = text;
    // An item without text (only encrypted content, which this server never
    // makes) has nothing to keep.
    kept_reasoning = kept_reasoning || !text.empty();
  }
  void assistant_text(const std::string& text) { turn(Stage::Text)["content"] = text; }
  void function_call(ojson call) {
    ojson& message = turn(Stage::Calls);
    if (!message.contains("tool_calls")) message["tool_calls"] = ojson::array();
    message["tool_calls"].push_back(std::move(call));
  }

 private:
  enum class Stage { Reasoning, Text, Calls };
  bool open_ = false;
  Stage stage_ = Stage::Reasoning;

  ojson& turn(Stage stage) {
    // Several function calls share a turn; a second reasoning or text does not.
    const bool fits = open_ && (stage > stage_ || (stage == Stage::Calls && stage_ == Stage::Calls));
    if (!fits) {
      messages.push_back({{"role", "assistant"}, {"content", ""}});
      open_ = true;
    }
    stage_ = stage;
    return messages.back();
  }
};

void add_input_item(const ojson& item, const std::string& where, InputTurns& turns) {
  if (!item.is_object()) bad(quoted(where) + " must be an input item object");
  const std::optional<std::string> type_field = string_or_null(item, "type", where + ".type");
  const std::string type = type_field.value_or("message");
  if (type == "message") {
    const std::string role = string_at(item, "role", where);
    if (!item.contains("content")) bad(quoted(where + ".content") + " is required");
    if (role == "assistant") {
      turns.assistant_text(content_text(item["content"], where + ".content", true));
    } else if (role == "user" || role == "system" || role == "developer") {
      turns.user_side({{"role", role}, {"content", content_text(item["content"], where + ".content", false)}});
    } else {
      bad(quoted(where + ".role") + " must be user, assistant, system or developer");
    }
  } else if (type == "function_call") {
    const std::string call_id = string_at(item, "call_id", where);
    const std::string name = string_at(item, "name", where);
    const std::string arguments = string_at(item, "arguments", where);
    turns.function_call(
        {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
  } else if (type == "function_call_output") {
    const std::string call_id = string_at(item, "call_id", where);
    const ojson& output = field(item, "output");
    if (!output.is_string() && !output.is_array())
      bad(quoted(where + ".output") + " must be a string or a list of content parts");
    turns.user_side(
        {{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(output, where + ".output", false)}});
  } else if (type == "reasoning") {
    // The reasoning text when the client kept it, else its summary.
    std::string text;
    const ojson& content = field(item, "content");
    const ojson& summary = field(item, "summary");
    if (!content.is_null() && !content.is_array()) bad(quoted(where + ".content") + " must be a list");
    if (!summary.is_null() && !summary.is_array()) bad(quoted(where + ".summary") + " must be a list");
    if (content.is_array() && !content.empty()) {
      for (size_t i = 0; i < content.size(); ++i)
        text += string_at(content[i], "text", where + ".content[" + std::to_string(i) + "]");
    } else if (summary.is_array()) {
      for (size_t i = 0; i < summary.size(); ++i) {
        if (i > 0) text += "\n\n";
        text += string_at(summary[i], "text", where + ".summary[" + std::to_string(i) + "]");
      }
    }
    string_or_null(item, "encrypted_content", where + ".encrypted_content");
    turns.reasoning(text);
  } else if (type == "item_reference") {
    bad(quoted(where) + ": item references are not supported; send the item itself or use previous_response_id");
  } else {
    bad(quoted(where + ".type") + ": input item type '" + type +
        "' is not supported (message, function_call, function_call_output, reasoning)");
  }
}

ojson convert_tools(const ojson& tools) {
  if (!tools.is_array()) bad("'tools' must be a list");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ojson& tool = tools[i];
    if (!tool.is_object()) bad(quoted(where) + " must be an object");
    const std::string type = string_at(tool, "type", where);
    if (type != "function")
      bad(quoted(where + ".type") + ": '" + type + "' tools are not supported; only function tools are");
    ojson fn = {{"name", string_at(tool, "name", where)}};
    if (auto desc = string_or_null(tool, "description", where + ".description")) fn["description"] = *desc;
    const ojson& parameters = field(tool, "parameters");
    if (!parameters.is_null()) {
      if (!parameters.is_object()) bad(quoted(where + ".parameters") + " must be an object");
      fn["parameters"] = parameters;
    }
    const ojson& strict = field(tool, "strict");
    if (!strict.is_null()) {
      if (!strict.is_boolean()) bad(quoted(where + ".strict") + " must be a boolean");
      fn["strict"] = strict;
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// none / auto / required as they are; {"type": "function", "name"} as the
// chat route's named choice (whose check_tool_choice finds it in tools).
ojson convert_tool_choice(const ojson& choice) {
  if (choice.is_string()) {
    const std::string mode = choice.get<std::string>();
    if (mode != "none" && mode != "auto" && mode != "required")
      bad("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
    return choice;
  }
  if (!choice.is_object()) bad("'tool_choice' must be a string or an object");
  const std::string type = string_at(choice, "type", "tool_choice");
  if (type != "function")
    bad("'tool_choice.type': '" + type + "' is not supported; use none, auto, required or a function");
  return {{"type", "function"}, {"function", {{"name", string_at(choice, "name", "tool_choice")}}}};
}

// text.format onto the chat route's response_format: the json_schema
// fields move under "json_schema", as chat nests them.
ojson convert_text_format(const ojson& format) {
  if (!format.is_object()) bad("'text.format' must be an object");
  const std::string type = string_at(format, "type", "text.format");
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type != "json_schema") bad("'text.format.type' must be text, json_object or json_schema");
  ojson schema = {{"name", string_at(format, "name", "text.format")}};
  const ojson& body = field(format, "schema");
  if (!body.is_object()) bad("'text.format.schema' must be an object");
  schema["schema"] = body;
  if (auto desc = string_or_null(format, "description", "text.format.description")) schema["description"] = *desc;
  const ojson& strict = field(format, "strict");
  if (!strict.is_null()) {
    if (!strict.is_boolean()) bad("'text.format.strict' must be a boolean");
    schema["strict"] = strict;
  }
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

void check_metadata(const ojson& metadata) {
  if (!metadata.is_object()) bad("'metadata' must be an object of strings");
  if (metadata.size() > 16) bad("'metadata' holds at most 16 keys");
  for (auto it = metadata.begin(); it != metadata.end(); ++it) {
    if (it.key().size() > 64) bad("'metadata' keys are at most 64 characters");
    if (!it.value().is_string() || it.value().get<std::string>().size() > 512)
      bad("'metadata." + it.key() + "' must be a string of at most 512 characters");
  }
}

// Fields this server does not implement: a 400 naming them rather than an
// answer that silently ignores what the client asked for.
void refuse_unsupported(const ojson& body) {
  if (optional_bool(body, "background", false))
    bad("'background': background responses are not supported by this server; send background: false");
  for (const char* key : {"conversation", "prompt", "context_management"})
    if (!field(body, key).is_null()) bad(quoted(key) + " is not supported by this server");
  const ojson& top_logprobs = field(body, "top_logprobs");
  if (!top_logprobs.is_null() && top_logprobs != 0) bad("'top_logprobs' is not supported by /v1/responses");
  const ojson& truncation = field(body, "truncation");
  if (!truncation.is_null() && truncation != "disabled") {
    if (truncation == "auto")
      bad("'truncation': auto is not supported; an input past the context length is a 400 (truncation: disabled)");
    bad("'truncation' must be disabled or auto");
  }
  const ojson& include = field(body, "include");
  if (!include.is_null()) {
    if (!include.is_array()) bad("'include' must be a list of strings");
    for (size_t i = 0; i < include.size(); ++i) {
      if (!include[i].is_string()) bad("'include[" + std::to_string(i) + "]' must be a string");
      // Others name hosted tools' results (refused with the tools) or the
      // encrypted reasoning, which this server leaves null.
      if (include[i] == "message.output_text.logprobs")
        bad("'include[" + std::to_string(i) + "]': message.output_text.logprobs is not supported");
    }
  }
}

}  // namespace

ResponsesRequest responses_request(const ojson& body) {
  ResponsesRequest r;
  refuse_unsupported(body);
  r.model = string_or_null(body, "model", "model").value_or("");
  r.instructions = string_or_null(body, "instructions", "instructions");
  r.previous_response_id = string_or_null(body, "previous_response_id", "previous_response_id").value_or("");
  r.stream = optional_bool(body, "stream", false);
  r.store = optional_bool(body, "store", true);
  ojson& chat = r.chat;

  const ojson& input = field(body, "input");
  InputTurns turns;
  if (input.is_string()) {
    turns.user_side({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    for (size_t i = 0; i < input.size(); ++i) add_input_item(input[i], "input[" + std::to_string(i) + "]", turns);
  } else if (!input.is_null()) {
    bad("'input' must be a string or a list of input items");
  }
  if (turns.messages.empty() && r.previous_response_id.empty())
    bad("'input' is required: a string or a non-empty list of input items");
  r.input_messages = std::move(turns.messages);
  if (turns.kept_reasoning) chat["drop_thinking"] = false;

  ojson tools = ojson::array();
  if (!field(body, "tools").is_null()) {
    chat["tools"] = convert_tools(body["tools"]);
    tools = body["tools"];
  }
  ojson tool_choice = "auto";
  if (!field(body, "tool_choice").is_null()) {
    chat["tool_choice"] = convert_tool_choice(body["tool_choice"]);
    tool_choice = body["tool_choice"];
  }
  const bool parallel = optional_bool(body, "parallel_tool_calls", true);
  if (!field(body, "parallel_tool_calls").is_null()) chat["parallel_tool_calls"] = parallel;

  ojson reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  const ojson& reasoning_field = field(body, "reasoning");
  if (!reasoning_field.is_null()) {
    if (!reasoning_field.is_object()) bad("'reasoning' must be an object");
    if (auto effort = string_or_null(reasoning_field, "effort", "reasoning.effort")) {
      static const char* efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
      bool known = false;
      for (const char* e : efforts) known = known || *effort == e;
      if (!known) bad("'reasoning.effort' must be none, minimal, low, medium, high, xhigh or max");
      // The level as the chat route's reasoning_effort (the encoder maps it
      // onto the model's efforts). Unlike chat, which has a separate thinking
      // switch, asking for an effort here asks for reasoning: thinking mode
      // on, and off for "none".
      chat["reasoning_effort"] = *effort;
      chat["thinking"] = {{"type", *effort == "none" ? "disabled" : "enabled"}};
      reasoning["effort"] = *effort;
    }
    for (const char* key : {"summary", "generate_summary"}) {
      if (auto summary = string_or_null(reasoning_field, key, std::string("reasoning.") + key)) {
        if (*summary != "auto" && *summary != "concise" && *summary != "detailed")
          bad("'reasoning." + std::string(key) + "' must be auto, concise or detailed");
        reasoning["summary"] = *summary;
      }
    }
  }

  ojson text = {{"format", {{"type", "text"}}}};
  const ojson& text_field = field(body, "text");
  if (!text_field.is_null()) {
    if (!text_field.is_object()) bad("'text' must be an object");
    if (!field(text_field, "format").is_null()) {
      chat["response_format"] = convert_text_format(text_field["format"]);
      text["format"] = text_field["format"];
    }
    if (auto verbosity = string_or_null(text_field, "verbosity", "text.verbosity")) {
      if (*verbosity != "low" && *verbosity != "medium" && *verbosity != "high")
        bad("'text.verbosity' must be low, medium or high");
      text["verbosity"] = *verbosity;
    }
  }

  for (const char* key : {"temperature", "top_p"}) {
    const ojson& v = field(body, key);
    if (v.is_null()) continue;
    if (!v.is_number()) bad(quoted(key) + " must be a number");
    r.sampling[key] = v;
  }
  const ojson& max_output = field(body, "max_output_tokens");
  if (!max_output.is_null()) {
    if (!max_output.is_number_integer() || max_output.get<int64_t>() < 1)
      bad("'max_output_tokens' must be a positive integer");
    r.max_output_tokens = max_output.get<int64_t>();
  }
  ojson metadata = ojson::object();
  if (!field(body, "metadata").is_null()) {
    check_metadata(body["metadata"]);
    metadata = body["metadata"];
  }
  const std::optional<std::string> user = string_or_null(body, "user", "user");
  string_or_null(body, "safety_identifier", "safety_identifier");
  string_or_null(body, "prompt_cache_key", "prompt_cache_key");
  string_or_null(body, "service_tier", "service_tier");
  const ojson& stream_options = field(body, "stream_options");
  if (!stream_options.is_null() && !stream_options.is_object()) bad("'stream_options' must be an object");

  r.echo = {{"instructions", r.instructions ? ojson(*r.instructions) : ojson()},
            {"max_output_tokens", r.max_output_tokens > 0 ? ojson(r.max_output_tokens) : ojson()},
            {"parallel_tool_calls", parallel},
            {"previous_response_id", r.previous_response_id.empty() ? ojson() : ojson(r.previous_response_id)},
            {"reasoning", reasoning},
            {"store", r.store},
            {"temperature", r.sampling.value("temperature", 1.0)},
            {"text", text},
            {"tool_choice", tool_choice},
            {"tools", tools},
            {"top_p", r.sampling.value("top_p", 1.0)},
            {"truncation", "disabled"},
            {"user", user ? ojson(*user) : ojson()},
            {"metadata", metadata}};
  return r;
}

ojson responses_chat_body(const ResponsesRequest& r, const ojson& history) {
  ojson chat = r.chat;
  ojson messages = ojson::array();
  if (r.instructions && !r.instructions->empty())
    messages.push_back({{"role", "system"}, {"content", *r.instructions}});
  for (const ojson& m : history) messages.push_back(m);
  for (const ojson& m : r.input_messages) messages.push_back(m);
  chat["messages"] = std::move(messages);
  return chat;
}

ojson reasoning_item(const std::string& id, const std::string& text, const std::string& status) {
  ojson content = ojson::array();
  if (!text.empty() || status == "in_progress") content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"id", id},           {"type", "reasoning"},          {"summary", ojson::array()},
          {"content", content}, {"encrypted_content", nullptr}, {"status", status}};
}

ojson message_item(const std::string& id, const std::string& text, const std::string& status) {
  ojson content = ojson::array();
  if (status != "in_progress")
    content.push_back(
        {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}});
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

ojson function_call_item(const std::string& id, const std::string& call_id, const std::string& name,
                         const std::string& arguments, const std::string& status) {
  return {{"id", id},    {"type", "function_call"}, {"status", status}, {"arguments", arguments}, {"call_id", call_id},
          {"name", name}};
}

ojson output_items(const text::ParsedMessage& msg, const std::string& status) {
  ojson items = ojson::array();
  if (msg.reasoning_content) items.push_back(reasoning_item("rs_" + random_hex(24), *msg.reasoning_content, status));
  if (msg.content) items.push_back(message_item("msg_" + random_hex(24), *msg.content, status));
  for (const text::ToolCall& call : msg.tool_calls)
    items.push_back(function_call_item("fc_" + random_hex(24), call.id, call.name, call.arguments, status));
  return items;
}

ojson assistant_message(const ojson& items) {
  std::string content, reasoning;
  bool have_reasoning = false;
  ojson calls = ojson::array();
  for (const ojson& item : items) {
    const std::string type = item.value("type", "");
    if (type == "reasoning") {
      for (const ojson& part : item["content"]) reasoning += part.value("text", "");
      have_reasoning = true;
    } else if (type == "message") {
      for (const ojson& part : item["content"]) content += part.value("text", "");
    } else if (type == "function_call") {
      calls.push_back({{"id", item["call_id"]},
                       {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
  }
  ojson message = {{"role", "assistant"}, {"content", content}};
  if (have_reasoning) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = calls;
  return message;
}

ojson responses_usage(int64_t input, int64_t output, int64_t cached, int64_t reasoning) {
  return {{"input_tokens", input},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", output},
          {"output_tokens_details", {{"reasoning_tokens", std::min(reasoning, output)}}},
          {"total_tokens", input + output}};
}

ojson response_object(const ResponsesRequest& r, const std::string& id, int64_t created_at, const std::string& status,
                      ojson output, ojson usage, const std::string& error_message) {
  const ojson& echo = r.echo;
  const bool finished = status != "in_progress";
  ojson response = {{"id", id},
                    {"object", "response"},
                    {"created_at", created_at},
                    {"status", status},
                    {"background", false},
                    {"error", nullptr},
                    {"incomplete_details", nullptr}};
  if (status == "failed") response["error"] = {{"code", "server_error"}, {"message", error_message}};
  if (status == "incomplete") response["incomplete_details"] = {{"reason", "max_output_tokens"}};
  response["completed_at"] = finished ? ojson(unix_time()) : ojson();
  response["instructions"] = echo["instructions"];
  response["max_output_tokens"] = echo["max_output_tokens"];
  response["max_tool_calls"] = nullptr;
  response["model"] = r.model;
  response["output"] = std::move(output);
  for (const char* key : {"parallel_tool_calls", "previous_response_id", "reasoning"}) response[key] = echo[key];
  response["service_tier"] = "default";
  for (const char* key : {"store", "temperature", "text", "tool_choice", "tools"}) response[key] = echo[key];
  response["top_logprobs"] = 0;
  response["top_p"] = echo["top_p"];
  response["truncation"] = echo["truncation"];
  response["usage"] = std::move(usage);
  response["user"] = echo["user"];
  response["metadata"] = echo["metadata"];
  return response;
}

}  // namespace dsv4
