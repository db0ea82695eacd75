#include "text/chat_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "text/chat_format.h"
#include "text/json_limits.h"

namespace dsv4::text {

using namespace chat_detail;

namespace {


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

}  // namespace dsv4::text
