// The serving layer of the chat format: render options from the
// environment, the thinking / reasoning-effort decision of a request, and
// an OpenAI-style chat request rendered into a prompt (chat_encoder.cpp
// renders the messages themselves).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/chat_encoder.h"
#include "text/chat_format.h"
#include "text/json_limits.h"

namespace dsv4::text {

using namespace chat_detail;

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
