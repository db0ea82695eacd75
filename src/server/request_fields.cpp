#include "server/request_fields.h"

#include <algorithm>

#include "text/json_limits.h"
#include "text/utf8.h"

namespace dsv4 {

ojson parse_body(const std::string& body) {
  if (body.empty()) throw BadRequest("the request body is empty; expected a JSON object");
  if (!text::utf8::is_valid(body)) throw BadRequest("the request body is not valid UTF-8");
  ojson j;
  try {
    j = text::parse_json_limited(body);
  } catch (const text::JsonDepthError& e) {
    throw BadRequest(e.what());
  } catch (const std::exception& e) {
    throw BadRequest(std::string("malformed JSON: ") + e.what());
  }
  if (!j.is_object()) throw BadRequest("the request body must be a JSON object");
  return j;
}

double number_field(const ojson& j, const char* key, double fallback, double lo, double hi) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) throw BadRequest(std::string("'") + key + "' must be a number");
  double v = j[key].get<double>();
  if (!(v >= lo && v <= hi))
    throw BadRequest(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v;
}

int64_t int_field(const ojson& j, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer()) throw BadRequest(std::string("'") + key + "' must be an integer");
  int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi)
    throw BadRequest(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v;
}

bool bool_field(const ojson& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw BadRequest(std::string("'") + key + "' must be a boolean");
  return j[key].get<bool>();
}

namespace {

bool present(const ojson& j, const char* key) { return j.is_object() && j.contains(key) && !j[key].is_null(); }

// `what` (a path such as messages[2].name) must be a string or null.
void optional_string(const ojson& j, const char* key, const std::string& what) {
  if (present(j, key) && !j[key].is_string()) throw BadRequest(request_json::quoted(what) + " must be a string");
}

void optional_bool(const ojson& j, const char* key) {
  if (present(j, key) && !j[key].is_boolean()) throw BadRequest(request_json::quoted(key) + " must be a boolean");
}

}  // namespace

std::string string_field(const ojson& j, const char* key, const std::string& fallback) {
  if (!present(j, key)) return fallback;
  if (!j[key].is_string()) throw BadRequest(request_json::quoted(key) + " must be a string");
  return j[key].get<std::string>();
}

const ojson* object_field(const ojson& j, const char* key) {
  if (!present(j, key)) return nullptr;
  if (!j[key].is_object()) throw BadRequest(request_json::quoted(key) + " must be an object");
  return &j[key];
}

bool include_usage_field(const ojson& body) {
  const ojson* so = object_field(body, "stream_options");
  if (!so) return false;
  if (present(*so, "continuous_usage_stats") && !(*so)["continuous_usage_stats"].is_boolean())
    throw BadRequest("'stream_options.continuous_usage_stats' must be a boolean");
  if (present(*so, "include_usage") && !(*so)["include_usage"].is_boolean())
    throw BadRequest("'stream_options.include_usage' must be a boolean");
  return bool_field(*so, "include_usage", false);
}

