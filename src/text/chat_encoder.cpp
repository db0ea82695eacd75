#include "text/chat_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "text/json_limits.h"

namespace dsv4::text {

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkBegin = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kSystem = "<｜System｜>";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
constexpr std::string_view kImagePlaceholder = "<｜deepseek_image｜>";

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> t = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  return t;
}

constexpr std::string_view kEffortAbsoluteMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

constexpr std::string_view kEffortBeyondMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

// Prompt text plus the byte ranges of it that were copied from user-controlled
// request fields (see chat_encoder.h, RenderedPrompt::content_spans).
struct Rendered {
  std::string text;
  std::vector<TextSpan> spans;

  Rendered& operator+=(std::string_view s) {
    text += s;
    return *this;
  }
  Rendered& operator+=(const Rendered& r) {
    for (const auto& sp : r.spans) spans.push_back({sp.begin + text.size(), sp.end + text.size()});
    text += r.text;
    return *this;
  }
  // Text from a user-controlled field.
  void content(std::string_view s) {
    if (!s.empty()) spans.push_back({text.size(), text.size() + s.size()});
    text += s;
  }
  // Message text that may hold image placeholders the encoder inserted for
  // image parts. V4.1 refuses a literal placeholder in message text, so there
  // every placeholder is an image and stays template text; V4 cannot tell.
  void content_with_images(std::string_view s, bool v41) {
    if (!v41) return content(s);
    size_t at;
    while ((at = s.find(kImagePlaceholder)) != std::string_view::npos) {
      content(s.substr(0, at));
      text += kImagePlaceholder;
      s.remove_prefix(at + kImagePlaceholder.size());
    }
    content(s);
  }
};

// DSML tag names differ between V4 (`tool_calls`, `invoke`, `parameter`) and
// V4.1 (` calls`, ` invoke`, ` parameter`).
struct Dialect {
  std::string block, invoke, param;
};
Dialect dialect_for(EncoderProfile p) {
  if (is_v41(p)) return {" calls", " invoke", " parameter"};
  return {"tool_calls", "invoke", "parameter"};
}

std::string tools_template(const Dialect& d) {
  std::string t =
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools "
      "by writing a \"<@@BLOCK>\" block like the following:\n\n"
      "<@@BLOCK>\n<@@INVOKE name=\"$TOOL_NAME\">\n<@@PARAM name=\"$PARAMETER_NAME\" string=\"true|false\">"
      "$PARAMETER_VALUE</@@PARAM>\n...\n</@@INVOKE>\n<@@INVOKE name=\"$TOOL_NAME2\">\n...\n</@@INVOKE>\n"
      "</@@BLOCK>\n\n"
      "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
      "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
      "<think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n@@SCHEMAS\n\n"
      "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
  const std::string dsml(kDsml);
  t = replace_all(t, "@@BLOCK", dsml + d.block);
  t = replace_all(t, "@@INVOKE", dsml + d.invoke);
  t = replace_all(t, "@@PARAM", dsml + d.param);
  return t;
}

const ojson& get_or_null(const ojson& obj, const char* key) {
  static const ojson null_value;
  if (!obj.is_object()) return null_value;
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

bool has_non_null(const ojson& obj, const char* key) { return !get_or_null(obj, key).is_null(); }

std::string str_of(const ojson& v, std::string_view what) {
  if (v.is_string()) return v.get<std::string>();
  throw EncoderError(std::string(what) + " must be a string");
}

// `content or ""` in the reference.
std::string content_or_empty(const ojson& msg) {
  const ojson& c = get_or_null(msg, "content");
  if (!python_truthy(c)) return "";
  if (c.is_string()) return c.get<std::string>();
  throw EncoderError("message content must be a string");
}

// The schemas are content: tool definitions are data, often from third-party
// (MCP) servers; the template's own markers around them stay special.
Rendered render_tools(const ojson& tools, const Dialect& d) {
  Rendered schemas;
  bool first = true;
  for (const auto& tool : tools) {
    if (!tool.is_object() || !tool.contains("function")) throw EncoderError("each tool must have a 'function' object");
    if (!first) schemas += "\n";
    first = false;
    schemas.content(python_json_dumps(tool["function"]));
  }
  // replace_all(template, "@@SCHEMAS", schemas): the template has it once.
  const std::string t = tools_template(d);
  const size_t at = t.find("@@SCHEMAS");
  Rendered out;
  out += std::string_view(t).substr(0, at);
  out += schemas;
  out += std::string_view(t).substr(at + std::string_view("@@SCHEMAS").size());
  return out;
}

Rendered render_response_format(const ojson& rf) {
  Rendered out;
  out += "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";
  out.content(python_json_dumps(rf));
  return out;
}

Rendered render_tool_result_content(const ojson& content, bool v41) {
  Rendered out;
  if (content.is_array()) {
    bool first = true;
    for (const auto& b : content) {
      if (!first) out += "\n\n";
      first = false;
      const ojson& type = get_or_null(b, "type");
      if (type.is_string() && type.get<std::string>() == "text") {
        const ojson& t = get_or_null(b, "text");
        out.content_with_images(t.is_null() ? "" : str_of(t, "tool result text"), v41);
      } else {
        out += "[Unsupported ";
        out.content(python_str(type));
        out += "]";
      }
    }
    return out;
  }
  out.content_with_images(python_str(content), v41);
  return out;
}

// The reference's `msg.get("content", "")`: "" only when the key is absent.
ojson get_with_default_empty(const ojson& msg, const char* key) {
  auto it = msg.find(key);
  return it == msg.end() ? ojson("") : *it;
}

Rendered encode_arguments_to_dsml(EncoderProfile profile, const ojson& tc, const Dialect& d) {
  const ojson raw = get_with_default_empty(tc, "arguments");
  ojson args;
  bool ok = false;
  if (is_v41(profile)) {
    args = raw;
    if (!args.is_object()) {
      for (int i = 0; i < 2 && args.is_string(); ++i) {
        try {
          args = parse_json_limited(args.get<std::string>());
        } catch (const std::exception&) {
          break;
        }
      }
    }
    ok = args.is_object();
  } else {
    if (raw.is_string()) {
      try {
        args = parse_json_limited(raw.get<std::string>());
        if (!args.is_object()) {
          // json.loads succeeded but `.items()` does not exist on the result.
          throw EncoderError("tool call arguments must be a JSON object, got: " + raw.get<std::string>());
        }
        ok = true;
      } catch (const ojson::exception&) {
        ok = false;
      } catch (const JsonDepthError&) {
        ok = false;  // too deep to walk: kept as the string it came as
      }
    }
  }
  if (!ok) {
    args = ojson::object();
    args["arguments"] = raw;
  }
  Rendered out;
  bool first = true;
  const std::string dsml(kDsml);
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    const bool is_str = it.value().is_string();
    out += "<" + dsml + d.param + " name=\"";
    out.content(it.key());
    out += std::string("\" string=\"") + (is_str ? "true" : "false") + "\">";
    out.content(is_str ? it.value().get<std::string>() : python_json_dumps(it.value()));
    out += "</" + dsml + d.param + ">";
  }
  return out;
}

