// The Responses API's request conversion and store, without a server: how
// input items become chat turns, which fields are refused, and the store's
// bounds. The routes and the stream are tested end to end with the openai
// client in tests/server/responses.test.mjs.
#include <gtest/gtest.h>

#include "server/responses_format.h"
#include "server/responses_store.h"
#include "server/responses_stream.h"

namespace dsv4 {
namespace {

ojson parse(const char* text) { return ojson::parse(text); }

// The 400 message of a request, or "" when it is accepted.
std::string refusal(const char* body) {
  try {
    responses_request(parse(body));
  } catch (const BadRequest& e) {
    EXPECT_EQ(e.status, 400);
    return e.what();
  }
  return "";
}

TEST(ResponsesFormat, StringInputIsOneUserMessage) {
  ResponsesRequest r = responses_request(parse(R"({"input": "Hi", "instructions": "Be brief."})"));
  const ojson chat = responses_chat_body(r, ojson::array());
  EXPECT_EQ(chat["messages"], parse(R"([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"}])"));
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.max_output_tokens, 0);
}

TEST(ResponsesFormat, AssistantItemsMergeIntoOneTurn) {
  // A response's output (reasoning, message, two calls) sent back, then the
  // tools' outputs: one assistant turn, two tool messages.
  ResponsesRequest r = responses_request(parse(R"({"input": [
      {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "one"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
      {"type": "message", "role": "assistant", "content": "Done."}]})"));
  const ojson& m = r.input_messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], parse(R"({"role": "user", "content": "a\n\nb"})"));
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], "Let me check.");
  EXPECT_EQ(m[1]["reasoning_content"], "think");
  ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[1]["tool_calls"][1]["id"], "c2");
  EXPECT_EQ(m[1]["tool_calls"][1]["function"]["arguments"], "{\"x\":1}");
  EXPECT_EQ(m[2], parse(R"({"role": "tool", "tool_call_id": "c1", "content": "one"})"));
  EXPECT_EQ(m[3]["content"], "two");
  EXPECT_EQ(m[4]["content"], "Done.");
  // Reasoning sent back keeps the history's reasoning.
  EXPECT_EQ(r.chat["drop_thinking"], false);
}

TEST(ResponsesFormat, ToolsChoiceReasoningAndFormatMapOntoChat) {
  ResponsesRequest r = responses_request(parse(R"({"input": "Hi",
      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
      "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
      "reasoning": {"effort": "high"}, "max_output_tokens": 7, "temperature": 0.5,
      "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true}}})"));
  EXPECT_EQ(r.chat["tools"], parse(R"([{"type": "function", "function":
      {"name": "f", "parameters": {"type": "object"}, "strict": true}}])"));
  EXPECT_EQ(r.chat["tool_choice"], parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(r.chat["parallel_tool_calls"], false);
  EXPECT_EQ(r.chat["reasoning_effort"], "high");
  EXPECT_EQ(r.chat["thinking"], parse(R"({"type": "enabled"})"));
  EXPECT_EQ(r.chat["response_format"], parse(R"({"type": "json_schema", "json_schema":
      {"name": "s", "schema": {"type": "object"}, "strict": true}})"));
  EXPECT_EQ(r.max_output_tokens, 7);
  EXPECT_EQ(r.sampling["temperature"], 0.5);
  EXPECT_EQ(responses_request(parse(R"({"input": "Hi", "reasoning": {"effort": "none"}})")).chat["thinking"],
            parse(R"({"type": "disabled"})"));
}

TEST(ResponsesFormat, RefusalsNameTheField) {
  EXPECT_NE(refusal(R"({"input": "Hi", "background": true})").find("'background'"), std::string::npos);
  EXPECT_NE(refusal(R"({})").find("'input' is required"), std::string::npos);
  EXPECT_NE(
      refusal(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})").find("input[0].content[0]"),
      std::string::npos);
  EXPECT_NE(refusal(R"({"input": [{"type": "item_reference", "id": "x"}]})").find("input[0]"), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "Hi", "tools": [{"type": "file_search"}]})").find("tools[0].type"), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "Hi", "truncation": "auto"})").find("'truncation'"), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "Hi", "max_output_tokens": 1.5})").find("'max_output_tokens'"), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "Hi", "metadata": {"k": 1}})").find("'metadata.k'"), std::string::npos);
  EXPECT_EQ(refusal(R"({"input": "Hi", "background": false, "include": ["reasoning.encrypted_content"]})"), "");
  // A continuation may send no new input.
  EXPECT_EQ(refusal(R"({"previous_response_id": "resp_1"})"), "");
}

TEST(ResponsesFormat, OutputItemsRoundTripToTheAssistantTurn) {
  text::ParsedMessage msg;
  msg.reasoning_content = "think";
  msg.content = "answer";
  msg.tool_calls.push_back({"call_1", "f", "{\"a\":1}"});
  const ojson items = output_items(msg, "completed");
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[1]["content"][0]["text"], "answer");
  EXPECT_EQ(items[2]["call_id"], "call_1");
  const ojson turn = assistant_message(items);
  EXPECT_EQ(turn["content"], "answer");
  EXPECT_EQ(turn["reasoning_content"], "think");
  EXPECT_EQ(turn["tool_calls"][0]["function"]["name"], "f");
  // The items sent back as input make the same turn.
  ojson body = {{"input", items}};
  EXPECT_EQ(responses_request(body).input_messages[0], turn);
}

