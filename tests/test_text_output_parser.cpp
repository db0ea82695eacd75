// Output-parsing goldens (tests/data/text/parsing/cases) and the streaming
// property: every chunking of the generated text yields deltas whose
// concatenation equals the non-streamed message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "text/output_parser.h"

using namespace dsv4::text;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::vector<json> load_cases() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(DSV4_TEST_DATA) / "text" / "parsing" / "cases")) {
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<json> out;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(json::parse(ss.str()));
  }
  return out;
}

const std::vector<json>& cases() {
  static const auto c = load_cases();
  return c;
}

ParserConfig config_for(const json& c, const std::string& alternative = {}) {
  ParserConfig cfg;
  const bool v41 = c.at("dialect") == "v41";
  cfg.reasoning = v41 ? ReasoningParserKind::DeepSeekV41 : ReasoningParserKind::DeepSeekV4;
  cfg.tools = v41 ? ToolParserKind::DeepSeekV41 : ToolParserKind::DeepSeekV4;
  cfg.starts_in_reasoning = c.at("prompt_ends_with") == "<think>";
  cfg.tools_enabled = c.value("tools_enabled", false);
  if (c.contains("tools")) cfg.tool_names = c["tools"].get<std::vector<std::string>>();
  cfg.id_seed = 7;
  if (c.contains("settings")) {
    const auto& s = c["settings"];
    cfg.options.dsml_ends_reasoning = s.value("dsml_ends_reasoning", cfg.options.dsml_ends_reasoning);
    cfg.options.accept_short_dsml_dialect = s.value("accept_short_dsml_dialect", cfg.options.accept_short_dsml_dialect);
    cfg.options.decode_dsml_entities = s.value("decode_dsml_entities", cfg.options.decode_dsml_entities);
    cfg.options.forward_unknown_tools = s.value("forward_unknown_tools", cfg.options.forward_unknown_tools);
  }
  if (alternative.find("short dialect not accepted") != std::string::npos)
    cfg.options.accept_short_dsml_dialect = false;
  if (alternative.find("dsml_ends_reasoning=false") != std::string::npos) cfg.options.dsml_ends_reasoning = false;
  if (alternative.find("append trailing text") != std::string::npos) cfg.options.keep_text_after_tool_calls = true;
  if (alternative.find("forward-unknown-tools") != std::string::npos) cfg.options.forward_unknown_tools = true;
  return cfg;
}

StopReason stop_of(const json& c) { return c.value("stop", "eos") == "length" ? StopReason::Length : StopReason::Stop; }

json opt(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

void expect_message(const ParsedMessage& m, const json& e, const std::string& what) {
  EXPECT_EQ(opt(m.reasoning_content), e.at("reasoning_content")) << what;
  EXPECT_EQ(opt(m.content), e.at("content")) << what;
  EXPECT_EQ(m.finish_reason, e.at("finish_reason").get<std::string>()) << what;
  if (e.at("tool_calls").is_null()) {
    EXPECT_TRUE(m.tool_calls.empty()) << what;
  } else {
    ASSERT_EQ(m.tool_calls.size(), e["tool_calls"].size()) << what;
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      EXPECT_EQ(m.tool_calls[i].name, e["tool_calls"][i]["name"].get<std::string>()) << what;
      json args;
      ASSERT_NO_THROW(args = json::parse(m.tool_calls[i].arguments)) << what << ": " << m.tool_calls[i].arguments;
      EXPECT_EQ(args, e["tool_calls"][i]["arguments"]) << what;
      EXPECT_EQ(m.tool_calls[i].id.rfind("call_", 0), 0u);
      EXPECT_EQ(m.tool_calls[i].id.size(), 29u);
    }
  }
  EXPECT_EQ(m.tool_call_error.has_value(), e.contains("tool_call_error")) << what;
}

bool has_markup(const std::string& s) {
  return s.find("｜DSML｜") != std::string::npos || s.find("DSML｜") != std::string::npos ||
         s.find("<think>") != std::string::npos || s.find("</think>") != std::string::npos;
}

