#include "server/request_fields.h"

#include "text/utf8.h"

namespace dsv4 {

ojson parse_body(const std::string& body) {
  if (body.empty()) throw BadRequest("the request body is empty; expected a JSON object");
  if (!text::utf8::is_valid(body)) throw BadRequest("the request body is not valid UTF-8");
  ojson j;
  try {
    j = ojson::parse(body);
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

std::string string_or(const ojson& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
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
    if (id < 0 || id >= vocab)
      throw BadRequest("token id " + std::to_string(id) + " in '" + what + "' is outside the vocabulary");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<std::vector<int32_t>> prompts_field(const ojson& p, const char* key, const text::Tokenizer& tokenizer,
                                                int64_t vocab) {
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

void check_prompt_fits(size_t prompt_tokens, int64_t ctx) {
  if (int64_t(prompt_tokens) >= ctx)
    throw BadRequest("The input (" + std::to_string(prompt_tokens) +
                     " tokens) is longer than the model's context length (" + std::to_string(ctx) + " tokens).");
}

int64_t max_tokens_field(const ojson& j, const char* key, int64_t prompt_len, int64_t fallback, int64_t ctx) {
  int64_t v = int_field(j, key, fallback, 1, int64_t(1) << 40);
  if (v > ctx)
    throw BadRequest(std::string(key) + " (" + std::to_string(v) + ") is too large: the context length is " +
                     std::to_string(ctx) + " tokens");
  return std::min(v, std::max<int64_t>(1, ctx - prompt_len));
}

void check_chat_request(const ojson& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw BadRequest("'messages' must be a non-empty list");
  for (auto& m : body["messages"])
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw BadRequest("every message must be an object with a string 'role'");
  if (body.contains("model") && !body["model"].is_string()) throw BadRequest("'model' must be a string");
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
    std::string name = tc.contains("function") && tc["function"].is_object() ? tc["function"].value("name", "") : "";
    bool found = false;
    if (has_tools)
      for (auto& t : body["tools"])
        if (t.is_object() && t.contains("function") && t["function"].is_object() &&
            t["function"].value("name", "") == name)
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
  p.max_new_tokens = max_new_tokens;
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) throw BadRequest("'seed' must be an integer");
    p.seed = j["seed"].get<uint64_t>();
  } else {
    p.seed = seeds.next();
  }
  return p;
}

}  // namespace dsv4