int find_last_user_index(EncoderProfile profile, const ojson& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const ojson& role = get_or_null(messages[i], "role");
    if (!role.is_string()) continue;
    const auto& r = role.get_ref<const std::string&>();
    if (is_v41(profile)) {
      if (r == "user" || (r == "system" && i > 0)) return i;
    } else if (r == "user" || r == "developer") {
      return i;
    }
  }
  return -1;
}

std::string effort_prefix(EncoderProfile profile, size_t index, bool thinking, const ojson& effort) {
  switch (profile) {
    case EncoderProfile::V4Preview: {
      const bool ok = effort.is_null() || (effort.is_string() && (effort == "max" || effort == "high"));
      if (!ok) throw EncoderError("Invalid reasoning effort: " + python_str(effort));
      if (index == 0 && thinking && effort == "max") return std::string(kEffortAbsoluteMax);
      return "";
    }
    case EncoderProfile::V4_0731: {
      const ojson e = effort.is_null() ? ojson("low") : effort;
      const bool ok = e.is_string() && (e == "low" || e == "high" || e == "max");
      if (!ok) throw EncoderError("Invalid reasoning effort: " + python_str(effort));
      if (index == 0 && thinking) {
        if (e == "high") return std::string(kEffortAbsoluteMax);
        if (e == "max") return std::string(kEffortBeyondMax);
      }
      return "";
    }
    case EncoderProfile::V41:
    case EncoderProfile::V41TierTable: {
      const bool tiers25 = profile == EncoderProfile::V41TierTable;
      const ojson e = effort.is_null() ? ojson("high") : effort;
      int budget = -1;
      if (e.is_number_integer() || e.is_number_unsigned()) {
        const auto v = e.get<int64_t>();
        if (v >= 1 && v <= 100) budget = static_cast<int>(v);
      } else if (e.is_string()) {
        const auto& s = e.get_ref<const std::string&>();
        if (tiers25) {
          if (s == "low") budget = 25;
          if (s == "high") budget = 50;
          if (s == "xhigh") budget = 75;
          if (s == "max") budget = 100;
        } else {
          if (s == "low") budget = 50;
          if (s == "high") budget = 75;
          if (s == "max") budget = 100;
        }
      }
      if (budget < 0) {
        throw EncoderError("Invalid reasoning effort for deepseek_v41: " + python_str(effort) +
                           ", should be int within [1,100] or " +
                           (tiers25 ? "['low', 'high', 'xhigh', 'max']" : "['low', 'high', 'max']"));
      }
      if (index == 0 && thinking) {
        return "Reasoning Effort: " + std::to_string(budget) +
               " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
      }
      return "";
    }
  }
  return "";
}

Rendered render_user_blocks(const ojson& blocks, bool v41) {
  Rendered out;
  bool first = true;
  for (const auto& block : blocks) {
    if (!first) out += "\n\n";
    first = false;
    const ojson& type = get_or_null(block, "type");
    const std::string t = type.is_string() ? type.get<std::string>() : python_str(type);
    if (t == "text") {
      const ojson text = block.is_object() && block.contains("text") ? block["text"] : ojson("");
      out.content_with_images(str_of(text, "text content"), v41);
    } else if (t == "tool_result") {
      const ojson content = get_with_default_empty(block, "content");
      out += "<tool_result>";
      out += render_tool_result_content(content, v41);
      out += "</tool_result>";
    } else {
      out += "[Unsupported ";
      out.content(t);
      out += "]";
    }
  }
  return out;
}