struct StreamResult {
  std::string reasoning, content;
  std::map<int, std::string> args;
  std::map<int, std::string> names;
  // The tool-call events in order, a call's consecutive argument fragments
  // merged ("header 0 name", "args 0 {...}"): the same for every chunking.
  std::vector<std::string> events;
  // Each call's non-empty argument fragments.
  std::map<int, std::vector<std::string>> fragments;
  // Every header carries empty arguments (the server sends `"arguments": ""`).
  bool headers_without_arguments = true;
  ParsedMessage message;
  bool headers_ok = true;
  bool fragments_clean = true;
};

StreamResult run_stream(const ParserConfig& cfg, const std::vector<std::string>& chunks, StopReason stop) {
  OutputParser p(cfg);
  StreamResult r;
  auto absorb = [&](const ParserDelta& d) {
    r.reasoning += d.reasoning_content;
    r.content += d.content;
    if (has_markup(d.reasoning_content) || has_markup(d.content)) r.fragments_clean = false;
    for (const auto& t : d.tool_calls) {
      if (t.name) {
        if (r.names.count(t.index) || !t.id) r.headers_ok = false;
        r.names[t.index] = *t.name;
      } else if (!r.names.count(t.index)) {
        r.headers_ok = false;  // argument fragment before the header
      }
      if (t.name && !t.arguments.empty()) r.headers_without_arguments = false;
      r.args[t.index] += t.arguments;
      if (!t.arguments.empty()) r.fragments[t.index].push_back(t.arguments);
      const std::string args_event = "args " + std::to_string(t.index) + " ";
      if (t.name) {
        r.events.push_back("header " + std::to_string(t.index) + " " + *t.name);
      } else if (!t.arguments.empty() && !r.events.empty() && r.events.back().rfind(args_event, 0) == 0) {
        r.events.back() += t.arguments;
      } else if (!t.arguments.empty()) {
        r.events.push_back(args_event + t.arguments);
      }
    }
  };
  for (const auto& c : chunks) absorb(p.feed(c));
  absorb(p.finish(stop));
  r.message = p.message();
  return r;
}

std::vector<std::string> chunk(const std::string& s, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size(); i += n) out.push_back(s.substr(i, n));
  return out;
}

void check_stream_equals(const ParserConfig& cfg, const std::string& raw, StopReason stop, const ParsedMessage& whole,
                         const std::vector<std::string>& chunks, const std::string& what) {
  const auto r = run_stream(cfg, chunks, stop);
  // The whole text in one piece: the reference sequence of events.
  const auto reference = run_stream(cfg, {raw}, stop);
  EXPECT_EQ(r.names, reference.names) << what;
  if (whole.stream_error) {
    // A call that failed after its header went out may have sent more or
    // less of a growing string value, depending on the cuts: one of the two
    // argument texts is a prefix of the other.
    for (const auto& [index, text] : reference.args) {
      const std::string got = r.args.count(index) ? r.args.at(index) : "";
      EXPECT_TRUE(got.rfind(text, 0) == 0 || text.rfind(got, 0) == 0) << what << ": " << got << " / " << text;
    }
  } else {
    EXPECT_EQ(r.events, reference.events) << what;
  }
  EXPECT_TRUE(r.headers_without_arguments) << what;
  EXPECT_EQ(opt(r.message.reasoning_content), opt(whole.reasoning_content)) << what;
  EXPECT_EQ(opt(r.message.content), opt(whole.content)) << what;
  EXPECT_EQ(r.message.finish_reason, whole.finish_reason) << what;
  EXPECT_EQ(r.message.tool_call_error, whole.tool_call_error) << what;
  ASSERT_EQ(r.message.tool_calls.size(), whole.tool_calls.size()) << what;
  EXPECT_EQ(r.reasoning, whole.reasoning_content.value_or("")) << what;
  EXPECT_EQ(r.content, whole.content.value_or("")) << what;
  EXPECT_EQ(r.message.stream_error, whole.stream_error) << what;
  if (!whole.stream_error) {
    for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
      EXPECT_EQ(r.names.at(static_cast<int>(i)), whole.tool_calls[i].name) << what;
      EXPECT_EQ(r.args.at(static_cast<int>(i)), whole.tool_calls[i].arguments) << what;
    }
  }
  EXPECT_TRUE(r.headers_ok) << what;
  const bool expected_markup =
      has_markup(whole.content.value_or("")) || has_markup(whole.reasoning_content.value_or(""));
  if (!expected_markup) {
    EXPECT_TRUE(r.fragments_clean) << what;
  }
}

}  // namespace

