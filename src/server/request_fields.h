// Reading the fields of a request body: type and range checks that become
// 400s naming the field, and the sampling parameters the OpenAI and SGLang
// routes build from a body. Kept apart from the routes so that a route only
// says which fields it reads, not how each one is validated.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http_common.h"
#include "text/tokenizer.h"

namespace dsv4 {

// The body as a JSON object (empty, invalid UTF-8, malformed JSON or not an
// object: 400).
ojson parse_body(const std::string& body);

// Absent or null fields give `fallback`.
double number_field(const ojson& j, const char* key, double fallback, double lo, double hi);
int64_t int_field(const ojson& j, const char* key, int64_t fallback, int64_t lo, int64_t hi);
bool bool_field(const ojson& j, const char* key, bool fallback);
// j[key] if it is a string, else `fallback` (request ids: any other type is ignored).
std::string string_or(const ojson& j, const char* key, const std::string& fallback);

// "stop": a string or a list of at most 16 strings.
std::vector<std::string> stop_field(const ojson& j);

// A list of token ids, each inside the vocabulary.
std::vector<int32_t> id_list(const ojson& v, const char* what, int64_t vocab);

// A prompt field: a string, a list of strings, token ids or lists of token
// ids; one tokenized prompt per entry, none empty.
std::vector<std::vector<int32_t>> prompts_field(const ojson& p, const char* key, const text::Tokenizer& tokenizer,
                                                int64_t vocab);

// 400 when a prompt leaves no room to generate in a context of `ctx` tokens.
void check_prompt_fits(size_t prompt_tokens, int64_t ctx);

// The completion length asked in j[key] (or `fallback`), refused when above
// the context length and cut to what the context leaves after the prompt.
int64_t max_tokens_field(const ojson& j, const char* key, int64_t prompt_len, int64_t fallback, int64_t ctx);

// "messages" and "model" of a chat request.
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
// use the same names).
SamplingParams sampling_field(const ojson& j, int64_t max_new_tokens, int64_t vocab, SeedSource& seeds);

}  // namespace dsv4
