// OpenAI-compatible HTTP server with SGLang's native routes, on top of the
// engine and the text layer.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http_server.h"
#include "text/chat_encoder.h"
#include "text/tokenizer.h"

namespace dsv4 {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string served_model_name;
  std::string model_path;
  std::string reasoning_parser;  // "" = from the model's encoder profile
  std::string tool_call_parser;
  uint64_t random_seed = 0;
  bool deterministic = true;
  // Chat prompts: special-token text inside user-controlled content (user and
  // tool messages, assistant history, tool schemas) is encoded as plain text
  // unless this is set (SGLang's behaviour). docs/security-special-tokens.md.
  bool allow_special_tokens_in_content = false;
  int64_t max_request_bytes = 32 << 20;
  // Connections, deadlines and caps of the HTTP transport (its
  // max_body_bytes is max_request_bytes).
  HttpLimits http;
  // Origins whose browser pages may call the API (CORS); "*" for any. Empty:
  // none without an API key, any with one (the key then guards the API).
  std::vector<std::string> allowed_origins;
  double keepalive_seconds = 15.0;  // SSE comment during long silences
  std::string log_level = "info";
  // usage.prompt_tokens_details.cached_tokens and /generate's cached_tokens
  // (SGLang's --enable-cache-report). Off by default: the count tells a client
  // whether another one recently sent the same prompt prefix.
  bool enable_cache_report = false;
  // A prompt + max_tokens past the context length: cut max_tokens to fit
  // (--clamp-max-tokens) instead of answering 400.
  bool clamp_max_tokens = false;
  // The engine runs V4.1 bounded replay: prompt logprobs cannot exist.
  bool bounded_replay = false;
  // Constrained JSON: strings without a maxLength hold at most this many
  // characters (0: unlimited), so a model that never closes one still ends.
  int64_t grammar_max_string_chars = 0;
  // The Responses API's store of finished responses (GET /v1/responses/{id},
  // previous_response_id): at most this many, least recently used evicted
  // first; 0 stores none. The byte budget bounds their JSON text.
  int64_t responses_store_size = 1024;
  int64_t responses_store_bytes = int64_t(256) << 20;
  std::vector<std::string> server_args;  // the command line ("--name=value"), for /get_server_info (secrets redacted)
};

class Server {
 public:
  Server(std::shared_ptr<Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer, text::EncoderProfile profile,
         ServerOptions options);
  ~Server();
  // Binds and serves until stop(); returns false if the port cannot be bound.
  bool run();
  void stop();
  int bound_port() const { return bound_port_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int bound_port_ = 0;
};

}  // namespace dsv4