TEST(TextOutputParser, GoldenCases) {
  int passed = 0;
  for (const auto& c : cases()) {
    const std::string id = c["id"];
    const auto m = parse_output(config_for(c), c["raw"].get<std::string>(), stop_of(c));
    const int failures_before = ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    expect_message(m, c["expected"], id);
    if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() == failures_before)
      ++passed;
    // The exact text of the official parser where it produced valid JSON.
    if (c.contains("official_parser") && c["official_parser"].contains("result") && !m.tool_calls.empty()) {
      const auto& off = c["official_parser"]["result"]["tool_calls"];
      for (size_t i = 0; i < off.size() && i < m.tool_calls.size(); ++i) {
        const std::string text = off[i].value("arguments_text", "");
        if (json::accept(text)) {
          EXPECT_EQ(m.tool_calls[i].arguments, text) << id;
        }
      }
    }
  }
  std::printf("parsing goldens: %d/%zu\n", passed, cases().size());
}

TEST(TextOutputParser, PolicyAlternatives) {
  for (const auto& c : cases()) {
    if (!c.contains("alternatives")) continue;
    for (auto it = c["alternatives"].begin(); it != c["alternatives"].end(); ++it) {
      if (it.key().find("strict") != std::string::npos) continue;  // strict SGLang detector: not offered
      const auto m = parse_output(config_for(c, it.key()), c["raw"].get<std::string>(), stop_of(c));
      expect_message(m, it.value(), c["id"].get<std::string>() + " / " + it.key());
    }
  }
}

// Chunk sizes used upstream, plus every two-piece split and a random chunking.
TEST(TextOutputParser, StreamingEqualsNonStreamingForEveryChunking) {
  std::mt19937 rng(42);
  for (const auto& c : cases()) {
    const std::string id = c["id"];
    const std::string raw = c["raw"];
    const auto cfg = config_for(c);
    const auto whole = parse_output(cfg, raw, stop_of(c));
    for (size_t n : {1, 2, 3, 5, 7, 11, 23, 1000}) {
      check_stream_equals(cfg, raw, stop_of(c), whole, chunk(raw, n), id + " chunk " + std::to_string(n));
    }
    for (size_t split = 1; split < raw.size(); ++split) {
      check_stream_equals(cfg, raw, stop_of(c), whole, {raw.substr(0, split), raw.substr(split)},
                          id + " split " + std::to_string(split));
    }
    for (int round = 0; round < 20; ++round) {
      std::vector<std::string> chunks;
      for (size_t i = 0; i < raw.size();) {
        const size_t n = 1 + rng() % 9;
        chunks.push_back(raw.substr(i, n));
        i += n;
      }
      check_stream_equals(cfg, raw, stop_of(c), whole, chunks, id + " random");
    }
  }
}

TEST(TextOutputParser, ThinkTagsInsideToolArgumentsAreData) {
  ParserConfig cfg;
  cfg.starts_in_reasoning = true;
  cfg.tools_enabled = true;
  const std::string raw =
      "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"edit\">\n<｜DSML｜parameter name=\"text\" "
      "string=\"true\">a <think> b </think> c</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto m = parse_output(cfg, raw, StopReason::Stop);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(m.tool_calls[0].arguments)["text"], "a <think> b </think> c");
  EXPECT_EQ(m.finish_reason, "tool_calls");
}

