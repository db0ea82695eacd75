// Prompt rendering for DeepSeek-V4 / V4.1 chat requests.
//
// Two layers, because the reference encoders and the serving layer disagree on
// purpose (serving.md §1.3, §1.12):
//   * encode_messages(): a byte-exact native port of the official encoders
//     (encoding_dsv4.py preview and 0731 revisions, V4.1 encoding.py),
//     including their refusals (EncoderError).
//   * render_chat_request(): the serving layer on top (OpenAI request JSON in,
//     prompt out): content-part flattening, tools attached to the system
//     message, thinking / reasoning_effort resolution, continuation, and the
//     SGLang-compatible choices (or vLLM's, for parity tests).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "text/pyjson.h"
#include "text/tokenizer.h"

namespace dsv4::text {

enum class EncoderProfile {
  V4Preview,     // original V4-Flash/-Pro encoder: effort high (no prefix) or max
  V4_0731,       // Flash-0731 encoder: low (default, no prefix) / high / max prefixes
  V41,           // V4.1 official encoder: spaced DSML, numeric effort low=50 high=75 max=100
  V41TierTable,  // V4.1 with the SGLang/vLLM tier table low=25 high=50 xhigh=75 max=100
};

bool is_v41(EncoderProfile p);
std::string_view profile_name(EncoderProfile p);  // "v4_preview", "v4_0731", "v41", "v41_vendored_effort_table"
// Accepts the names above and the CLI spellings "v4", "v4-preview", "v4-0731", "v41".
std::optional<EncoderProfile> parse_profile_name(std::string_view name);

// Chooses the profile the way SGLang picks the encoder: the tool-call parser
// flag first, then config.json's model_type / architectures. `model_dir` (may
// be empty) is inspected for the checkpoint's encoder to tell preview from
// 0731 and the two V4.1 effort tables. Throws std::runtime_error if the config
// is not a DeepSeek-V4 family model.
EncoderProfile select_profile(const ojson& config, std::string_view tool_call_parser = {},
                              const std::string& model_dir = {});

// The request cannot be rendered (the reference encoder refuses it, or the
// serving layer rejects it). The server answers HTTP 400 with what().
class EncoderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Arguments of the reference encode_messages().
struct EncoderInput {
  ojson messages = ojson::array();  // tools attached to messages[0]["tools"]
  bool thinking = false;            // thinking_mode "thinking" vs "chat"
  ojson reasoning_effort;           // null = encoder default; string tier or integer
  bool drop_thinking = true;
  ojson context;  // null or an array of already-rendered messages
  bool add_bos = true;
};

// Byte-exact port of the reference encoder for `profile`. Throws EncoderError.
std::string encode_messages(EncoderProfile profile, const EncoderInput& input);

// The same prompt; also sets `content_spans` (when not null) to the byte ranges
// of the prompt copied from user-controlled fields, in prompt order:
//   * user message content (text, text blocks) and tool results (role `tool`,
//     tool_result blocks), including "[Unsupported <type>]"'s type;
//   * assistant history: reasoning_content, content, tool-call names and
//     argument names and values (model output the client sends back, and may
//     have edited);
//   * tool schemas (tools[].function as JSON) and response_format (data, often
//     from third parties such as MCP servers).
// Not spans: the template's own text and markers, and system / developer /
// latest_reminder content (the deployer's instructions; the model was trained
// with their control tokens matched). V4.1 image placeholders that stand for
// image parts are template text. docs/security-special-tokens.md says why.
// Tokenizer::encode(prompt, content_spans) then keeps control-token strings in
// these ranges as plain text.
std::string encode_messages(EncoderProfile profile, const EncoderInput& input, std::vector<TextSpan>* content_spans);

enum class ServingFlavor {
  SGLang,  // default: thinking off unless asked, lenient effort fallback
  VLLM,    // thinking on by default, vLLM's effort table, request errors on bad effort
};

struct RenderOptions {
  ServingFlavor flavor = ServingFlavor::SGLang;
  // Thinking when the request does not say (SGLANG_DEFAULT_THINKING).
  std::optional<bool> default_thinking;
  // Effort when the request does not say (SGLANG_DSV4_REASONING_EFFORT /
  // SGLANG_DSV41_REASONING_EFFORT); null = the profile's default.
  ojson default_reasoning_effort;
  // Whether a request carrying only `reasoning_effort` turns thinking on;
  // unset = off for V4, on for V4.1 (SGLang).
  std::optional<bool> reasoning_effort_enables_thinking;
  // Serving transformations on top of the reference encoder (serving.md §1.3).
  bool map_developer_to_system = true;     // P4: `developer` is internal to the encoder
  bool hoist_v4_system = true;             // V4 has no system marker: move later system text to the top
  bool trailing_assistant_to_user = true;  // SGLang renders a trailing assistant turn as a user turn
  bool allow_image_parts = false;          // text-only engine: refuse image content parts
  // Drop earlier turns' reasoning when the request does not say
  // (chat_template_kwargs.drop_thinking, else the request's drop_thinking).
  bool drop_thinking = true;
  // Hand reasoning_effort to the encoder unchanged, so the encoder's own
  // validation applies (reference behaviour; used by the golden tests).
  bool pass_effort_through = false;

  // Only the steps that turn a request into the reference encoder's input
  // (flatten content, attach tools); no serving-policy changes.
  static RenderOptions reference();
  static RenderOptions vllm();
  // SGLang defaults overridden by SGLANG_DEFAULT_THINKING and
  // SGLANG_DSV4_REASONING_EFFORT / SGLANG_DSV41_REASONING_EFFORT. Throws
  // std::runtime_error for an invalid value (fail at boot, like SGLang).
  static RenderOptions from_environment(EncoderProfile profile);
};

struct ModeDecision {
  bool thinking = false;
  ojson reasoning_effort;  // as passed to the encoder
  std::vector<std::string> warnings;
};

// How the request's thinking switches and reasoning_effort map to encoder
// arguments (serving.md §1.6.4, §1.7). Throws EncoderError where the flavor
// rejects the value.
ModeDecision resolve_mode(const ojson& request, EncoderProfile profile, const RenderOptions& options);

struct RenderedPrompt {
  std::string prompt;
  // Byte ranges of `prompt` that hold user-controlled content (see
  // encode_messages); give them to Tokenizer::encode(prompt, content_spans) so
  // that special-token text inside them is not tokenized as control tokens.
  std::vector<TextSpan> content_spans;
  EncoderInput encoder_input;
  bool thinking = false;
  // True when the prompt leaves the model inside a think block, i.e. the
  // output parser must start in the reasoning state (serving.md §2.2.1).
  bool starts_in_reasoning = false;
  std::vector<std::string> warnings;
};

// Renders an OpenAI chat-completions request (messages, tools, tool_choice,
// reasoning_effort, chat_template_kwargs, thinking, drop_thinking,
// continue_final_message, add_generation_prompt). Throws EncoderError for requests that cannot be
// rendered; never anything else for well-typed JSON.
RenderedPrompt render_chat_request(const ojson& request, EncoderProfile profile, const RenderOptions& options = {});

// Whether the rendered prompt leaves the model inside reasoning.
bool prompt_starts_in_reasoning(std::string_view prompt);

}  // namespace dsv4::text
