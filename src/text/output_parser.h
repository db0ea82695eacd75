// Turns generated text into an OpenAI chat message: reasoning_content,
// content and DSML tool calls, incrementally (streaming deltas) or at once.
//
// The streaming parser is the only implementation; the non-streaming result is
// the same machine fed the whole text, and the machine only acts on text whose
// meaning can no longer change, so the concatenated deltas equal the
// non-streamed message for every way of cutting the text into chunks.
// A tool call streams as it is parsed: its header (id, name, empty arguments)
// once the invoke tag is complete, then its JSON arguments text: string
// values while they grow, other parameters (and JSON body members) whole, the
// closing '}' with the invoke's close tag; the fragments add up to the
// non-streamed arguments byte for byte.
// Nothing here throws: malformed model output becomes content plus a
// `tool_call_error` (serving.md §2.6).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::text {

enum class ReasoningParserKind { None, DeepSeekV4, DeepSeekV41 };
enum class ToolParserKind { None, DeepSeekV4, DeepSeekV41 };

// "deepseek-v4", "deepseek-v41", "none" ("auto" is resolved by the caller from
// the encoder profile).
std::optional<ReasoningParserKind> parse_reasoning_parser_name(std::string_view name);
// "deepseekv4", "deepseekv41", "none".
std::optional<ToolParserKind> parse_tool_parser_name(std::string_view name);

struct ParserOptions {
  // DSML appearing inside reasoning ends the reasoning (newer SGLang); off =
  // ds4 semantics, where it stays reasoning and is never executed.
  bool dsml_ends_reasoning = true;
  // ds4 tolerance: `<DSML｜tool_calls>` with the leading full-width bar missing.
  bool accept_short_dsml_dialect = true;
  // ds4 tolerance: decode &lt; &gt; &amp; &quot; in names and parameter values.
  bool decode_dsml_entities = false;
  // Calls to tools the request did not declare are executed anyway.
  bool forward_unknown_tools = false;
  // Text after a closed tool-call block is dropped (default) or kept as content.
  bool keep_text_after_tool_calls = false;
  // SGLang `separate_reasoning=false`: everything, tags included, is content.
  bool separate_reasoning = true;
};

struct ParserConfig {
  ReasoningParserKind reasoning = ReasoningParserKind::DeepSeekV4;
  ToolParserKind tools = ToolParserKind::DeepSeekV4;
  // From the rendered prompt (RenderedPrompt::starts_in_reasoning), never from
  // request flags (serving.md §2.2.1).
  bool starts_in_reasoning = false;
  // The request declared tools and tool_choice != "none".
  bool tools_enabled = false;
  std::vector<std::string> tool_names;  // empty: any name is accepted
  ParserOptions options;
  // Seed for tool-call ids; 0 = random. Fixed seeds make tests reproducible.
  uint64_t id_seed = 0;
};

enum class StopReason { Stop, Length, Abort };

struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;    // only in the first delta of a call
  std::optional<std::string> name;  // only in the first delta of a call
  // Fragment of the JSON arguments text: empty in the header; `{"k": v`,
  // then `, "k": v` per parameter (a string value possibly in pieces), then
  // `}` (`{}` for a call without any).
  std::string arguments;
  // The invoke closed: this is the call's last fragment (Anthropic's
  // content_block_stop and the Responses API's .done go out with it).
  bool closes = false;
};

struct ParserDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  void append(ParserDelta&& other);
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParsedMessage {
  std::optional<std::string> reasoning_content;  // nullopt when empty
  std::optional<std::string> content;            // nullopt when empty
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;                   // stop | length | tool_calls | abort
  std::optional<std::string> tool_call_error;  // malformed tool markup
  // A malformed call was detected after a tool-call header had already been
  // streamed: the server must send an SSE error event (serving.md §2.6.3).
  bool stream_error = false;

  // {"reasoning_content", "content", "tool_calls" (OpenAI shape or null),
  //  "finish_reason"} plus "tool_call_error" when set.
  nlohmann::ordered_json to_json() const;
};

class OutputParser {
 public:
  explicit OutputParser(ParserConfig config);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  // Feed the next piece of generated text (EOS text excluded).
  ParserDelta feed(std::string_view text) noexcept;
  // End of generation: flushes held-back text and settles the message.
  ParserDelta finish(StopReason reason) noexcept;
  // The whole message; complete after finish().
  const ParsedMessage& message() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Non-streaming convenience: one feed plus finish.
ParsedMessage parse_output(const ParserConfig& config, std::string_view text, StopReason reason);

}  // namespace dsv4::text