// Found by fuzz_output_parser: a NUL ends nlohmann's input, so a value of
// "null" + NUL + junk passed as JSON and was spliced in, breaking the
// arguments object.
TEST(TextOutputParser, NonStringValueWithNulByteStaysAString) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  const std::string value = std::string("null") + '\0' + "junk";
  const std::string raw =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"note\" "
      "string=\"false\">" +
      value + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto m = parse_output(cfg, raw, StopReason::Stop);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  const auto args = json::parse(m.tool_calls[0].arguments, nullptr, false);
  ASSERT_TRUE(args.is_object()) << m.tool_calls[0].arguments;
  EXPECT_EQ(args["note"], value);
}

TEST(TextOutputParser, JsonBodyAndImplicitWrapper) {
  ParserConfig cfg;
  cfg.reasoning = ReasoningParserKind::DeepSeekV41;
  cfg.tools = ToolParserKind::DeepSeekV41;
  cfg.tools_enabled = true;
  auto m = parse_output(cfg,
                        "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">{\"a\": [1, 2], \"b\": \"x\"}</｜DSML｜ "
                        "invoke>\n</｜DSML｜ calls>",
                        StopReason::Stop);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": [1, 2], \"b\": \"x\"}");
  m = parse_output(cfg,
                   "ok\n\n<｜DSML｜ invoke name=\"g\">\n<｜DSML｜ parameter name=\"k\" string=\"false\">3</｜DSML｜ "
                   "parameter>\n</｜DSML｜ invoke>",
                   StopReason::Stop);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content.value_or(""), "ok");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"k\": 3}");
}

TEST(TextOutputParser, FailureAfterHeaderIsAStreamError) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  cfg.tool_names = {"ok"};
  const std::string raw =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ok\">\n</｜DSML｜invoke>\n<｜DSML｜invoke "
      "name=\"bad\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto m = parse_output(cfg, raw, StopReason::Stop);
  EXPECT_TRUE(m.stream_error);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content.value_or(""), raw);
  EXPECT_EQ(m.finish_reason, "stop");
  EXPECT_EQ(m.tool_call_error.value_or(""), "unknown tool");
}

TEST(TextOutputParser, SeparateReasoningOffKeepsEverything) {
  ParserConfig cfg;
  cfg.starts_in_reasoning = true;
  cfg.options.separate_reasoning = false;
  const auto m = parse_output(cfg, "a</think>b", StopReason::Stop);
  EXPECT_EQ(m.content.value_or(""), "a</think>b");
  EXPECT_FALSE(m.reasoning_content.has_value());
}

