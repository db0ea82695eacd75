#include "server/anthropic_format.h"

#include "server/request_fields.h"

namespace dsv4 {

namespace {

using namespace request_json;

std::string block_type(const ojson& block, const std::string& where) {
  if (!block.is_object()) bad(quoted(where) + " must be a content block object");
  const ojson& type = field(block, "type");
  if (!type.is_string()) bad(quoted(where + ".type") + " must be a string");
  return type.get<std::string>();
}

[[noreturn]] void unsupported_block(const std::string& type, const std::string& where) {
  if (type == "image" || type == "document")
    bad(quoted(where) + ": " + type + " content blocks are not supported: this model reads text only");
  bad(quoted(where) + ": content block type '" + type + "' is not supported here");
}

// Text blocks joined by blank lines (the chat layer's join of text parts).
std::string join_text_blocks(const ojson& blocks, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const std::string type = block_type(blocks[i], w);
    if (type != "text") unsupported_block(type, w);
    if (i > 0) out += "\n\n";
    out += string_at(blocks[i], "text", w);
  }
  return out;
}

std::string tool_result_text(const ojson& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(quoted(where) + " must be a string or a list of text blocks");
  return join_text_blocks(content, where);
}

// One user turn: text blocks become user text, each tool_result a `tool`
// message (the encoder merges them back into one user turn, in order).
void add_user(const ojson& content, const std::string& where, ojson& out) {
  if (content.is_string()) {
    out.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  if (!content.is_array()) bad(quoted(where) + " must be a string or a list of content blocks");
  std::string text;
  bool have_text = false, added = false;
  auto flush = [&] {
    if (!have_text) return;
    out.push_back({{"role", "user"}, {"content", text}});
    text.clear();
    have_text = false;
    added = true;
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const std::string type = block_type(content[i], w);
    if (type == "text") {
      if (have_text) text += "\n\n";
      text += string_at(content[i], "text", w);
      have_text = true;
    } else if (type == "tool_result") {
      flush();
      const std::string id = string_at(content[i], "tool_use_id", w);
      const ojson& is_error = field(content[i], "is_error");
      if (!is_error.is_null() && !is_error.is_boolean()) bad(quoted(w + ".is_error") + " must be a boolean");
      out.push_back({{"role", "tool"},
                     {"tool_call_id", id},
                     {"content", tool_result_text(field(content[i], "content"), w + ".content")}});
      added = true;
    } else {
      unsupported_block(type, w);
    }
  }
  flush();
  if (!added) out.push_back({{"role", "user"}, {"content", ""}});
}

// One assistant turn: thinking blocks become reasoning_content, text blocks
// content, tool_use blocks tool_calls. Returns whether it carried thinking.
bool add_assistant(const ojson& content, const std::string& where, ojson& out) {
  if (content.is_string()) {
    out.push_back({{"role", "assistant"}, {"content", content}});
    return false;
  }
  if (!content.is_array()) bad(quoted(where) + " must be a string or a list of content blocks");
  std::string text, reasoning;
  bool thinking = false;
  ojson calls = ojson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const std::string type = block_type(content[i], w);
    if (type == "text") {
      text += string_at(content[i], "text", w);
    } else if (type == "thinking") {
      reasoning += string_at(content[i], "thinking", w);
      thinking = true;
    } else if (type == "redacted_thinking") {
      // Another server's encrypted reasoning: nothing to render.
    } else if (type == "tool_use") {
      const std::string id = string_at(content[i], "id", w);
      const std::string name = string_at(content[i], "name", w);
      const ojson& input = field(content[i], "input");
      if (!input.is_null() && !input.is_object()) bad(quoted(w + ".input") + " must be an object");
      calls.push_back({{"id", id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", dump(input.is_null() ? ojson::object() : input)}}}});
    } else {
      unsupported_block(type, w);
    }
  }
  ojson msg = {{"role", "assistant"}, {"content", text}};
  if (thinking) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(std::move(msg));
  return thinking;
}

ojson convert_tools(const ojson& tools) {
  if (!tools.is_array()) bad("'tools' must be a list");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = "tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    if (!t.is_object()) bad(quoted(w) + " must be an object");
    const ojson& type = field(t, "type");
    if (!type.is_null() && type != "custom" && !t.contains("input_schema"))
      bad(quoted(w) + ": server tools (type " + dump(type) + ") are not supported; declare input_schema");
    ojson fn = ojson::object();
    fn["name"] = string_at(t, "name", w);
    const ojson& desc = field(t, "description");
    if (!desc.is_null()) {
      if (!desc.is_string()) bad(quoted(w + ".description") + " must be a string");
      fn["description"] = desc;
    }
    const ojson& schema = field(t, "input_schema");
    if (!schema.is_object()) bad(quoted(w + ".input_schema") + " must be an object");
    fn["parameters"] = schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// auto / any / tool / none onto the chat route's auto / required / named /
// none (no constrained decoding: "any" and "tool" are checked, not forced).
ojson convert_tool_choice(const ojson& tc) {
  if (!tc.is_object()) bad("'tool_choice' must be an object with a 'type'");
  const std::string type = string_at(tc, "type", "tool_choice");
  const ojson& parallel = field(tc, "disable_parallel_tool_use");
  if (!parallel.is_null() && !parallel.is_boolean()) bad("'tool_choice.disable_parallel_tool_use' must be a boolean");
  if (type == "auto") return "auto";
  if (type == "any") return "required";
  if (type == "none") return "none";
  if (type == "tool") return {{"type", "function"}, {"function", {{"name", string_at(tc, "name", "tool_choice")}}}};
  bad("'tool_choice.type' must be auto, any, tool or none");
}

}  // namespace

AnthropicRequest anthropic_request(const ojson& body, bool count_only) {
  AnthropicRequest r;
  ojson& chat = r.chat;
  chat = ojson::object();

  const ojson& model = field(body, "model");
  if (!model.is_null()) {
    if (!model.is_string()) bad("'model' must be a string");
    r.model = model.get<std::string>();
  }

  ojson messages = ojson::array();
  const ojson& system = field(body, "system");
  if (!system.is_null()) {
    std::string text;
    if (system.is_string()) {
      text = system.get<std::string>();
    } else if (system.is_array()) {
      text = join_text_blocks(system, "system");
    } else {
      bad("'system' must be a string or a list of text blocks");
    }
    if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
  }

  const ojson& msgs = field(body, "messages");
  if (!msgs.is_array()) bad("'messages' is required: a list of user and assistant turns");
  if (msgs.empty()) bad("'messages' must hold at least one message");
  bool keep_thinking = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string w = "messages[" + std::to_string(i) + "]";
    const ojson& m = msgs[i];
    if (!m.is_object()) bad(quoted(w) + " must be an object");
    const ojson& role = field(m, "role");
    if (!m.contains("content")) bad(quoted(w + ".content") + " is required");
    if (role == "user") {
      add_user(m["content"], w + ".content", messages);
    } else if (role == "assistant") {
      keep_thinking |= add_assistant(m["content"], w + ".content", messages);
    } else {
      bad(quoted(w + ".role") + " must be user or assistant");
    }
  }
  // A final assistant turn is a prefill that the answer continues.
  if (field(msgs.back(), "role") == "assistant") chat["continue_final_message"] = true;
  chat["messages"] = std::move(messages);
  // Thinking blocks sent back: the history keeps its reasoning.
  if (keep_thinking) chat["drop_thinking"] = false;

  const ojson& tools = field(body, "tools");
  if (!tools.is_null()) chat["tools"] = convert_tools(tools);
  const ojson& tool_choice = field(body, "tool_choice");
  if (!tool_choice.is_null()) chat["tool_choice"] = convert_tool_choice(tool_choice);

  const ojson& thinking = field(body, "thinking");
  if (!thinking.is_null()) {
    if (!thinking.is_object()) bad("'thinking' must be an object");
    const std::string type = string_at(thinking, "type", "thinking");
    if (type == "enabled") {
      const ojson& budget = field(thinking, "budget_tokens");
      if (!budget.is_number_integer() || budget.get<int64_t>() < 1)
        bad("'thinking.budget_tokens' must be a positive integer");
    } else if (type != "disabled") {
      bad("'thinking.type' must be enabled or disabled");
    }
    chat["thinking"] = {{"type", type}};
  }

  const ojson& stops = field(body, "stop_sequences");
  if (!stops.is_null()) {
    if (!stops.is_array()) bad("'stop_sequences' must be a list of strings");
    for (size_t i = 0; i < stops.size(); ++i) {
      if (!stops[i].is_string() || stops[i].get<std::string>().empty())
        bad("'stop_sequences[" + std::to_string(i) + "]' must be a non-empty string");
      r.stop_sequences.push_back(stops[i].get<std::string>());
    }
    if (r.stop_sequences.size() > 16) bad("'stop_sequences' holds at most 16 strings");
  }

  for (const char* key : {"temperature", "top_p", "top_k"}) {
    const ojson& v = field(body, key);
    if (v.is_null()) continue;
    if (!v.is_number()) bad(quoted(key) + " must be a number");
    r.sampling[key] = v;
  }
  const ojson& top_k = field(body, "top_k");
  if (!top_k.is_null() && (!top_k.is_number_integer() || top_k.get<int64_t>() < 0))
    bad("'top_k' must be a non-negative integer");
  if (top_k == 0) r.sampling.erase("top_k");  // 0: no top-k cut

  const ojson& metadata = field(body, "metadata");
  if (!metadata.is_null() && !metadata.is_object()) bad("'metadata' must be an object");

  const ojson& stream = field(body, "stream");
  if (!stream.is_null() && !stream.is_boolean()) bad("'stream' must be a boolean");
  r.stream = stream.is_boolean() && stream.get<bool>();

  if (!count_only) {
    const ojson& max_tokens = field(body, "max_tokens");
    if (max_tokens.is_null()) bad("'max_tokens' is required");
    if (!max_tokens.is_number_integer() || max_tokens.get<int64_t>() < 1)
      bad("'max_tokens' must be a positive integer");
    r.max_tokens = max_tokens.get<int64_t>();
  }
  return r;
}

ojson anthropic_error_body(int status, const std::string& message) {
  const char* type = "api_error";
  switch (status) {
    case 400:
    case 405:
    case 415:
    case 431: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default: type = status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

void send_anthropic_error(HttpResponse& res, int status, const std::string& message) {
  res.status = status;
  res.stream = nullptr;
  res.set_content(dump(anthropic_error_body(status, message)), "application/json");
}

bool is_anthropic_path(const std::string& path) {
  return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0;
}

}  // namespace dsv4
