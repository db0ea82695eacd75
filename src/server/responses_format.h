// OpenAI's Responses API on top of the chat layer: a /v1/responses body
// becomes the chat-completions request the renderer and the output parser
// already read (as anthropic_format.h does for the Messages API), and the
// parsed answer becomes the Response object's output items. The routes and
// the typed stream are in responses_routes.cpp; the store of finished
// responses in responses_store.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "server/http_common.h"
#include "text/output_parser.h"

namespace dsv4 {

struct ResponsesRequest {
  // The equivalent chat-completions body without its messages: tools,
  // tool_choice, parallel_tool_calls, reasoning_effort, response_format,
  // drop_thinking. chat_body() adds the messages.
  ojson chat = ojson::object();
  // This request's input as chat messages (user, system, developer,
  // assistant with reasoning_content / tool_calls, tool).
  ojson input_messages = ojson::array();
  std::optional<std::string> instructions;
  std::string previous_response_id;  // empty: none
  // The sampling fields (temperature, top_p) for sampling_field().
  ojson sampling = ojson::object();
  int64_t max_output_tokens = 0;  // 0: not given (what the context leaves)
  std::string model;              // empty when the request names none
  bool stream = false;
  bool store = true;
  // The request fields a Response object repeats (instructions, metadata,
  // tools, tool_choice, reasoning, text, ...), in the API's shapes.
  ojson echo = ojson::object();
};

// Reads and checks a create request (a 400 naming the field otherwise):
//   * input: a string (one user message) or a list of items: messages
//     (role user / system / developer with input_text parts, assistant with
//     output_text / refusal parts), function_call, function_call_output and
//     reasoning items (reasoning sent back keeps the history's reasoning:
//     drop_thinking false). Images, files and audio are refused (a text-only
//     model), and so are hosted tools' items and item references;
//   * instructions; previous_response_id (resolved by the route);
//   * tools (function tools in the flat shape) and tool_choice
//     (none / auto / required / {"type": "function", "name"});
//   * reasoning.effort (as the chat route's reasoning_effort), text.format
//     (text, json_object, json_schema: the chat route's response_format);
//   * max_output_tokens, temperature, top_p, parallel_tool_calls, metadata,
//     store, stream, include, truncation ("disabled"), user; background,
//     conversation, prompt and top_logprobs are refused as unsupported.
ResponsesRequest responses_request(const ojson& body);

// The chat request of `r` after `history` (the chat messages of the response
// it continues; an empty list when none): instructions first as a system
// message, then the history, then this request's input.
ojson responses_chat_body(const ResponsesRequest& r, const ojson& history);

// Output items, as both the whole answer and the stream build them.
ojson reasoning_item(const std::string& id, const std::string& text, const std::string& status);
ojson message_item(const std::string& id, const std::string& text, const std::string& status);
ojson function_call_item(const std::string& id, const std::string& call_id, const std::string& name,
                         const std::string& arguments, const std::string& status);

// The output items of a parsed answer: reasoning, message, function calls.
// `status` is "completed" or "incomplete" (cut by max_output_tokens).
ojson output_items(const text::ParsedMessage& msg, const std::string& status);

// The assistant chat message that output items stand for: the turn a
// continuation (previous_response_id) puts into its history.
ojson assistant_message(const ojson& items);

ojson responses_usage(int64_t input, int64_t output, int64_t cached, int64_t reasoning);

// The Response object: `r.echo`'s fields around the id, status, output and
// usage. `status` in_progress / completed / incomplete / failed / cancelled;
// incomplete carries incomplete_details {reason: max_output_tokens}, failed
// an error {code, message}.
ojson response_object(const ResponsesRequest& r, const std::string& id, int64_t created_at, const std::string& status,
                      ojson output, ojson usage, const std::string& error_message = "");

}  // namespace dsv4
