// Anthropic's Messages API: POST /v1/messages (whole or streamed) and
// /v1/messages/count_tokens. The request becomes a chat request
// (anthropic_format.h), rendered and parsed exactly as /v1/chat/completions
// renders and parses it; the answer is a message of content blocks
// (thinking, text, tool_use), streamed as Anthropic's named SSE events.
#include <functional>

#include "server/anthropic_format.h"
#include "server/server_impl.h"
#include "server/streaming.h"
#include "server/structured_output.h"
#include "text/request_parsing.h"

namespace dsv4 {

namespace {

// stop_reason and stop_sequence of a finished message.
std::pair<std::string, ojson> stop_reason(const ChoiceStream& c, const text::ParsedMessage& msg) {
  if (c.reason() == FinishReason::Length) return {"max_tokens", nullptr};
  if (msg.finish_reason == "tool_calls" || !msg.tool_calls.empty()) return {"tool_use", nullptr};
  if (c.matched_stop_string) return {"stop_sequence", *c.matched_stop_string};
  return {"end_turn", nullptr};
}

// Thinking blocks carry a signature; this server checks none, so it is only
// an opaque tag of the reasoning text.
std::string signature_of(const std::string& reasoning) {
  static const char* digits = "0123456789abcdef";
  size_t h = std::hash<std::string>{}(reasoning);
  std::string s = "dsv4-";
  for (int i = 0; i < 16; ++i, h >>= 4) s.push_back(digits[h & 15]);
  return s;
}

// A tool call's arguments (JSON object text from the output parser) as the
// tool_use block's input.
ojson tool_input(const std::string& arguments) {
  try {
    ojson j = ojson::parse(arguments);
    if (j.is_object()) return j;
  } catch (const std::exception&) {
  }
  return ojson::object();
}

// cache_read_input_tokens only with --enable-cache-report (it tells a client
// whether anyone recently sent the same prefix); input_tokens are the prompt
// tokens not read from the cache, as Anthropic counts them.
ojson anthropic_usage(int64_t prompt, int64_t output, int64_t cached, bool report_cached) {
  const int64_t read = report_cached ? std::min(cached, prompt) : 0;
  return {{"input_tokens", prompt - read},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", read},
          {"output_tokens", output}};
}

// The stream: message_start, ping, then per content block
// content_block_start / content_block_delta... / content_block_stop, then
// message_delta (stop_reason, usage) and message_stop. Keep-alives are pings.
class AnthropicFormat : public SseFormatter {
 public:
  std::unique_ptr<text::OutputParser> parser;
  std::string id, model;
  int64_t prompt_tokens = 0;
  bool report_cached = false;

  std::string frame(const ojson& j) const override {
    return "event: " + j["type"].get<std::string>() + "\ndata: " + dump(j) + "\n\n";
  }
  std::string keepalive() const override { return "event: ping\ndata: {\"type\":\"ping\"}\n\n"; }
  std::string done() const override { return ""; }

  bool open(const Send& send) override {
    ojson message = {{"id", id},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"model", model},
                     {"content", ojson::array()},
                     {"stop_reason", nullptr},
                     {"stop_sequence", nullptr},
                     {"usage", anthropic_usage(prompt_tokens, 0, 0, false)}};
    return send({{"type", "message_start"}, {"message", message}}) && send({{"type", "ping"}});
  }

  bool events(size_t, ChoiceStream& c, const std::vector<TokenEvent>& evs, const Send& send) override {
    for (auto& e : evs) {
      text::ParserDelta d = parser->feed(c.apply(e));
      if (c.finished()) d.append(parser->finish(parser_stop(c)));
      if (!d.reasoning_content.empty()) {
        if (block_ != Block::Thinking &&
            !start(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, send))
          return false;
        reasoning_ += d.reasoning_content;
        if (!delta({{"type", "thinking_delta"}, {"thinking", d.reasoning_content}}, send)) return false;
      }
      if (!d.content.empty()) {
        if (block_ != Block::Text && !start(Block::Text, {{"type", "text"}, {"text", ""}}, send)) return false;
        if (!delta({{"type", "text_delta"}, {"text", d.content}}, send)) return false;
      }
      for (auto& t : d.tool_calls) {
        if (block_ != Block::Tool || t.index != tool_index_) {
          ojson block = {{"type", "tool_use"},
                         {"id", t.id.value_or("toolu_" + random_hex(24))},
                         {"name", t.name.value_or("")},
                         {"input", ojson::object()}};
          if (!start(Block::Tool, block, send)) return false;
          tool_index_ = t.index;
        }
        if (!t.arguments.empty() && !delta({{"type", "input_json_delta"}, {"partial_json", t.arguments}}, send))
          return false;
        // The invoke closed: its block ends now rather than with the next block.
        if (t.closes && !stop_block(send)) return false;
      }
      if (!c.finished()) continue;
      const text::ParsedMessage& msg = parser->message();
      if (c.reason() == FinishReason::Error || msg.stream_error) {
        const std::string why =
            c.reason() == FinishReason::Error
                ? c.error()
                : "malformed tool call after its header was streamed: " + msg.tool_call_error.value_or("");
        send(anthropic_error_body(500, why));
        return true;
      }
      if (!stop_block(send)) return false;
      auto [reason, sequence] = stop_reason(c, msg);
      ojson usage = {{"output_tokens", c.completion_tokens()}};
      if (report_cached) usage = anthropic_usage(prompt_tokens, c.completion_tokens(), c.handle().cached_tokens(), true);
      return send({{"type", "message_delta"},
                   {"delta", {{"stop_reason", reason}, {"stop_sequence", sequence}}},
                   {"usage", usage}}) &&
             send({{"type", "message_stop"}});
    }
    return true;
  }

