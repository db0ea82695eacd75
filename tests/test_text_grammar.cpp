// The grammar engine of constrained decoding: JSON Schema compilation
// (accepted and rejected texts), token masks against a brute-force check on a
// small vocabulary, rollback.
#include <gtest/gtest.h>

#include <random>

#include "text/grammar.h"
#include "text/grammar_json.h"
#include "text/grammar_matcher.h"

namespace dsv4::text {
namespace {

using ojson = nlohmann::ordered_json;

Grammar schema(const char* text) { return json_schema_grammar(ojson::parse(text)); }

TEST(Grammar, JsonObject) {
  const Grammar g = json_object_grammar();
  EXPECT_TRUE(grammar_accepts(g, "{}"));
  EXPECT_TRUE(grammar_accepts(g, R"({"a": [1, 2.5e3, "x\n\u00e9"], "b":{"c":null}})"));
  EXPECT_TRUE(grammar_accepts(g, "{\"\xc3\xa9\":true}"));
  EXPECT_FALSE(grammar_accepts(g, "[]"));
  EXPECT_FALSE(grammar_accepts(g, "{"));
  EXPECT_FALSE(grammar_accepts(g, R"({"a":01})"));
  EXPECT_FALSE(grammar_accepts(g, "{\"\xc3\":1}"));  // broken UTF-8
  EXPECT_FALSE(grammar_accepts(g, "{\"a\":\"\x01\"}"));
  EXPECT_FALSE(grammar_accepts(g, "{} "));
}

TEST(Grammar, SchemaObjectProperties) {
  const Grammar g = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
      "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(grammar_accepts(g, R"({"b":"x"})"));
  EXPECT_TRUE(grammar_accepts(g, R"({"a":-3, "b":"x","c":false})"));
  EXPECT_TRUE(grammar_accepts(g, R"({"b":"x","c":true})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"a":1})"));            // b required
  EXPECT_FALSE(grammar_accepts(g, R"({"b":"x","a":1})"));    // schema order
  EXPECT_FALSE(grammar_accepts(g, R"({"a":1.5,"b":"x"})"));  // integer
  EXPECT_FALSE(grammar_accepts(g, R"({"b":"x","d":1})"));
  EXPECT_FALSE(grammar_accepts(g, R"({,"b":"x"})"));
}

TEST(Grammar, SchemaArraysEnumsRefs) {
  const Grammar g = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"enum":["x",1,null]},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
      "anyOf":[{"$ref":"#/$defs/node"},{"const":[1,2]}]})");
  EXPECT_TRUE(grammar_accepts(g, R"({"v":"x"})"));
  EXPECT_TRUE(grammar_accepts(g, R"({"v":1,"kids":[{"v":null},{"v":"x","kids":[]}]})"));
  EXPECT_TRUE(grammar_accepts(g, "[1,2]"));
  EXPECT_FALSE(grammar_accepts(g, R"({"v":2})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"v":1,"kids":[{"v":1},{"v":1},{"v":1}]})"));
  const Grammar counted = schema(R"({"type":"array","items":{"type":"null"},"minItems":2,"maxItems":3})");
  EXPECT_FALSE(grammar_accepts(counted, "[null]"));
  EXPECT_TRUE(grammar_accepts(counted, "[null,null]"));
  EXPECT_TRUE(grammar_accepts(counted, "[null, null,null]"));
  EXPECT_FALSE(grammar_accepts(counted, "[null,null,null,null]"));
}

TEST(Grammar, SchemaStringsAndFormats) {
  const Grammar sized = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(grammar_accepts(sized, "\"a\""));
  EXPECT_TRUE(grammar_accepts(sized, "\"a\\n\""));
  EXPECT_TRUE(grammar_accepts(sized, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""));
  EXPECT_FALSE(grammar_accepts(sized, "\"abcd\""));
  const Grammar dt = schema(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(grammar_accepts(dt, "\"2024-01-31T12:00:59.5Z\""));
  EXPECT_FALSE(grammar_accepts(dt, "\"2024-01-31\""));
  const Grammar uuid = schema(R"({"format":"uuid"})");
  EXPECT_TRUE(grammar_accepts(uuid, "\"123e4567-e89b-12d3-a456-426614174000\""));
  const Grammar types = schema(R"({"type":["number","null"]})");
  EXPECT_TRUE(grammar_accepts(types, "null"));
  EXPECT_TRUE(grammar_accepts(types, "-0.5E+10"));
  EXPECT_FALSE(grammar_accepts(types, "\"1\""));
}

TEST(Grammar, UnsupportedAndHostileSchemas) {
  auto error_of = [](const char* text) {
    try {
      schema(text);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"({"type":"integer","minimum":3})").find("'minimum'"), std::string::npos);
  EXPECT_NE(error_of(R"({"oneOf":[{"type":"string"}],"allOf":[]})").find("'oneOf'"), std::string::npos);
  EXPECT_NE(error_of(R"({"format":"hostname"})").find("hostname"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}})").find("finite"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/a","$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}}})")
                .find("left-recursive"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/nowhere"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"http://x/y"})").find("only references"), std::string::npos);
  // An object that must contain itself has no finite value.
  EXPECT_NE(error_of(R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})").find("finite"),
            std::string::npos);
  // A long $ref chain compiles without deep recursion.
  ojson chain = {{"$ref", "#/$defs/d0"}, {"$defs", ojson::object()}};
  for (int i = 0; i < 5000; ++i)
    chain["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  chain["$defs"]["d5000"] = {{"type", "null"}};
  EXPECT_TRUE(grammar_accepts(json_schema_grammar(chain), "null"));
}

