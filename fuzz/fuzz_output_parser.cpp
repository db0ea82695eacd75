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
  // The tool-call events in order, a call's consecutive argument fragments
  // merged: any chunking gives those of the text fed in one piece (unless a
  // call fails after its header: a growing string value may then have sent
  // more or less of itself).
  auto add_event = [](std::vector<std::string>& events, const ToolCallDelta& t) {
    const std::string args_event = "args " + std::to_string(t.index) + " ";
    if (t.name) {
      events.push_back("header " + std::to_string(t.index) + " " + *t.name);
    } else if (!events.empty() && events.back().rfind(args_event, 0) == 0) {
      events.back() += t.arguments;
    } else {
      events.push_back(args_event + t.arguments);
    }
  };
  std::vector<std::string> whole_events, events;
  {
    OutputParser one(cfg);
    ParserDelta d = one.feed(raw);
    d.append(one.finish(stop));
    for (const auto& t : d.tool_calls) add_event(whole_events, t);
  }

  OutputParser p(cfg);
  std::string reasoning, content;
  std::map<int, std::string> args;
  auto absorb = [&](const ParserDelta& d) {
    reasoning += d.reasoning_content;
    content += d.content;
    for (const auto& t : d.tool_calls) {
      args[t.index] += t.arguments;
      add_event(events, t);
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
  if (!whole.stream_error) {
    if (events != whole_events) std::abort();
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