TEST(TextOutputParser, ToJsonShape) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  cfg.id_seed = 1;
  const auto m = parse_output(
      cfg, "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ls\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      StopReason::Stop);
  const auto j = m.to_json();
  EXPECT_TRUE(j["reasoning_content"].is_null());
  EXPECT_TRUE(j["content"].is_null());
  EXPECT_EQ(j["tool_calls"][0]["type"], "function");
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "ls");
  EXPECT_EQ(j["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(j["finish_reason"], "tool_calls");
}

// Regressions found by fuzz_output_parser: a split inside the second invoke
// opener of an unwrapped block, and kept text after an unwrapped block.
TEST(TextOutputParser, ImplicitWrapperEveryChunkingRegression) {
  const std::string raw =
      "ok\n\n<｜DSML｜invoke name=\"ls\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"bad\">\n<x</｜DSML｜invoke>\ntail "
      "<think>t</think> end";
  for (bool keep : {false, true}) {
    ParserConfig cfg;
    cfg.tools_enabled = true;
    cfg.options.keep_text_after_tool_calls = keep;
    cfg.id_seed = 3;
    const auto whole = parse_output(cfg, raw, StopReason::Stop);
    for (size_t split = 1; split < raw.size(); ++split) {
      check_stream_equals(cfg, raw, StopReason::Stop, whole, {raw.substr(0, split), raw.substr(split)},
                          "split " + std::to_string(split) + (keep ? " keep" : ""));
    }
    for (size_t n : {1, 2, 3, 5, 7}) check_stream_equals(cfg, raw, StopReason::Stop, whole, chunk(raw, n), "chunks");
  }
}

// Arguments stream a parameter at a time: the header goes out as soon as the
// invoke tag is complete, each parameter when it closes, the '}' with the
// invoke's close tag; the fragments add up to the non-streamed arguments.
TEST(TextOutputParser, ArgumentsStreamPerParameter) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  cfg.id_seed = 5;
  const std::string head = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"edit\">";
  const std::string first = "\n<｜DSML｜parameter name=\"path\" string=\"true\">a \"b\"\n</｜DSML｜parameter>";
  const std::string second = "\n<｜DSML｜parameter name=\"n\" string=\"false\">[1,  2]</｜DSML｜parameter>";
  const std::string third = "\n<｜DSML｜parameter name=\"t\" string=\"true\">é 😀</｜DSML｜parameter>";
  const std::string tail = "\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  OutputParser parser(cfg);
  ParserDelta d = parser.feed(head);
  EXPECT_EQ(d.content, "Sure.");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name.value_or(""), "edit");
  EXPECT_TRUE(d.tool_calls[0].id.has_value());
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  std::vector<std::string> fragments;
  for (const std::string& part : {first, second, third, tail}) {
    d = parser.feed(part);
    ASSERT_EQ(d.tool_calls.size(), 1u) << part;
    EXPECT_FALSE(d.tool_calls[0].name.has_value());
    EXPECT_EQ(d.tool_calls[0].index, 0);
    fragments.push_back(d.tool_calls[0].arguments);
  }
  EXPECT_TRUE(parser.finish(StopReason::Stop).empty());
  const std::vector<std::string> expected = {"{\"path\": \"a \\\"b\\\"\\n\"", ", \"n\": [1,  2]", ", \"t\": \"é 😀\"",
                                             "}"};
  EXPECT_EQ(fragments, expected);
  const ParsedMessage whole = parse_output(cfg, head + first + second + third + tail, StopReason::Stop);
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].arguments, expected[0] + expected[1] + expected[2] + expected[3]);
  EXPECT_EQ(parser.message().tool_calls[0].arguments, whole.tool_calls[0].arguments);
  EXPECT_EQ(parser.message().tool_calls[0].id, whole.tool_calls[0].id);
}

// A JSON object body (what constrained tool calls write) streams a top-level
// member at a time, in the Python-style formatting of the whole dump.
TEST(TextOutputParser, JsonBodyStreamsPerMember) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  const std::string raw =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n{\"a\":[1,{\"x\":\"}],\"}],\"b\" : \"c,}\" ,\"n\":1.5}\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">{ }</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto r = run_stream(cfg, chunk(raw, 1), StopReason::Stop);
  const std::vector<std::string> call_f = {"{\"a\": [1, {\"x\": \"}],\"}]", ", \"b\": \"c,}\"", ", \"n\": 1.5", "}"};
  const std::vector<std::string> call_g = {"{}"};
  EXPECT_EQ(r.fragments.at(0), call_f);
  EXPECT_EQ(r.fragments.at(1), call_g);
  const auto whole = parse_output(cfg, raw, StopReason::Stop);
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0].arguments, r.args.at(0));
  EXPECT_EQ(whole.tool_calls[1].arguments, "{}");
  for (size_t split = 1; split < raw.size(); ++split)
    check_stream_equals(cfg, raw, StopReason::Stop, whole, {raw.substr(0, split), raw.substr(split)},
                        "json body split " + std::to_string(split));
}