// A small vocabulary of JSON-ish pieces (overlapping prefixes on purpose).
std::vector<std::string> small_vocab() {
  return {"{",   "}",   "[",  "]",   "\"",  ",",    ":",    " ",   "a",     "ab",   "b\"",     "\":",
          "\"a", "1",   "12", "0",   ".5",  "-",    "e",    "tr",  "ue",    "true", "false",   "null",
          "},",  "\"}", "\\", "\\n", "x",   "\xc3", "\xa9", "{\"", "\":\"", "\",",  "]}",      "",
          " \"", "nu",  "ll", "1,",  "\"v", "v\"",  "kids", "\"k", "\":[",  "[{",   "\"b\":1", "é"};
}

TEST(GrammarMatcher, MaskMatchesBruteForce) {
  const std::vector<std::string> vocab = small_vocab();
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const Grammar g = schema(R"({"type":"object","properties":{"v":{"type":"string"},"b":{"type":"integer"},
      "kids":{"type":"array","items":{"type":"object","properties":{"a":{"type":"boolean"}}}}},"required":["v"]})");
  auto compiled = std::make_shared<const CompiledGrammar>(g, trie);
  std::mt19937 rng(7);
  int steps = 0, finished = 0;
  for (int run = 0; run < 60; ++run) {
    GrammarMatcher matcher(compiled);
    ParseState state = ParseState::initial(g);
    for (int step = 0; step < 40; ++step, ++steps) {
      TokenMask mask((vocab.size() + 63) / 64, 0);
      ASSERT_TRUE(matcher.fill_mask(mask));
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < vocab.size(); ++t) {
        ParseState probe = state;
        const bool brute = compiled->advance(probe, int32_t(t));
        ASSERT_EQ(mask_has(mask, int64_t(t)), brute) << "token '" << vocab[t] << "' at step " << step;
        if (brute) allowed.push_back(int32_t(t));
      }
      if (allowed.empty()) {
        // The end, or a dead end of this tiny vocabulary ("k" + "ids" is missing).
        finished += matcher.can_finish();
        break;
      }
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(matcher.accept(pick));
      ASSERT_TRUE(compiled->advance(state, pick));
      // Rollback by one and redo: same mask afterwards.
      if (step % 5 == 0) {
        matcher.rollback(1);
        ASSERT_TRUE(matcher.accept(pick));
      }
    }
  }
  EXPECT_GT(steps, 500);
  EXPECT_GT(finished, 0);
}

TEST(GrammarMatcher, ActivatesAfterToken) {
  const std::vector<std::string> vocab = {"{", "}", "x", ""};
  auto compiled = std::make_shared<const CompiledGrammar>(json_object_grammar(), std::make_shared<TokenTrie>(vocab));
  GrammarMatcher matcher(compiled, /*activate_after=*/3);
  TokenMask mask(1, 0);
  EXPECT_FALSE(matcher.fill_mask(mask));
  EXPECT_TRUE(matcher.accept(2));  // reasoning: anything
  EXPECT_TRUE(matcher.accept(3));  // </think>
  ASSERT_TRUE(matcher.fill_mask(mask));
  EXPECT_EQ(mask[0], 1u);  // only "{"
  EXPECT_FALSE(matcher.accept(2));
  EXPECT_TRUE(matcher.accept(0));
  EXPECT_FALSE(matcher.can_finish());
  EXPECT_TRUE(matcher.accept(1));
  EXPECT_TRUE(matcher.can_finish());
  matcher.rollback(3);
  EXPECT_FALSE(matcher.fill_mask(mask));
}

}  // namespace
}  // namespace dsv4::text