Rendered render_message(EncoderProfile profile, size_t index, const ojson& messages, bool thinking, bool drop_thinking,
                        const ojson& effort) {
  const Dialect d = dialect_for(profile);
  const ojson& msg = messages[index];
  if (!msg.is_object()) throw EncoderError("each message must be an object");
  const int last_user = find_last_user_index(profile, messages);
  const ojson& role_v = get_or_null(msg, "role");
  const std::string role = role_v.is_string() ? role_v.get<std::string>() : python_str(role_v);
  const ojson& tools = get_or_null(msg, "tools");
  const ojson& response_format = get_or_null(msg, "response_format");
  const ojson& tool_calls = get_or_null(msg, "tool_calls");
  const bool wo_eos = python_truthy(get_or_null(msg, "wo_eos"));
  const bool v41 = is_v41(profile);

  Rendered prompt;
  // After system (and V4's developer) content: the tools block, then the
  // response format, each after a blank line.
  auto append_tools_and_format = [&] {
    if (python_truthy(tools)) {
      prompt += "\n\n";
      prompt += render_tools(tools, d);
    }
    if (python_truthy(response_format)) {
      prompt += "\n\n";
      prompt += render_response_format(response_format);
    }
  };
  const std::string effort_text = effort_prefix(profile, index, thinking, effort);
  if (v41) {
    if (index == 0 && (!effort_text.empty() || role == "system")) prompt += kSystem;
  }
  prompt += effort_text;

  // System / developer content is the deployer's instructions: not a content span.
  if (role == "system") {
    if (v41 && index > 0) prompt += kSystem;
    prompt += content_or_empty(msg);
    append_tools_and_format();
  } else if (role == "developer" && !v41) {
    if (!python_truthy(get_or_null(msg, "content"))) throw EncoderError("Invalid message for role `developer`");
    prompt += kUser;
    prompt += content_or_empty(msg);
    append_tools_and_format();
  } else if (role == "user") {
    prompt += kUser;
    const ojson& blocks = get_or_null(msg, "content_blocks");
    if (python_truthy(blocks)) {
      prompt += render_user_blocks(blocks, v41);
    } else {
      prompt.content_with_images(content_or_empty(msg), v41);
    }
  } else if (role == "latest_reminder") {
    prompt += kLatestReminder;
    prompt += python_str(get_or_null(msg, "content"));
  } else if (role == "assistant") {
    // Assistant history is model output the client sends back (and may have
    // edited): reasoning, content and tool calls are content spans.
    Rendered tc_content;
    if (python_truthy(tool_calls)) {
      const std::string dsml(kDsml);
      Rendered list;
      bool first = true;
      for (const auto& tc : tool_calls) {
        const ojson& fn = get_or_null(tc, "function");
        if (!fn.is_object()) throw EncoderError("tool_calls[].function must be an object");
        if (!first) list += "\n";
        first = false;
        list += "<" + dsml + d.invoke + " name=\"";
        list.content(python_str(get_or_null(fn, "name")));
        list += "\">\n";
        list += encode_arguments_to_dsml(profile, fn, d);
        list += "\n</" + dsml + d.invoke + ">";
      }
      tc_content += "\n\n<" + dsml + d.block + ">\n";
      tc_content += list;
      tc_content += "\n</" + dsml + d.block + ">";
    }
    Rendered thinking_part;
    const bool prev_has_task = index >= 1 && has_non_null(messages[index - 1], "task");
    if (thinking && !prev_has_task) {
      if (!drop_thinking || static_cast<int>(index) > last_user) {
        const ojson& rc = get_or_null(msg, "reasoning_content");
        thinking_part.content(python_truthy(rc) ? str_of(rc, "reasoning_content") : std::string());
        thinking_part += kThinkEnd;
      }
    }
    prompt += thinking_part;
    prompt.content_with_images(content_or_empty(msg), v41);
    prompt += tc_content;
    if (!wo_eos) prompt += kEos;
  } else if (role == "tool") {
    throw EncoderError("tool messages must be merged into user messages");
  } else {
    throw EncoderError("Unknown role: " + role);
  }

  if (index + 1 < messages.size()) {
    const ojson& next_role = get_or_null(messages[index + 1], "role");
    if (!(next_role == "assistant" || next_role == "latest_reminder")) return prompt;
  }
  const ojson& task = get_or_null(msg, "task");
  if (!task.is_null()) {
    const std::string t = python_str(task);
    auto it = task_tokens().find(t);
    if (it == task_tokens().end()) throw EncoderError("Invalid task: '" + t + "'");
    if (t != "action") {
      prompt += it->second;
    } else {
      prompt += kAssistant;
      prompt += thinking ? kThinkBegin : kThinkEnd;
      prompt += it->second;
    }
  } else if (role == "user" || (!v41 && role == "developer") || (v41 && role == "system" && index > 0)) {
    prompt += kAssistant;
    if (thinking && (!drop_thinking || static_cast<int>(index) >= last_user)) {
      prompt += kThinkBegin;
    } else {
      prompt += kThinkEnd;
    }
  }
  return prompt;
}

