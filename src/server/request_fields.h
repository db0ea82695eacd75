// Reading the fields of a request body: type and range checks that become
// 400s naming the field, and the sampling parameters the OpenAI and SGLang
// routes build from a body. Kept apart from the routes so that a route only
// says which fields it reads, not how each one is validated.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/http_common.h"
#include "text/tokenizer.h"

namespace dsv4 {

// The body as a JSON object (empty, invalid UTF-8, malformed JSON or not an
// object: 400).
ojson parse_body(const std::string& body);

// The lookups of the converters of other APIs' bodies (Anthropic Messages,
// OpenAI Responses), whose errors name the path of what they reject.
namespace request_json {
// j[key], or null when j is not an object or has no such key.
const ojson& field(const ojson& j, const char* key);
[[noreturn]] void bad(const std::string& message);  // a 400
std::string quoted(const std::string& where);       // 'where'
// j[key] as a string; otherwise 400: 'where.key' must be a string.
std::string string_at(const ojson& j, const char* key, const std::string& where);
}  // namespace request_json

// Absent or null fields give `fallback`.
double number_field(const ojson& j, const char* key, double fallback, double lo, double hi);
int64_t int_field(const ojson& j, const char* key, int64_t fallback, int64_t lo, int64_t hi);
bool bool_field(const ojson& j, const char* key, bool fallback);
// j[key] as a string; absent or null: `fallback`; any other type: 400.
std::string string_field(const ojson& j, const char* key, const std::string& fallback);
// j[key] when it is an object; nullptr when absent or null; any other type: 400.
const ojson* object_field(const ojson& j, const char* key);

// "stream_options": an object or null; returns its include_usage.
bool include_usage_field(const ojson& body);

// "logit_bias" (OpenAI): {token id as a decimal string: bias in [-100, 100]},
// ids inside the vocabulary; returned sorted by token id.
std::vector<std::pair<int32_t, float>> logit_bias_field(const ojson& j, int64_t vocab);

// "response_format": null or an object whose "type" is text, json_object,
// json_schema (with a "json_schema" object) or structural_tag.
void check_response_format(const ojson& body);

// The ids of `count` engine requests from "rid": a string (suffixed -0, -1, ...
// when count > 1), or a list of one string per request; absent or null:
// `fallback` likewise. Any other type, or a list of the wrong length: 400.
std::vector<std::string> rid_field(const ojson& body, size_t count, const std::string& fallback, bool allow_list);

// "stop": a string or a list of at most 16 strings.
std::vector<std::string> stop_field(const ojson& j);

// A list of token ids, each inside the vocabulary.
std::vector<int32_t> id_list(const ojson& v, const char* what, int64_t vocab);

// A prompt field: a string, a list of strings, token ids or lists of token
// ids; one tokenized prompt per entry, none empty.
enum class PromptKind { Any, Text, Ids };
std::vector<std::vector<int32_t>> prompts_field(const ojson& p, const char* key, const text::Tokenizer& tokenizer,
                                                int64_t vocab, PromptKind kind = PromptKind::Any);

// 400 when a prompt leaves no room to generate in a context of `ctx` tokens.

// The completion length asked in j[key] (`given` says whether it was), or
// `fallback`. Whether it fits after the prompt is validate_request's call
// (engine/validate.h): asked for and too long is a 400 (as SGLang and vLLM
// answer) unless --clamp-max-tokens; a fallback is cut to fit.
int64_t max_tokens_field(const ojson& j, const char* key, int64_t fallback, bool* given);

// The types of everything a chat request's rendering and parsing read:
// "messages" (roles, content and its parts, name, tool_calls, tool_call_id,
// reasoning_content), "model", "tools", "chat_template_kwargs",
// "add_generation_prompt", "continue_final_message", "separate_reasoning",
// "drop_thinking", "response_format". A wrong type is a 400 naming the field.
void check_chat_request(const ojson& body);
// "tools" and "tool_choice": a forced function must be one of the tools.
void check_tool_choice(const ojson& body);

// Where a request without a "seed" gets its seed from.
class SeedSource {
 public:
  SeedSource(bool deterministic, uint64_t random_seed) : deterministic_(deterministic), random_seed_(random_seed) {}
  uint64_t next();

 private:
  bool deterministic_;
  uint64_t random_seed_;
  std::atomic<uint64_t> counter_{0};
};

// Sampling parameters common to the OpenAI routes (SGLang's sampling_params
// use the same names), logit_bias included.
SamplingParams sampling_field(const ojson& j, int64_t max_new_tokens, int64_t vocab, SeedSource& seeds);

}  // namespace dsv4