namespace dsv4::text {
namespace {

TEST(Grammar, StringCap) {
  const Grammar g = json_object_grammar({4});
  EXPECT_TRUE(grammar_accepts(g, R"({"abcd":"wxyz"})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"abcde":1})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"a":"vwxyz"})"));
  const Grammar s = json_schema_grammar(ojson::parse(R"({"type":"string"})"), {3});
  EXPECT_TRUE(grammar_accepts(s, "\"abc\""));
  EXPECT_FALSE(grammar_accepts(s, "\"abcd\""));
}

}  // namespace
}  // namespace dsv4::text

#include "text/grammar_regex.h"

namespace dsv4::text {
namespace {

TEST(Grammar, Regex) {
  const Grammar phone = regex_grammar(R"(^\(\d{3}\) \d{3}-\d{4}$)");
  EXPECT_TRUE(grammar_accepts(phone, "(555) 123-4567"));
  EXPECT_FALSE(grammar_accepts(phone, "555-123-4567"));
  const Grammar words = regex_grammar("(?:yes|no|maybe)+[!?]*");
  EXPECT_TRUE(grammar_accepts(words, "yesnomaybe!?"));
  EXPECT_FALSE(grammar_accepts(words, ""));
  const Grammar unicode = regex_grammar("[^a-z]{2}é.");
  EXPECT_TRUE(grammar_accepts(unicode, "Z€éx"));
  EXPECT_TRUE(grammar_accepts(unicode,
                              "\xF0\x9F\x98\x80"
                              "1é\xE4\xB8\xAD"));
  EXPECT_FALSE(grammar_accepts(unicode, "aZé1"));
  EXPECT_FALSE(grammar_accepts(unicode, "ZZé\n"));
  EXPECT_FALSE(grammar_accepts(unicode, "\xED\xA0\x80Zéx"));  // a surrogate is not a character
  const Grammar classes = regex_grammar(R"([]a\-]+\w\s?[\d.]{1,2})");
  EXPECT_TRUE(grammar_accepts(classes, "]-a_ 1."));
  EXPECT_FALSE(grammar_accepts(classes, "b_1"));
  for (const char* bad : {"(a", "a)", "(?=a)", "\\1", "a{3,2}", "*a", "[a", "\\bx", "a{20000}"})
    EXPECT_THROW(regex_grammar(bad), GrammarError) << bad;
}

TEST(Grammar, Ebnf) {
  const Grammar g = ebnf_grammar(R"G(
    # arithmetic, right-recursive
    root ::= expr
    expr ::= term ("+" term)*
    term ::= num | "(" expr ")"
    num  ::= [1-9] [0-9]{0,3} | '0'
  )G");
  EXPECT_TRUE(grammar_accepts(g, "1+(20+3)+0"));
  EXPECT_FALSE(grammar_accepts(g, "1+"));
  EXPECT_FALSE(grammar_accepts(g, "01"));
  EXPECT_FALSE(grammar_accepts(g, "12345"));
  const Grammar escaped = ebnf_grammar("root ::= \"a\\n\\\"\" [\\u00e9]?");
  EXPECT_TRUE(grammar_accepts(escaped, "a\n\"é"));
  auto error_of = [](const char* text) {
    try {
      ebnf_grammar(text);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("root ::= a\na ::= a \"x\" | \"y\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= b").find("'b' is used but not defined"), std::string::npos);
  EXPECT_NE(error_of("start ::= \"x\"").find("no 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"x").find("unterminated"), std::string::npos);
}

}  // namespace
}  // namespace dsv4::text

namespace dsv4::text {
namespace {

TEST(Grammar, SchemaPattern) {
  const Grammar g = schema(R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d+$"},
      "any":{"pattern":"[^x]+"}},"required":["code","any"]})");
  EXPECT_TRUE(grammar_accepts(g, R"({"code":"AB-12","any":"yz"})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"code":"AB12","any":"yz"})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"code":"AB-1","any":"a\"b"})"));  // no quote from [^x]
  EXPECT_THROW(schema(R"({"pattern":"a\"b"})"), GrammarError);
}

}  // namespace
}  // namespace dsv4::text

#include "text/grammar_dsml.h"
#include "text/output_parser.h"

namespace dsv4::text {
namespace {

TEST(GrammarMatcher, TriggeredToolCallBlock) {
  // Free text until the block opener appears (split over tokens), then the
  // block's grammar, which ends with the close tag.
  const std::vector<std::string> vocab = {
      "hi", " ",         "\n\n<", "｜DSML｜", "tool", "_calls", ">\n", "<", "invoke", " name=\"f\">\n",
      "{}", "{\"a\":1}", "\n</",  ">",        "</",   "\n",     "x"};
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const Grammar g =
      dsml_tool_call_grammar({{"f", ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"],"additionalProperties":false})")}},
                             false, true, {}, /*after_opener=*/true);
  auto compiled = std::make_shared<const CompiledGrammar>(g, trie);
  GrammarMatcher m(compiled, -1, dsml_block_opener(false));
  TokenMask mask(1);
  std::string text;
  auto take = [&](int32_t token) {
    ASSERT_TRUE(m.accept(token)) << vocab[size_t(token)];
    text += vocab[size_t(token)];
  };
  for (int32_t t : {0, 1, 16, 2, 3, 4, 5}) {
    EXPECT_FALSE(m.fill_mask(mask)) << "free before the opener";
    take(t);
  }
  // ">\n" ends the opener and starts the block in the same token.
  EXPECT_FALSE(m.fill_mask(mask));
  take(6);
  ASSERT_TRUE(m.fill_mask(mask));
  EXPECT_TRUE(mask_has(mask, 7));
  EXPECT_FALSE(mask_has(mask, 16));
  EXPECT_FALSE(m.accept(16));
  for (int32_t t : {7, 3, 8, 9}) take(t);
  mask.assign(1, 0);
  m.fill_mask(mask);
  EXPECT_FALSE(mask_has(mask, 10));  // {} lacks the required "a"
  EXPECT_TRUE(mask_has(mask, 11));
  for (int32_t t : {11, 12, 3, 8, 6, 14, 3, 4, 5, 13}) take(t);
  EXPECT_TRUE(m.can_finish());
  mask.assign(1, 0);
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], 0u);
  // The text parses into the call.
  ParserConfig cfg;
  cfg.tools_enabled = true;
  const ParsedMessage msg = parse_output(cfg, text, StopReason::Stop);
  ASSERT_EQ(msg.tool_calls.size(), 1u) << text;
  EXPECT_EQ(msg.tool_calls[0].name, "f");
  EXPECT_EQ(ojson::parse(msg.tool_calls[0].arguments), ojson::parse(R"({"a":1})"));
}

