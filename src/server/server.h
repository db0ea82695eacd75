// OpenAI-compatible HTTP server with SGLang's native routes, on top of the
// engine and the text layer.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
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
  int http_threads = 256;
  double keepalive_seconds = 15.0;
  std::string log_level = "info";
  std::vector<std::string> server_args;  // the command line, for /get_server_info
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
