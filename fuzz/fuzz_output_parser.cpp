// Output-parser fuzz target (both DSML dialects, every option). Properties:
// no exception or sanitizer report; the streamed deltas, for a chunking chosen
// by the input, concatenate to the non-streamed message; tool-call arguments
// are always JSON objects; no delta splits a UTF-8 sequence of valid input.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/output_parser.h"
#include "text/utf8.h"

using namespace dsv4::text;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  const uint8_t chunk_seed = data[1];
  const std::string raw(reinterpret_cast<const char*>(data + 2), size - 2);

  ParserConfig cfg;
  const bool v41 = flags & 1;
  cfg.reasoning = v41 ? ReasoningParserKind::DeepSeekV41 : ReasoningParserKind::DeepSeekV4;
  cfg.tools = v41 ? ToolParserKind::DeepSeekV41 : ToolParserKind::DeepSeekV4;
  cfg.starts_in_reasoning = flags & 2;
  cfg.tools_enabled = flags & 4;
  cfg.options.dsml_ends_reasoning = flags & 8;
  cfg.options.accept_short_dsml_dialect = flags & 16;
  cfg.options.decode_dsml_entities = flags & 32;
  cfg.options.keep_text_after_tool_calls = flags & 64;
  if (flags & 128) cfg.tool_names = {"ls", "bash", "get_weather"};
  cfg.id_seed = 1;
  const StopReason stop = (chunk_seed & 1) ? StopReason::Length : StopReason::Stop;

  const ParsedMessage whole = parse_output(cfg, raw, stop);
  // Each call's argument fragments of the text fed in one piece: a call
  // streams a parameter at a time, so any chunking gives the same ones.
  std::map<int, std::vector<std::string>> whole_fragments, fragments;
  {
    OutputParser one(cfg);
    ParserDelta d = one.feed(raw);
    d.append(one.finish(stop));
    for (const auto& t : d.tool_calls) whole_fragments[t.index].push_back(t.arguments);
  }

  OutputParser p(cfg);
  std::string reasoning, content;
  std::map<int, std::string> args;
  auto absorb = [&](const ParserDelta& d) {
    reasoning += d.reasoning_content;
    content += d.content;
    for (const auto& t : d.tool_calls) {
      args[t.index] += t.arguments;
      fragments[t.index].push_back(t.arguments);
    }
  };
  uint32_t state = chunk_seed * 2654435761u + 1;
  for (size_t i = 0; i < raw.size();) {
    state = state * 1103515245u + 12345u;
    const size_t n = 1 + (state >> 16) % 13;
    absorb(p.feed(std::string_view(raw).substr(i, n)));
    i += n;
  }
  absorb(p.finish(stop));
  const ParsedMessage& m = p.message();

  if (m.content != whole.content || m.reasoning_content != whole.reasoning_content ||
      m.finish_reason != whole.finish_reason || m.tool_calls.size() != whole.tool_calls.size() ||
      m.tool_call_error != whole.tool_call_error) {
    std::abort();
  }
  if (content != whole.content.value_or("") || reasoning != whole.reasoning_content.value_or("")) std::abort();
  if (fragments != whole_fragments) std::abort();
  if (!whole.stream_error) {
    for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
      if (args[static_cast<int>(i)] != whole.tool_calls[i].arguments) std::abort();
    }
  }
  for (const auto& tc : whole.tool_calls) {
    const auto j = nlohmann::json::parse(tc.arguments, nullptr, false);
    if (j.is_discarded() || !j.is_object()) std::abort();
    if (!utf8::is_valid(tc.name)) std::abort();
  }
  if (utf8::is_valid(raw)) {
    if (whole.content && !utf8::is_valid(*whole.content)) std::abort();
    if (whole.reasoning_content && !utf8::is_valid(*whole.reasoning_content)) std::abort();
  }
  (void)whole.to_json().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return 0;
}