// Once a header is out the call cannot be retracted: a call cut off by
// max_tokens, a malformed member or a repeated key ends the stream with an
// error (stream_error), and the non-streamed view is the raw text.
TEST(TextOutputParser, FailureInsideAStreamedCall) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  const std::string open = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n";
  for (const std::string& body :
       {std::string("<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>"),
        std::string("{\"a\": 1, \"a\": 2}\n</｜DSML｜invoke>"), std::string("{\"a\": 1,, \"b\": 2}\n</｜DSML｜invoke>"),
        std::string("{\"a\": 1} x\n</｜DSML｜invoke>"),
        // Found by fuzz_output_parser: a repeated name in an unclosed value
        // fails for the value, whatever the chunking.
        std::string("<｜DSML｜parameter name=\"a\">x</｜DSML｜parameter><｜DSML｜parameter name=\"a\" "
                    "string=\"true\">y\n</｜DSML｜tool_calls>")}) {
    const std::string raw = open + body;
    const auto whole = parse_output(cfg, raw, StopReason::Length);
    EXPECT_TRUE(whole.stream_error) << body;
    EXPECT_TRUE(whole.tool_calls.empty()) << body;
    EXPECT_EQ(whole.content.value_or(""), raw) << body;
    EXPECT_EQ(whole.finish_reason, "length") << body;
    for (size_t n : {1, 2, 3, 7}) check_stream_equals(cfg, raw, StopReason::Length, whole, chunk(raw, n), body);
  }
  // A failure before the header (an unknown tool) is no stream error: the
  // text is content and the stream goes on.
  cfg.tool_names = {"g"};
  const auto unknown = parse_output(cfg, open + "</｜DSML｜invoke>", StopReason::Stop);
  EXPECT_FALSE(unknown.stream_error);
  EXPECT_EQ(unknown.tool_call_error.value_or(""), "unknown tool");
}

// An attribute that never closes: the tag is malformed once longer than the
// parser waits for, whatever the chunking.
TEST(TextOutputParser, OverlongTagFails) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  const std::string raw = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"" + std::string(5000, 'x') + "\n";
  const auto whole = parse_output(cfg, raw, StopReason::Stop);
  EXPECT_EQ(whole.tool_call_error.value_or(""), "invalid tool call");
  EXPECT_FALSE(whole.stream_error);
  EXPECT_EQ(whole.content.value_or(""), raw);
  for (size_t n : {1, 7, 4096}) check_stream_equals(cfg, raw, StopReason::Stop, whole, chunk(raw, n), "overlong");
}

// A string value streams while it grows, never sending a byte it may have to
// take back: not the start of what may be a close tag, nor half a UTF-8
// character; the value's quote goes out with its close tag.
TEST(TextOutputParser, GrowingStringValueStreams) {
  ParserConfig cfg;
  cfg.tools_enabled = true;
  const std::string value = "ab </｜DSML｜para x é😀\n\"q\"";
  const std::string raw =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"w\">\n<｜DSML｜parameter name=\"text\" string=\"true\">" +
      value + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto whole = parse_output(cfg, raw, StopReason::Stop);
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(whole.tool_calls[0].arguments)["text"], value);
  const auto r = run_stream(cfg, chunk(raw, 1), StopReason::Stop);
  const auto& fragments = r.fragments.at(0);
  ASSERT_GT(fragments.size(), 10u);
  EXPECT_EQ(fragments.front(), "{\"text\": \"");
  EXPECT_EQ(fragments[fragments.size() - 2], "\"");
  EXPECT_EQ(fragments.back(), "}");
  for (const auto& f : fragments) {
    EXPECT_TRUE(f.find("\xf0\x9f") == std::string::npos || f.find("😀") != std::string::npos) << f;
    EXPECT_EQ(f.find("</｜DSML｜parameter"), std::string::npos) << f;
  }
  EXPECT_EQ(r.args.at(0), whole.tool_calls[0].arguments);
  for (size_t split = 1; split < raw.size(); ++split)
    check_stream_equals(cfg, raw, StopReason::Stop, whole, {raw.substr(0, split), raw.substr(split)},
                        "growing split " + std::to_string(split));
  // Cut off inside the value: the header and part of the value went out, so
  // the stream ends with an error.
  const auto cut = parse_output(cfg, raw.substr(0, raw.find("x é")), StopReason::Length);
  EXPECT_TRUE(cut.stream_error);
  EXPECT_EQ(cut.tool_call_error.value_or(""), "unterminated tool call");
}