// V4.1 turns content-part arrays into content_blocks (images become the
// placeholder) and rejects a literal placeholder in text.
ojson process_image_messages(const ojson& messages) {
  ojson out = ojson::array();
  for (auto msg : messages) {
    if (!msg.is_object()) throw EncoderError("each message must be an object");
    const ojson& content = get_or_null(msg, "content");
    if (content.is_string() && content.get_ref<const std::string&>().find(kImagePlaceholder) != std::string::npos) {
      throw EncoderError("Message content contains image special token '<｜deepseek_image｜>'");
    }
    const ojson& rc = get_or_null(msg, "reasoning_content");
    if (rc.is_string() && rc.get_ref<const std::string&>().find(kImagePlaceholder) != std::string::npos) {
      throw EncoderError("reasoning_content contains image special token '<｜deepseek_image｜>'");
    }
    if (content.is_array() && !msg.contains("content_blocks")) {
      msg["content_blocks"] = content;
      msg.erase("content");
    }
    if (python_truthy(get_or_null(msg, "content_blocks"))) {
      ojson blocks = ojson::array();
      for (const auto& b : msg["content_blocks"]) {
        const ojson& type = get_or_null(b, "type");
        if (type == "image" || type == "image_url") {
          blocks.push_back({{"type", "text"}, {"text", std::string(kImagePlaceholder)}});
        } else if (type == "tool_result" && get_or_null(b, "content").is_array()) {
          ojson nb = b;
          nb["content"] = process_image_messages(ojson::array({{{"content", b["content"]}}}))[0]["content_blocks"];
          blocks.push_back(nb);
        } else {
          if (type == "text") {
            const ojson& t = get_or_null(b, "text");
            if (t.is_string() && t.get_ref<const std::string&>().find(kImagePlaceholder) != std::string::npos) {
              throw EncoderError("Text block contains image placeholder '<｜deepseek_image｜>'");
            }
          }
          blocks.push_back(b);
        }
      }
      msg["content_blocks"] = blocks;
      if (!get_or_null(msg, "content").is_string()) {
        std::string joined;
        bool first = true;
        for (const auto& b : blocks) {
          if (get_or_null(b, "type") == "text") {
            if (!first) joined += "\n\n";
            first = false;
            const ojson& t = get_or_null(b, "text");
            joined += t.is_string() ? t.get<std::string>() : "";
          }
        }
        msg["content"] = joined;
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ojson merge_tool_messages(EncoderProfile profile, const ojson& messages) {
  ojson merged = ojson::array();
  for (const auto& msg : messages) {
    if (!msg.is_object()) throw EncoderError("each message must be an object");
    const ojson& role = get_or_null(msg, "role");
    auto last_is_open_user = [&](bool require_no_task) {
      if (merged.empty()) return false;
      const ojson& last = merged.back();
      if (get_or_null(last, "role") != "user" || !last.contains("content_blocks")) return false;
      return !require_no_task || get_or_null(last, "task").is_null();
    };
    if (role == "tool") {
      ojson block = ojson::object();
      block["type"] = "tool_result";
      block["tool_use_id"] = get_with_default_empty(msg, "tool_call_id");
      block["content"] = get_with_default_empty(msg, "content");
      if (last_is_open_user(false)) {
        merged.back()["content_blocks"].push_back(block);
      } else {
        merged.push_back({{"role", "user"}, {"content_blocks", ojson::array({block})}});
      }
    } else if (role == "user") {
      if (is_v41(profile)) {
        ojson blocks = get_or_null(msg, "content_blocks");
        if (!msg.contains("content_blocks") || blocks.is_null()) {
          blocks = ojson::array({{{"type", "text"}, {"text", get_with_default_empty(msg, "content")}}});
        }
        if (last_is_open_user(true)) {
          for (const auto& b : blocks) merged.back()["content_blocks"].push_back(b);
        } else {
          ojson nm = msg;
          nm["content_blocks"] = blocks;
          merged.push_back(std::move(nm));
        }
      } else {
        ojson block = {{"type", "text"}, {"text", get_with_default_empty(msg, "content")}};
        if (last_is_open_user(true)) {
          merged.back()["content_blocks"].push_back(block);
        } else {
          ojson nm = ojson::object();
          nm["role"] = "user";
          nm["content"] = get_with_default_empty(msg, "content");
          nm["content_blocks"] = ojson::array({block});
          for (const char* key : {"task", "wo_eos", "mask"}) {
            if (msg.contains(key)) nm[key] = msg[key];
          }
          merged.push_back(std::move(nm));
        }
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

void sort_tool_results_by_call_order(ojson& messages) {
  std::map<std::string, int> order;
  for (auto& msg : messages) {
    const ojson& role = get_or_null(msg, "role");
    if (role == "assistant" && python_truthy(get_or_null(msg, "tool_calls"))) {
      order.clear();
      int idx = 0;
      for (const auto& tc : msg["tool_calls"]) {
        ojson id = get_or_null(tc, "id");
        if (!python_truthy(id)) id = get_or_null(get_or_null(tc, "function"), "id");
        if (python_truthy(id) && id.is_string()) order.emplace(id.get<std::string>(), idx);
        ++idx;
      }
    } else if (role == "user" && python_truthy(get_or_null(msg, "content_blocks"))) {
      std::vector<ojson> tool_blocks;
      for (const auto& b : msg["content_blocks"]) {
        if (get_or_null(b, "type") == "tool_result") tool_blocks.push_back(b);
      }
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const ojson& b) {
          const ojson& id = get_or_null(b, "tool_use_id");
          if (!id.is_string()) return 0;
          auto it = order.find(id.get<std::string>());
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const ojson& a, const ojson& b) { return key(a) < key(b); });
        size_t k = 0;
        for (auto& b : msg["content_blocks"]) {
          if (get_or_null(b, "type") == "tool_result") b = tool_blocks[k++];
        }
      }
    }
  }
}

ojson drop_thinking_messages(EncoderProfile profile, const ojson& messages) {
  const int last_user = find_last_user_index(profile, messages);
  ojson result = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& msg = messages[i];
    const ojson& role = get_or_null(msg, "role");
    const bool keep = role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
                      role == "direct_search_results";
    if (keep || static_cast<int>(i) >= last_user) {
      result.push_back(msg);
    } else if (role == "assistant") {
      ojson m = msg;
      m.erase("reasoning_content");
      result.push_back(std::move(m));
    }
  }
  return result;
}

}  // namespace

bool is_v41(EncoderProfile p) { return p == EncoderProfile::V41 || p == EncoderProfile::V41TierTable; }

std::string_view profile_name(EncoderProfile p) {
  switch (p) {
    case EncoderProfile::V4Preview: return "v4_preview";
    case EncoderProfile::V4_0731: return "v4_0731";
    case EncoderProfile::V41: return "v41";
    case EncoderProfile::V41TierTable: return "v41_vendored_effort_table";
  }
  return "v4_preview";
}

std::optional<EncoderProfile> parse_profile_name(std::string_view name) {
  if (name == "v4" || name == "v4_preview" || name == "v4-preview" || name == "legacy")
    return EncoderProfile::V4Preview;
  if (name == "v4-0731" || name == "v4_0731" || name == "0731") return EncoderProfile::V4_0731;
  if (name == "v41" || name == "v4.1") return EncoderProfile::V41;
  if (name == "v41_vendored_effort_table" || name == "v41-tiers" || name == "v41-sglang")
    return EncoderProfile::V41TierTable;
  return std::nullopt;
}

EncoderProfile select_profile(const ojson& config, std::string_view tool_call_parser, const std::string& model_dir) {
  namespace fs = std::filesystem;
  auto read_text = [](const fs::path& p) -> std::string {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) > (1u << 20)) return {};
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  // A manifest written next to the checkpoint wins: we do not parse Python.
  if (!model_dir.empty()) {
    const std::string manifest = read_text(fs::path(model_dir) / "encoding" / "profile.json");
    if (!manifest.empty()) {
      try {
        auto j = ojson::parse(manifest);
        if (auto p = parse_profile_name(j.value("profile", ""))) return *p;
      } catch (const std::exception&) {
      }
    }
  }
  bool v41 = false, v4 = false;
  if (tool_call_parser == "deepseekv41") {
    v41 = true;
  } else if (tool_call_parser == "deepseekv4") {
    v4 = true;
  } else {
    const ojson& mt = get_or_null(config, "model_type");
    if (mt == "deepseek_v41" || mt == "deepseek_v4.1") v41 = true;
    const ojson& arch = get_or_null(config, "architectures");
    if (arch.is_array()) {
      for (const auto& a : arch) {
        if (!a.is_string()) continue;
        const auto& s = a.get_ref<const std::string&>();
        if (s.find("DeepseekV41") != std::string::npos) v41 = true;
        if (s.find("DeepseekV4") != std::string::npos) v4 = true;
      }
    }
    if (mt == "deepseek_v4") v4 = true;
  }
  const std::string name_hint = python_str(get_or_null(config, "_name_or_path")) + " " + model_dir;
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  if (v41) {
    const std::string enc = model_dir.empty() ? "" : read_text(fs::path(model_dir) / "encoding" / "encoding.py");
    if (enc.find("\"xhigh\": 75") != std::string::npos || enc.find("\"low\": 25") != std::string::npos) {
      return EncoderProfile::V41TierTable;
    }
    return EncoderProfile::V41;
  }
  if (v4) {
    const std::string enc = model_dir.empty() ? "" : read_text(fs::path(model_dir) / "encoding" / "encoding_dsv4.py");
    if (!enc.empty()) {
      if (enc.find("DEFAULT_REASONING_EFFORT = \"low\"") != std::string::npos ||
          enc.find("DEFAULT_REASONING_EFFORT = 'low'") != std::string::npos) {
        return EncoderProfile::V4_0731;
      }
      if (enc.find("REASONING_EFFORT_MAX") != std::string::npos) return EncoderProfile::V4Preview;
    }
    if (lower(name_hint).find("0731") != std::string::npos) return EncoderProfile::V4_0731;
    return EncoderProfile::V4Preview;
  }
  throw std::runtime_error("config.json does not describe a DeepSeek-V4 family model (model_type/architectures)");
}

std::string encode_messages(EncoderProfile profile, const EncoderInput& input) {
  return encode_messages(profile, input, nullptr);
}

std::string encode_messages(EncoderProfile profile, const EncoderInput& input, std::vector<TextSpan>* content_spans) {
  if (!input.messages.is_array()) throw EncoderError("messages must be an array");
  ojson context = input.context.is_array() ? input.context : ojson::array();
  ojson messages = input.messages;
  if (is_v41(profile)) {
    messages = process_image_messages(messages);
    if (!context.empty()) context = process_image_messages(context);
  }
  messages = merge_tool_messages(profile, messages);
  {
    ojson joined = context;
    for (const auto& m : messages) joined.push_back(m);
    sort_tool_results_by_call_order(joined);
    ojson tail = ojson::array();
    for (size_t i = context.size(); i < joined.size(); ++i) tail.push_back(joined[i]);
    messages = tail;
  }
  if (!context.empty()) {
    context = merge_tool_messages(profile, context);
    sort_tool_results_by_call_order(context);
  }
  ojson full = context;
  for (const auto& m : messages) full.push_back(m);

  Rendered prompt;
  if (input.add_bos && context.empty()) prompt += kBos;
  bool drop = input.drop_thinking;
  for (const auto& m : full) {
    if (python_truthy(get_or_null(m, "tools"))) drop = false;
  }
  size_t num_to_render, context_len;
  if (input.thinking && drop) {
    full = drop_thinking_messages(profile, full);
    num_to_render = full.size() - drop_thinking_messages(profile, context).size();
    context_len = full.size() - num_to_render;
  } else {
    num_to_render = messages.size();
    context_len = context.size();
  }
  for (size_t i = 0; i < num_to_render; ++i) {
    prompt += render_message(profile, i + context_len, full, input.thinking, drop, input.reasoning_effort);
  }
  if (content_spans) *content_spans = std::move(prompt.spans);
  return std::move(prompt.text);
}

// ---------------------------------------------------------------------------
// Serving layer

RenderOptions RenderOptions::reference() {
  RenderOptions o;
  o.map_developer_to_system = false;
  o.hoist_v4_system = false;
  o.trailing_assistant_to_user = false;
  o.allow_image_parts = true;
  o.pass_effort_through = true;
  return o;
}

RenderOptions RenderOptions::vllm() {
  RenderOptions o;
  o.flavor = ServingFlavor::VLLM;
  o.hoist_v4_system = false;
  o.trailing_assistant_to_user = false;
  o.allow_image_parts = true;
  return o;
}

namespace {

std::optional<bool> parse_bool_env(const char* v) {
  if (!v) return std::nullopt;
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  throw std::runtime_error(std::string("invalid boolean value '") + v + "'");
}

// The profile's accepted request tiers; numbers are handled separately.
bool v4_effort_accepted(EncoderProfile p, const std::string& e) {
  if (p == EncoderProfile::V4Preview) return e == "high" || e == "max";
  if (p == EncoderProfile::V4_0731) return e == "low" || e == "high" || e == "max";
  if (p == EncoderProfile::V41) return e == "low" || e == "high" || e == "max";
  return e == "low" || e == "high" || e == "xhigh" || e == "max";
}

bool is_integer(const ojson& v) { return v.is_number_integer() || v.is_number_unsigned(); }

}  // namespace

RenderOptions RenderOptions::from_environment(EncoderProfile profile) {
  RenderOptions o;
  if (auto t = parse_bool_env(std::getenv("SGLANG_DEFAULT_THINKING"))) o.default_thinking = *t;
  const char* env =
      is_v41(profile) ? std::getenv("SGLANG_DSV41_REASONING_EFFORT") : std::getenv("SGLANG_DSV4_REASONING_EFFORT");
  if (env && *env) {
    std::string s(env);
    bool all_digits =
        std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (is_v41(profile) && all_digits && s.size() <= 3) {
      const int v = std::stoi(s);
      if (v < 1 || v > 100) throw std::runtime_error("reasoning effort budget must be within 1..100: " + s);
      o.default_reasoning_effort = v;
    } else if (v4_effort_accepted(profile, s)) {
      o.default_reasoning_effort = s;
    } else {
      throw std::runtime_error("invalid default reasoning effort '" + s + "' for profile " +
                               std::string(profile_name(profile)));
    }
  }
  return o;
}

ModeDecision resolve_mode(const ojson& request, EncoderProfile profile, const RenderOptions& options) {
  ModeDecision d;
  const ojson& ctk = get_or_null(request, "chat_template_kwargs");
  const ojson& top_thinking = get_or_null(request, "thinking");
  const bool vllm = options.flavor == ServingFlavor::VLLM;
  const bool v41 = is_v41(profile);

  std::optional<bool> thinking;
  if (ctk.is_object() && ctk.contains("thinking") && !ctk["thinking"].is_null()) {
    thinking = python_truthy(ctk["thinking"]);
  } else if (ctk.is_object() && ctk.contains("enable_thinking") && !ctk["enable_thinking"].is_null()) {
    thinking = python_truthy(ctk["enable_thinking"]);
  } else if (top_thinking.is_boolean()) {
    thinking = top_thinking.get<bool>();
  } else if (top_thinking.is_object()) {
    const ojson& type = get_or_null(top_thinking, "type");
    if (type == "enabled") thinking = true;
    if (type == "disabled") thinking = false;
  }

  const bool top_has_effort =
      request.is_object() && request.contains("reasoning_effort") && !request["reasoning_effort"].is_null();
  ojson effort = top_has_effort ? request["reasoning_effort"] : ojson();
  bool effort_from_kwargs = false;
  if (effort.is_null() && ctk.is_object() && ctk.contains("reasoning_effort") && !ctk["reasoning_effort"].is_null()) {
    effort = ctk["reasoning_effort"];
    effort_from_kwargs = true;
  }

  if (options.pass_effort_through) {
    d.thinking = thinking.value_or(options.default_thinking.value_or(false));
    d.reasoning_effort = effort;
    return d;
  }

  if (effort == "none") {
    d.thinking = false;
    d.reasoning_effort = nullptr;
    return d;
  }

  if (vllm) {
    d.thinking = thinking.value_or(options.default_thinking.value_or(true));
    if (!d.thinking) return d;
    if (v41) {
      if (effort.is_null()) {
        d.reasoning_effort = options.default_reasoning_effort;
      } else if (effort.is_string() && v4_effort_accepted(profile, effort.get<std::string>())) {
        d.reasoning_effort = effort;
      } else if (is_integer(effort) && effort.get<int64_t>() >= 1 && effort.get<int64_t>() <= 100) {
        d.reasoning_effort = effort;
      } else {
        throw EncoderError("invalid reasoning_effort " + python_json_dumps(effort) +
                           ": expected low, high, xhigh, max or an integer within 1..100");
      }
      return d;
    }
    if (effort.is_null()) {
      // An explicit thinking switch without an effort reaches the encoder
      // without one (encoder default); vLLM's own default effort is `high`.
      d.reasoning_effort = thinking.has_value() ? ojson() : ojson("high");
      if (!options.default_reasoning_effort.is_null() && !thinking.has_value()) {
        d.reasoning_effort = options.default_reasoning_effort;
      }
    } else {
      const std::string e = effort.is_string() ? effort.get<std::string>() : std::string();
      std::string mapped = "high";
      if (e == "minimal" || e == "low" || e == "medium") mapped = "low";
      if (e == "max") mapped = "max";
      if (profile == EncoderProfile::V4Preview && mapped == "low") mapped = "high";
      d.reasoning_effort = mapped;
    }
    return d;
  }

  // SGLang flavor.
  const bool effort_enables = options.reasoning_effort_enables_thinking.value_or(v41) && top_has_effort;
  d.thinking = thinking.value_or(effort_enables ? true : options.default_thinking.value_or(false));
  if (!thinking.has_value() && effort_enables) d.thinking = true;

  auto fallback = [&](const std::string& why) {
    if (!why.empty()) d.warnings.push_back(why);
    d.reasoning_effort = options.default_reasoning_effort;
  };
  if (effort.is_null()) {
    fallback("");
  } else if (effort.is_string() && v4_effort_accepted(profile, effort.get<std::string>())) {
    d.reasoning_effort = effort;
  } else if (v41 && is_integer(effort) && effort_from_kwargs && effort.get<int64_t>() >= 1 &&
             effort.get<int64_t>() <= 100) {
    d.reasoning_effort = effort;
  } else if (v41 && effort.is_number() && !effort_from_kwargs && effort.get<double>() >= 0.0 &&
             effort.get<double>() <= 0.99) {
    const long v = std::lround(effort.get<double>() * 100.0);
    d.reasoning_effort = std::clamp<long>(v, 1, 100);
  } else {
    fallback("reasoning_effort " + python_json_dumps(effort) + " is not supported by the " +
             std::string(profile_name(profile)) + " encoder; using the server default");
  }
  return d;
}

bool prompt_starts_in_reasoning(std::string_view prompt) {
  const auto open = prompt.rfind(kThinkBegin);
  if (open == std::string_view::npos) return false;
  const auto close = prompt.rfind(kThinkEnd);
  return close == std::string_view::npos || close < open;
}

namespace {

// P1: content arrays to text (V4 only; V4.1's encoder does it itself).
std::string flatten_parts(const ojson& content, const RenderOptions& options) {
  std::string out;
  bool first = true;
  for (const auto& part : content) {
    const ojson& type = get_or_null(part, "type");
    if (type == "text") {
      if (!first) out += "\n\n";
      first = false;
      out += str_of(get_or_null(part, "text"), "content part text");
    } else if (type == "image_url" || type == "image") {
      throw EncoderError("image content parts are not supported by this text-only model");
    } else {
      throw EncoderError("unsupported content part type " + python_json_dumps(type));
    }
  }
  return out;
}

void check_parts(const ojson& content, const RenderOptions& options) {
  for (const auto& part : content) {
    const ojson& type = get_or_null(part, "type");
    if ((type == "image_url" || type == "image") && !options.allow_image_parts) {
      throw EncoderError("image content parts are not supported by this text-only model");
    }
  }
}

// Whether earlier turns' reasoning is dropped: chat_template_kwargs.drop_thinking,
// else the request-level drop_thinking, else the server's default. A client
// that sends its history's reasoning back turns it off to keep that reasoning
// in the prompt (the reference encoder's drop_thinking=False).
bool resolve_drop_thinking(const ojson& request, const RenderOptions& options) {
  auto read = [](const ojson& holder, const char* where) -> std::optional<bool> {
    const ojson& v = get_or_null(holder, "drop_thinking");
    if (v.is_null()) return std::nullopt;
    if (!v.is_boolean()) throw EncoderError(std::string("'") + where + "' must be a boolean");
    return v.get<bool>();
  };
  const ojson& ctk = get_or_null(request, "chat_template_kwargs");
  if (ctk.is_object()) {
    if (auto v = read(ctk, "chat_template_kwargs.drop_thinking")) return *v;
  }
  if (auto v = read(request, "drop_thinking")) return *v;
  return options.drop_thinking;
}

}  // namespace

RenderedPrompt render_chat_request(const ojson& request, EncoderProfile profile, const RenderOptions& options) {
  if (!request.is_object()) throw EncoderError("request must be a JSON object");
  const ojson& req_messages = get_or_null(request, "messages");
  if (!req_messages.is_array()) throw EncoderError("'messages' must be an array");
  const bool v41 = is_v41(profile);
  const bool vllm = options.flavor == ServingFlavor::VLLM;

  RenderedPrompt out;
  ModeDecision mode = resolve_mode(request, profile, options);

  ojson messages = ojson::array();
  for (const auto& m : req_messages) {
    if (!m.is_object()) throw EncoderError("each message must be an object");
    ojson msg = m;
    const ojson& role = get_or_null(msg, "role");
    if (!role.is_string()) throw EncoderError("each message needs a string 'role'");
    if (options.map_developer_to_system && role == "developer") msg["role"] = "system";
    // `reasoning` is the alias some clients send back.
    if (!msg.contains("reasoning_content") && msg.contains("reasoning")) msg["reasoning_content"] = msg["reasoning"];
    msg.erase("reasoning");
    const ojson& content = get_or_null(msg, "content");
    if (content.is_array()) {
      const std::string r = msg["role"].get<std::string>();
      if (!v41 && (r == "system" || r == "user" || r == "assistant" || r == "developer")) {
        if (options.allow_image_parts) {
          // Vision fixtures: keep the reference join but with placeholders.
          std::string joined;
          bool first = true;
          for (const auto& part : content) {
            if (!first) joined += "\n\n";
            first = false;
            const ojson& type = get_or_null(part, "type");
            if (type == "image_url" || type == "image") {
              joined += std::string(kImagePlaceholder);
            } else if (type == "text") {
              joined += str_of(get_or_null(part, "text"), "content part text");
            } else {
              throw EncoderError("unsupported content part type " + python_json_dumps(type));
            }
          }
          msg["content"] = joined;
        } else {
          msg["content"] = flatten_parts(content, options);
        }
      } else {
        check_parts(content, options);
      }
    }
    if (msg["role"] == "assistant" && msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
      for (auto& tc : msg["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) {
          throw EncoderError("tool_calls[].function must be an object");
        }
        auto& fn = tc["function"];
        // Null / empty arguments mean "no parameters" (vLLM); the reference
        // would render a bogus `arguments` parameter.
        if (!fn.contains("arguments") || fn["arguments"].is_null() ||
            (fn["arguments"].is_string() && fn["arguments"].get<std::string>().empty())) {
          fn["arguments"] = "{}";
        }
      }
    }
    messages.push_back(std::move(msg));
  }

  // vLLM merges consecutive assistant messages into one turn.
  if (vllm) {
    ojson merged = ojson::array();
    for (auto& m : messages) {
      if (!merged.empty() && m["role"] == "assistant" && merged.back()["role"] == "assistant") {
        ojson& prev = merged.back();
        auto join_field = [&](const char* key) {
          const ojson& a = get_or_null(prev, key);
          const ojson& b = get_or_null(m, key);
          if (python_truthy(b)) prev[key] = python_truthy(a) ? ojson(a.get<std::string>() + b.get<std::string>()) : b;
        };
        join_field("content");
        join_field("reasoning_content");
        if (python_truthy(get_or_null(m, "tool_calls"))) {
          if (!prev.contains("tool_calls") || !prev["tool_calls"].is_array()) prev["tool_calls"] = ojson::array();
          for (const auto& tc : m["tool_calls"]) prev["tool_calls"].push_back(tc);
        }
        continue;
      }
      merged.push_back(std::move(m));
    }
    messages = std::move(merged);
  }

  // V4 has no system marker: later system text would be pasted raw into the
  // conversation, so it goes to the top (serving.md §1.12).
  if (!v41 && options.hoist_v4_system) {
    std::string hoisted;
    ojson kept = ojson::array();
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i > 0 && messages[i]["role"] == "system") {
        const std::string c = content_or_empty(messages[i]);
        if (!hoisted.empty()) hoisted += "\n\n";
        hoisted += c;
        continue;
      }
      kept.push_back(messages[i]);
    }
    if (!hoisted.empty()) {
      if (!kept.empty() && kept[0]["role"] == "system") {
        const std::string c = content_or_empty(kept[0]);
        kept[0]["content"] = c.empty() ? hoisted : c + "\n\n" + hoisted;
      } else {
        kept.insert(kept.begin(), ojson{{"role", "system"}, {"content", hoisted}});
      }
    }
    messages = std::move(kept);
  }

  // Continuation of a final assistant message.
  const bool continue_final = python_truthy(get_or_null(request, "continue_final_message"));
  bool prefix_continuation = false;
  if (!messages.empty() && messages.back()["role"] == "assistant" &&
      python_truthy(get_or_null(messages.back(), "prefix"))) {
    prefix_continuation = true;
  }
  for (auto& m : messages) m.erase("prefix");
  const bool continuing = continue_final || prefix_continuation;
  if (continue_final && (messages.empty() || messages.back()["role"] != "assistant")) {
    throw EncoderError("continue_final_message requires the last message to be an assistant message");
  }
  if (prefix_continuation) mode.thinking = false;
  if (continuing) messages.back()["wo_eos"] = true;

  const bool add_generation_prompt =
      !request.contains("add_generation_prompt") || python_truthy(request["add_generation_prompt"]);
  if (!continuing && !messages.empty() && messages.back()["role"] == "assistant" &&
      options.trailing_assistant_to_user) {
    ojson& last = messages.back();
    ojson user = {{"role", "user"}, {"content", content_or_empty(last)}};
    last = std::move(user);
  }

  // Tools (P2/P3): rendered on the first message, which must be a system one.
  const ojson& tools = get_or_null(request, "tools");
  const ojson& tool_choice = get_or_null(request, "tool_choice");
  if (python_truthy(tools) && tool_choice != "none") {
    if (!tools.is_array()) throw EncoderError("'tools' must be an array");
    for (const auto& t : tools) {
      if (!t.is_object() || !get_or_null(t, "function").is_object()) {
        throw EncoderError("each tool must be {\"type\": \"function\", \"function\": {...}}");
      }
    }
    if (messages.empty() || messages[0]["role"] != "system") {
      messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", ""}});
    }
    messages[0]["tools"] = tools;
  }

  out.encoder_input.messages = std::move(messages);
  out.encoder_input.thinking = mode.thinking;
  out.encoder_input.reasoning_effort = mode.reasoning_effort;
  out.encoder_input.drop_thinking = resolve_drop_thinking(request, options);
  if (request.contains("context") && request["context"].is_array()) out.encoder_input.context = request["context"];
  out.prompt = encode_messages(profile, out.encoder_input, &out.content_spans);

  if (continuing && vllm) {
    const ojson& last = out.encoder_input.messages.back();
    if (!python_truthy(get_or_null(last, "content")) && python_truthy(get_or_null(last, "reasoning_content")) &&
        mode.thinking && out.prompt.size() >= kThinkEnd.size() &&
        out.prompt.compare(out.prompt.size() - kThinkEnd.size(), kThinkEnd.size(), kThinkEnd) == 0) {
      // vLLM keeps the think block open for a reasoning-only continuation.
      out.prompt.resize(out.prompt.size() - kThinkEnd.size());
    }
  }
  if (vllm && !continuing) {
    // vLLM's add_generation_prompt: the cue follows ANY final role, and is
    // absent (even after a user turn) when the client turns it off.
    bool has_cue = false;
    for (std::string_view cue :
         {std::string_view("<｜Assistant｜><think>"), std::string_view("<｜Assistant｜></think>")}) {
      if (out.prompt.size() >= cue.size() && out.prompt.compare(out.prompt.size() - cue.size(), cue.size(), cue) == 0) {
        has_cue = true;
        if (!add_generation_prompt) out.prompt.resize(out.prompt.size() - cue.size());
        break;
      }
    }
    if (add_generation_prompt && !has_cue) {
      out.prompt += kAssistant;
      out.prompt += mode.thinking ? kThinkBegin : kThinkEnd;
    }
  }
  // The vLLM cue handling above only cut template text; keep spans in range.
  for (auto& sp : out.content_spans) {
    sp.end = std::min(sp.end, out.prompt.size());
    sp.begin = std::min(sp.begin, sp.end);
  }
  out.thinking = mode.thinking;
  out.warnings = std::move(mode.warnings);
  out.starts_in_reasoning = prompt_starts_in_reasoning(out.prompt);
  return out;
}

}  // namespace dsv4::text