text::ParserDelta reasoning_delta(const std::string& text) {
  text::ParserDelta d;
  d.reasoning_content = text;
  return d;
}

text::ParserDelta content_delta(const std::string& text) {
  text::ParserDelta d;
  d.content = text;
  return d;
}

// A piece of tool call `index`; the first piece of a call names it.
text::ParserDelta call_delta(int index, const char* id, const char* name, const std::string& arguments) {
  text::ParserDelta d;
  text::ToolCallDelta call;
  call.index = index;
  if (id) call.id = id, call.name = name;
  call.arguments = arguments;
  d.tool_calls.push_back(call);
  return d;
}

TEST(ResponsesEventStream, ItemsOpenExtendAndCloseInOrder) {
  std::vector<ojson> events;
  ResponsesEventStream stream([&](const ojson& e) {
    events.push_back(e);
    return true;
  });
  ASSERT_TRUE(stream.open(ojson{{"status", "in_progress"}}));
  for (const text::ParserDelta& d : {reasoning_delta("th"), reasoning_delta("ink"), content_delta("Let me "),
                                     content_delta("check."), call_delta(0, "call_a", "f", "{\"a\""),
                                     call_delta(0, nullptr, nullptr, ":1}"), call_delta(1, "call_b", "g", "{}")})
    ASSERT_TRUE(stream.delta(d));
  ASSERT_TRUE(stream.close_items("completed"));
  ASSERT_TRUE(stream.finish(ojson{{"status", "completed"}}, ""));

  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], int64_t(i));
    types.push_back(events[i]["type"]);
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      // reasoning
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      // message
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      // two calls
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.output_item.added",
      "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, expected);

  const ojson& items = stream.items();
  ASSERT_EQ(items.size(), 4u);
  EXPECT_EQ(items[0]["content"][0]["text"], "think");
  EXPECT_EQ(items[1]["content"][0]["text"], "Let me check.");
  EXPECT_EQ(items[2]["call_id"], "call_a");
  EXPECT_EQ(items[2]["name"], "f");
  EXPECT_EQ(items[2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(items[3]["call_id"], "call_b");
  EXPECT_EQ(stream.reasoning(), "think");
  // Output indices count the items; the done events carry the final items.
  EXPECT_EQ(events[19]["output_index"], 2);
  EXPECT_EQ(events[19]["name"], "f");
  EXPECT_EQ(events[24]["item"], items[3]);
  EXPECT_EQ(events[9]["item"]["status"], "in_progress");
}

TEST(ResponsesEventStream, FailureSendsAnErrorThenResponseFailed) {
  std::vector<ojson> events;
  ResponsesEventStream stream([&](const ojson& e) {
    events.push_back(e);
    return events.size() < 100;
  });
  ASSERT_TRUE(stream.delta(content_delta("partial")));
  ASSERT_TRUE(stream.close_items("incomplete"));
  EXPECT_EQ(stream.items()[0]["status"], "incomplete");
  ASSERT_TRUE(stream.finish(ojson{{"status", "failed"}}, "engine error"));
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2]["type"], "error");
  EXPECT_EQ(events[events.size() - 2]["message"], "engine error");
  EXPECT_EQ(events.back()["type"], "response.failed");
  // A client that went away stops the stream.
  ResponsesEventStream gone([](const ojson&) { return false; });
  EXPECT_FALSE(gone.delta(content_delta("x")));
}

TEST(ResponsesStore, EvictsTheLeastRecentlyUsed) {
  ResponsesStore store(2, 1 << 20);
  store.put("a", {ojson{{"id", "a"}}, ojson::array()});
  store.put("b", {ojson{{"id", "b"}}, ojson::array()});
  ASSERT_TRUE(store.get("a"));  // a is now the most recently used
  store.put("c", {ojson{{"id", "c"}}, ojson::array()});
  EXPECT_TRUE(store.get("a"));
  EXPECT_FALSE(store.get("b"));
  EXPECT_TRUE(store.get("c"));
  EXPECT_EQ(store.size(), 2);
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
  EXPECT_EQ(store.size(), 1);
}

TEST(ResponsesStore, KeepsToItsByteBudget) {
  ResponsesStore store(100, 1000);
  const std::string big(400, 'x');
  for (const char* id : {"a", "b", "c"}) store.put(id, {ojson{{"text", big}}, ojson::array()});
  EXPECT_LE(store.bytes(), 1000);
  EXPECT_EQ(store.size(), 2);
  EXPECT_FALSE(store.get("a"));
  // An entry larger than the whole budget is not kept, and evicts nothing.
  store.put("huge", {ojson{{"text", std::string(2000, 'y')}}, ojson::array()});
  EXPECT_FALSE(store.get("huge"));
  EXPECT_EQ(store.size(), 2);
  // Size 0 stores nothing.
  ResponsesStore none(0, 1000);
  none.put("a", {ojson::object(), ojson::array()});
  EXPECT_FALSE(none.get("a"));
}

}  // namespace
}  // namespace dsv4