 private:
  enum class Block { None, Thinking, Text, Tool };
  Block block_ = Block::None;
  int64_t index_ = -1;
  int tool_index_ = -1;
  std::string reasoning_;

  bool start(Block kind, ojson content_block, const Send& send) {
    if (!stop_block(send)) return false;
    block_ = kind;
    ++index_;
    return send({{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
  }
  bool delta(ojson d, const Send& send) {
    return send({{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  }
  bool stop_block(const Send& send) {
    if (block_ == Block::None) return true;
    if (block_ == Block::Thinking &&
        !delta({{"type", "signature_delta"}, {"signature", signature_of(reasoning_)}}, send))
      return false;
    block_ = Block::None;
    reasoning_.clear();
    return send({{"type", "content_block_stop"}, {"index", index_}});
  }
};

}  // namespace

// The request rendered like a chat request; returns the prompt's ids.
std::vector<int32_t> Server::Impl::anthropic_prompt(const AnthropicRequest& a, text::RenderedPrompt& rendered) {
  check_chat_request(a.chat);
  check_tool_choice(a.chat);
  return chat_prompt(a.chat, "messages", rendered);
}

void Server::Impl::anthropic_messages(const std::string& raw, HttpResponse& res) {
  const ojson body = parse_body(raw);
  const AnthropicRequest a = anthropic_request(body, /*count_only=*/false);
  text::RenderedPrompt rendered;
  std::vector<int32_t> prompt = anthropic_prompt(a, rendered);
  SamplingParams params = sampling_field(a.sampling, a.max_tokens, 0, seeds);
  params.max_new_tokens_explicit = true;
  text::ParserConfig parser_cfg = text::parser_config_for_request(a.chat, profile, rendered.starts_in_reasoning,
                                                                  opt.reasoning_parser, opt.tool_call_parser);
  // tool_choice any / tool: the forced DSML block, as for chat completions.
  params.constraint = chat_constraint(a.chat, tokenizer, parser_cfg, rendered.starts_in_reasoning, grammar_options());
  const int64_t prompt_tokens = int64_t(prompt.size());
  const ValidatedRequest checked = validate(std::move(prompt), params, "max_tokens");
  const std::string id = "msg_" + random_hex(24);
  const std::string model = a.model.empty() ? model_name() : a.model;
  auto choices = std::make_shared<Choices>();
  std::vector<Engine::Submission> submissions;
  submissions.push_back({id, checked});
  for (auto& handle : submit_all(std::move(submissions)))
    choices->push_back(std::make_unique<ChoiceStream>(handle, tokenizer, a.stop_sequences, false));

  if (a.stream) {
    auto format = std::make_shared<AnthropicFormat>();
    format->parser = std::make_unique<text::OutputParser>(parser_cfg);
    format->id = id;
    format->model = model;
    format->prompt_tokens = prompt_tokens;
    format->report_cached = opt.enable_cache_report;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    stream_events(res, choices, format, metrics, opt.keepalive_seconds);
    return;
  }
  auto build = [parser_cfg, id, model, prompt_tokens, report_cached = opt.enable_cache_report](Choices& cs) {
    ChoiceStream& c = *cs.at(0);
    if (c.reason() == FinishReason::Error) return anthropic_error_body(500, c.error());
    const text::ParsedMessage msg = text::parse_output(parser_cfg, c.text(), parser_stop(c));
    ojson content = ojson::array();
    if (msg.reasoning_content)
      content.push_back({{"type", "thinking"},
                         {"thinking", *msg.reasoning_content},
                         {"signature", signature_of(*msg.reasoning_content)}});
    if (msg.content) content.push_back({{"type", "text"}, {"text", *msg.content}});
    for (auto& tc : msg.tool_calls)
      content.push_back({{"type", "tool_use"}, {"id", tc.id}, {"name", tc.name}, {"input", tool_input(tc.arguments)}});
    auto [reason, sequence] = stop_reason(c, msg);
    return ojson{
        {"id", id},
        {"type", "message"},
        {"role", "assistant"},
        {"model", model},
        {"content", content},
        {"stop_reason", reason},
        {"stop_sequence", sequence},
        {"usage", anthropic_usage(prompt_tokens, c.completion_tokens(), c.handle().cached_tokens(), report_cached)}};
  };
  respond_when_done(res, choices, build, metrics);
}

void Server::Impl::anthropic_count_tokens(const std::string& raw, HttpResponse& res) {
  const ojson body = parse_body(raw);
  const AnthropicRequest a = anthropic_request(body, /*count_only=*/true);
  text::RenderedPrompt rendered;
  const std::vector<int32_t> prompt = anthropic_prompt(a, rendered);
  res.set_content(dump({{"input_tokens", int64_t(prompt.size())}}), "application/json");
}

}  // namespace dsv4
