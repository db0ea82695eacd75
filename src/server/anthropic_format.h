// Anthropic's Messages API on top of the chat layer: a /v1/messages body
// becomes the chat-completions request the renderer and the output parser
// already read, and errors take Anthropic's shape. The routes themselves are
// in anthropic_routes.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/http_common.h"

namespace dsv4 {

struct AnthropicRequest {
  // The equivalent chat-completions body: messages (system first), tools,
  // tool_choice, thinking, drop_thinking, continue_final_message.
  ojson chat;
  // The sampling fields (temperature, top_p, top_k) for sampling_field().
  ojson sampling = ojson::object();
  std::vector<std::string> stop_sequences;
  int64_t max_tokens = 0;  // required by /v1/messages, unused by count_tokens
  std::string model;       // empty when the request names none
  bool stream = false;
};

// Reads and checks a Messages request (a 400 naming the field otherwise):
//   * system: a string or text blocks;
//   * messages: user / assistant turns whose content is a string or blocks:
//     text, tool_use (assistant), tool_result (user; string or text-block
//     content), thinking / redacted_thinking (assistant; thinking blocks sent
//     back keep the history's reasoning: drop_thinking false). Image and
//     document blocks are refused (a text-only model);
//   * tools {name, description, input_schema} and tool_choice
//     auto / any / tool / none (the chat route's auto / required / named /
//     none);
//   * thinking {"type": "enabled", "budget_tokens": N} / {"type": "disabled"};
//   * stop_sequences, max_tokens (unless `count_only`), temperature, top_p,
//     top_k; metadata is ignored.
// A final assistant turn is a prefill: the answer continues it.
AnthropicRequest anthropic_request(const ojson& body, bool count_only);

// {"type": "error", "error": {"type": ..., "message": ...}}, the type from the
// HTTP status (invalid_request_error, authentication_error, not_found_error,
// request_too_large, overloaded_error, api_error, ...).
ojson anthropic_error_body(int status, const std::string& message);
void send_anthropic_error(HttpResponse& res, int status, const std::string& message);

// The routes answered in Anthropic's error shape.
bool is_anthropic_path(const std::string& path);

}  // namespace dsv4