std::vector<std::pair<int32_t, float>> logit_bias_field(const ojson& j, int64_t vocab) {
  std::vector<std::pair<int32_t, float>> out;
  const ojson* lb = object_field(j, "logit_bias");
  if (!lb) return out;
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      throw BadRequest("'logit_bias' keys must be token ids (decimal strings); got \"" + key.substr(0, 32) + "\"");
    const int64_t id = std::stoll(key);
    if (vocab > 0 && id >= vocab) throw BadRequest("token id " + key + " in 'logit_bias' is outside the vocabulary");
    if (!it.value().is_number()) throw BadRequest("'logit_bias' values must be numbers (token " + key + ")");
    const double bias = it.value().get<double>();
    if (!(bias >= -100.0 && bias <= 100.0))
      throw BadRequest("'logit_bias' values must be between -100 and 100 (token " + key + ")");
    out.push_back({int32_t(id), float(bias)});
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_response_format(const ojson& body) {
  const ojson* rf = object_field(body, "response_format");
  if (!rf) return;
  if (!rf->contains("type") || !(*rf)["type"].is_string()) throw BadRequest("'response_format.type' must be a string");
  const std::string type = (*rf)["type"].get<std::string>();
  if (type != "text" && type != "json_object" && type != "json_schema" && type != "structural_tag")
    throw BadRequest("'response_format.type' must be text, json_object, json_schema or structural_tag");
  if (type == "json_schema" && (!rf->contains("json_schema") || !(*rf)["json_schema"].is_object()))
    throw BadRequest("'response_format.json_schema' must be an object");
}

std::vector<std::string> rid_field(const ojson& body, size_t count, const std::string& fallback, bool allow_list) {
  std::vector<std::string> out;
  if (present(body, "rid") && body["rid"].is_array() && allow_list) {
    const ojson& list = body["rid"];
    if (list.size() != count)
      throw BadRequest("'rid' lists " + std::to_string(list.size()) + " ids for " + std::to_string(count) +
                       " requests");
    for (auto& r : list) {
      if (!r.is_string()) throw BadRequest("'rid' must be a string or a list of strings");
      out.push_back(r.get<std::string>());
    }
    return out;
  }
  if (present(body, "rid") && !body["rid"].is_string())
    throw BadRequest(allow_list ? "'rid' must be a string or a list of strings" : "'rid' must be a string");
  const std::string base = string_field(body, "rid", fallback);
  if (count == 1) return {base};
  for (size_t i = 0; i < count; ++i) out.push_back(base + "-" + std::to_string(i));
  return out;
}

std::vector<std::string> stop_field(const ojson& j) {
  std::vector<std::string> out;
  if (!j.contains("stop") || j["stop"].is_null()) return out;
  const ojson& s = j["stop"];
  if (s.is_string())
    out.push_back(s.get<std::string>());
  else if (s.is_array()) {
    for (auto& v : s) {
      if (!v.is_string()) throw BadRequest("'stop' must be a string or a list of strings");
      out.push_back(v.get<std::string>());
    }
  } else {
    throw BadRequest("'stop' must be a string or a list of strings");
  }
  if (out.size() > 16) throw BadRequest("'stop' may hold at most 16 strings");
  return out;
}

std::vector<int32_t> id_list(const ojson& v, const char* what, int64_t vocab) {
  if (!v.is_array()) throw BadRequest(std::string("'") + what + "' must be a list of token ids");
  std::vector<int32_t> ids;
  for (auto& x : v) {
    if (!x.is_number_integer()) throw BadRequest(std::string("'") + what + "' must be a list of token ids");
    int64_t id = x.get<int64_t>();
    if (vocab > 0 && (id < 0 || id >= vocab))
      throw BadRequest("token id " + std::to_string(id) + " in '" + what + "' is outside the vocabulary");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<std::vector<int32_t>> prompts_field(const ojson& p, const char* key, const text::Tokenizer& tokenizer,
                                                int64_t vocab, PromptKind kind) {
  // /generate keeps its two fields apart: `text` is text, `input_ids` ids.
  auto is_text = [](const ojson& v) {
    if (v.is_string()) return true;
    if (!v.is_array()) return false;
    for (auto& item : v)
      if (!item.is_string()) return false;
    return true;
  };
  if (kind == PromptKind::Text && !is_text(p))
    throw BadRequest(std::string("'") + key + "' must be a string or a list of strings");
  if (kind == PromptKind::Ids && (!p.is_array() || p.empty() || is_text(p)))
    throw BadRequest(std::string("'") + key + "' must be a list of token ids or a list of such lists");
  std::vector<std::vector<int32_t>> out;
  if (p.is_string()) {
    out.push_back(tokenizer.encode(p.get<std::string>()));
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    out.push_back(id_list(p, key, vocab));
  } else if (p.is_array() && !p.empty()) {
    for (auto& item : p) {
      if (item.is_string())
        out.push_back(tokenizer.encode(item.get<std::string>()));
      else if (item.is_array())
        out.push_back(id_list(item, key, vocab));
      else
        throw BadRequest(std::string("'") + key + "' must be a string, a list of strings or token ids");
    }
  } else {
    throw BadRequest(std::string("'") + key + "' must be a non-empty string, a list of strings or token ids");
  }
  for (auto& ids : out)
    if (ids.empty()) throw BadRequest(std::string("'") + key + "' holds an empty prompt");
  return out;
}

int64_t max_tokens_field(const ojson& j, const char* key, int64_t fallback, bool* given) {
  *given = present(j, key);
  if (!*given) return fallback;
  return int_field(j, key, fallback, 1, int64_t(1) << 40);
}

namespace {

// One content part of a message: an object with a string "type"; text parts
// carry a string "text".
void check_content_part(const ojson& part, const std::string& where) {
  if (!part.is_object()) throw BadRequest(request_json::quoted(where) + " must be an object with a 'type'");
  if (!part.contains("type") || !part["type"].is_string())
    throw BadRequest(request_json::quoted(where + ".type") + " must be a string");
  if (part["type"] == "text" && (!part.contains("text") || !part["text"].is_string()))
    throw BadRequest(request_json::quoted(where + ".text") + " must be a string");
}

void check_tool_call(const ojson& tc, const std::string& where) {
  if (!tc.is_object()) throw BadRequest(request_json::quoted(where) + " must be an object");
  optional_string(tc, "id", where + ".id");
  optional_string(tc, "type", where + ".type");
  if (!tc.contains("function") || !tc["function"].is_object())
    throw BadRequest(request_json::quoted(where + ".function") + " must be an object");
  const ojson& fn = tc["function"];
  optional_string(fn, "name", where + ".function.name");
  if (present(fn, "arguments") && !fn["arguments"].is_string() && !fn["arguments"].is_object())
    throw BadRequest(request_json::quoted(where + ".function.arguments") + " must be a string (JSON) or an object");
}

void check_message(const ojson& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    throw BadRequest("every message must be an object with a string 'role' (" + where + ")");
  if (present(m, "content")) {
    const ojson& c = m["content"];
    if (c.is_array()) {
      for (size_t k = 0; k < c.size(); ++k) check_content_part(c[k], where + ".content[" + std::to_string(k) + "]");
    } else if (!c.is_string()) {
      throw BadRequest(request_json::quoted(where + ".content") + " must be a string, a list of content parts or null");
    }
  }
  optional_string(m, "name", where + ".name");
  optional_string(m, "tool_call_id", where + ".tool_call_id");
  optional_string(m, "reasoning_content", where + ".reasoning_content");
  optional_string(m, "reasoning", where + ".reasoning");
  if (present(m, "tool_calls")) {
    if (!m["tool_calls"].is_array()) throw BadRequest(request_json::quoted(where + ".tool_calls") + " must be a list");
    for (size_t k = 0; k < m["tool_calls"].size(); ++k)
      check_tool_call(m["tool_calls"][k], where + ".tool_calls[" + std::to_string(k) + "]");
  }
}

void check_tools(const ojson& body) {
  if (!present(body, "tools")) return;
  if (!body["tools"].is_array()) throw BadRequest("'tools' must be a list");
  for (size_t k = 0; k < body["tools"].size(); ++k) {
    const ojson& t = body["tools"][k];
    const std::string where = "tools[" + std::to_string(k) + "]";
    if (!t.is_object()) throw BadRequest(request_json::quoted(where) + " must be an object");
    optional_string(t, "type", where + ".type");
    if (!t.contains("function") || !t["function"].is_object())
      throw BadRequest(request_json::quoted(where + ".function") + " must be an object");
    const ojson& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      throw BadRequest(request_json::quoted(where + ".function.name") + " must be a string");
    optional_string(fn, "description", where + ".function.description");
    if (present(fn, "parameters") && !fn["parameters"].is_object())
      throw BadRequest(request_json::quoted(where + ".function.parameters") + " must be an object");
    if (present(fn, "strict") && !fn["strict"].is_boolean())
      throw BadRequest(request_json::quoted(where + ".function.strict") + " must be a boolean");
  }
}

}  // namespace

void check_chat_request(const ojson& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw BadRequest("'messages' must be a non-empty list");
  for (size_t i = 0; i < body["messages"].size(); ++i) check_message(body["messages"][i], i);
  optional_string(body, "model", "model");
  check_tools(body);
  object_field(body, "chat_template_kwargs");
  optional_bool(body, "add_generation_prompt");
  optional_bool(body, "continue_final_message");
  optional_bool(body, "separate_reasoning");
  optional_bool(body, "drop_thinking");
  check_response_format(body);
}

void check_tool_choice(const ojson& body) {
  // tool_choice checks (serving.md §2.7).
  const bool has_tools = body.contains("tools") && body["tools"].is_array() && !body["tools"].empty();
  if (body.contains("tools") && !body["tools"].is_null() && !body["tools"].is_array())
    throw BadRequest("'tools' must be a list");
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return;
  const ojson& tc = body["tool_choice"];
  if (tc.is_string()) {
    std::string v = tc.get<std::string>();
    if (v != "none" && v != "auto" && v != "required")
      throw BadRequest("'tool_choice' must be none, auto, required or a function");
    if (v == "required" && !has_tools) throw BadRequest("Tools cannot be empty if tool choice is set to required.");
  } else if (tc.is_object()) {
    optional_string(tc, "type", "tool_choice.type");
    if (!tc.contains("function") || !tc["function"].is_object())
      throw BadRequest("'tool_choice.function' must be an object");
    const ojson& fn = tc["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      throw BadRequest("'tool_choice.function.name' must be a string");
    const std::string name = fn["name"].get<std::string>();
    bool found = false;
    if (has_tools)
      for (auto& t : body["tools"])
        if (t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].contains("name") &&
            t["function"]["name"] == name)
          found = true;
    if (!found) throw BadRequest("tool_choice names function '" + name + "', which is not in 'tools'");
  } else {
    throw BadRequest("'tool_choice' must be a string or an object");
  }
}

uint64_t SeedSource::next() {
  // Deterministic mode: the same request gives the same tokens; otherwise a
  // fresh seed per request (still reproducible from --random-seed).
  return deterministic_ ? 42 : random_seed_ ^ (0x9E3779B97F4A7C15ull * ++counter_);
}

SamplingParams sampling_field(const ojson& j, int64_t max_new_tokens, int64_t vocab, SeedSource& seeds) {
  SamplingParams p;
  p.temperature = float(number_field(j, "temperature", 1.0, 0.0, 100.0));
  p.top_p = float(number_field(j, "top_p", 1.0, 0.0, 1.0));
  if (j.contains("top_p") && j["top_p"].is_number() && p.top_p <= 0) throw BadRequest("'top_p' must be in (0, 1]");
  p.top_k = int_field(j, "top_k", -1, -1, int64_t(1) << 31);
  p.min_p = float(number_field(j, "min_p", 0.0, 0.0, 1.0));
  p.presence_penalty = float(number_field(j, "presence_penalty", 0.0, -2.0, 2.0));
  p.frequency_penalty = float(number_field(j, "frequency_penalty", 0.0, -2.0, 2.0));
  p.repetition_penalty = float(number_field(j, "repetition_penalty", 1.0, 0.01, 10.0));
  p.min_new_tokens = int_field(j, "min_tokens", 0, 0, int64_t(1) << 40);
  p.ignore_eos = bool_field(j, "ignore_eos", false);
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null())
    p.stop_token_ids = id_list(j["stop_token_ids"], "stop_token_ids", vocab);
  p.logit_bias = logit_bias_field(j, vocab);
  p.max_new_tokens = max_new_tokens;
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) throw BadRequest("'seed' must be an integer");
    p.seed = j["seed"].get<uint64_t>();
  } else {
    p.seed = seeds.next();
  }
  return p;
}

namespace request_json {

const ojson& field(const ojson& j, const char* key) {
  static const ojson null_value;
  if (!j.is_object()) return null_value;
  auto it = j.find(key);
  return it == j.end() ? null_value : *it;
}

void bad(const std::string& message) { throw BadRequest(message); }

std::string quoted(const std::string& where) { return "'" + where + "'"; }

std::string string_at(const ojson& j, const char* key, const std::string& where) {
  const ojson& v = field(j, key);
  if (!v.is_string()) bad(quoted(where + "." + key) + " must be a string");
  return v.get<std::string>();
}

}  // namespace request_json

}  // namespace dsv4