TEST(GrammarMatcher, V41ToolCallBlockParses) {
  const Grammar g = dsml_tool_call_grammar({{"get", ojson()}, {"put", ojson()}}, /*v41=*/true, false);
  const std::string text =
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"put\">\n{\"k\": [1, \"v\"]}\n</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"get\">\n{}\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  ASSERT_TRUE(grammar_accepts(g, text));
  EXPECT_FALSE(grammar_accepts(g, "\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>"));  // at least one invoke
  ParserConfig cfg;
  cfg.reasoning = ReasoningParserKind::DeepSeekV41;
  cfg.tools = ToolParserKind::DeepSeekV41;
  cfg.tools_enabled = true;
  const ParsedMessage msg = parse_output(cfg, text, StopReason::Stop);
  ASSERT_EQ(msg.tool_calls.size(), 2u) << text;
  EXPECT_EQ(msg.tool_calls[0].name, "put");
  EXPECT_EQ(ojson::parse(msg.tool_calls[0].arguments), ojson::parse(R"({"k":[1,"v"]})"));
  EXPECT_EQ(msg.tool_calls[1].arguments, "{}");
}

}  // namespace
}  // namespace dsv4::text

namespace dsv4::text {
namespace {

TEST(Grammar, LargeEnumsKeepEveryValue) {
  // 600 values sharing prefixes: a flat choice would keep only 256 parses.
  ojson values = ojson::array();
  for (int i = 0; i < 600; ++i) values.push_back("item" + std::to_string(i));
  values.push_back("item");
  values.push_back(7);
  const Grammar g = json_schema_grammar(ojson{{"enum", values}});
  for (const char* ok : {"\"item0\"", "\"item599\"", "\"item\"", "\"item59\"", "7"})
    EXPECT_TRUE(grammar_accepts(g, ok)) << ok;
  for (const char* bad : {"\"item600\"", "\"ite\"", "\"item5999\"", "8", "\"item1\"x"})
    EXPECT_FALSE(grammar_accepts(g, bad)) << bad;
  ParseState start = ParseState::initial(g);
  EXPECT_EQ(start.size(), 2u);  // '"' and '7'
}

}  // namespace
}  // namespace dsv4::text
