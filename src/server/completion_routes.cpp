// The generating routes: OpenAI's /v1/chat/completions and /v1/completions,
// SGLang's /generate. Each reads its fields (request_fields.h), submits one
// engine request per choice and answers either at the end
// (respond_when_done) or as a stream through its SseFormatter.
#include "core/machine.h"
#include "server/server_impl.h"
#include "server/streaming.h"
#include "server/structured_output.h"
#include "text/request_parsing.h"
#include "text/utf8.h"

namespace dsv4 {

namespace {

// Choice i of n gets its own sampling stream from the request's seed.
uint64_t choice_seed(uint64_t seed, uint64_t i) { return seed + i * 0x9E3779B97F4A7C15ull; }

std::string finish_reason_for(const ChoiceStream& c, const std::string& parser_reason) {
  if (c.reason() == FinishReason::Length) return "length";
  if (c.reason() == FinishReason::Abort || c.reason() == FinishReason::Error) return "abort";
  if (parser_reason == "tool_calls") return "tool_calls";
  return "stop";
}

std::string completion_finish_reason(const ChoiceStream& c) {
  if (c.reason() == FinishReason::Length) return "length";
  if (c.reason() == FinishReason::Abort || c.reason() == FinishReason::Error) return "abort";
  return "stop";
}

ojson matched_stop(const ChoiceStream& c) {
  if (c.matched_stop_string) return *c.matched_stop_string;
  if (c.matched_stop_token) return *c.matched_stop_token;
  return nullptr;
}

// prompt_tokens_details.cached_tokens only with --enable-cache-report: it
// tells a client whether anyone recently sent the same prompt prefix.
ojson openai_usage(int64_t prompt, int64_t completion, int64_t cached, bool report_cached) {
  ojson u = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  if (report_cached) u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  return u;
}

// Chat logprobs: per token its text, logprob, bytes and alternatives.
ojson chat_logprobs(const text::Tokenizer& tokenizer, const std::vector<SampledToken>& tokens) {
  ojson content = ojson::array();
  auto entry = [&](int32_t id, float lp) {
    std::string bytes(tokenizer.token_bytes(id));
    ojson b = ojson::array();
    for (unsigned char ch : bytes) b.push_back(int(ch));
    return ojson{{"token", text::utf8::to_valid_lossy(bytes)}, {"logprob", lp}, {"bytes", b}};
  };
  for (auto& t : tokens) {
    ojson e = entry(t.token, t.logprob);
    ojson top = ojson::array();
    for (auto& [id, lp] : t.top) top.push_back(entry(id, lp));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}};
}

// Legacy completions logprobs: parallel lists of tokens, logprobs and
// {token: logprob} alternatives.
ojson completion_logprobs(const text::Tokenizer& tokenizer, const std::vector<SampledToken>& toks) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array();
  for (auto& t : toks) {
    tokens.push_back(text::utf8::to_valid_lossy(tokenizer.token_bytes(t.token)));
    lps.push_back(t.logprob);
    ojson top = ojson::object();
    for (auto& [tid, lp] : t.top) top[text::utf8::to_valid_lossy(tokenizer.token_bytes(tid))] = lp;
    tops.push_back(top);
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}};
}

// The tokens a choice sampled since it had `before` of them.
std::vector<SampledToken> sampled_since(const ChoiceStream& c, size_t before) {
  return std::vector<SampledToken>(c.sampled().begin() + int64_t(before), c.sampled().end());
}

// Chat stream: the role first, then reasoning/content/tool-call deltas, then
// the finish chunk per choice, optional usage.
class ChatFormat : public SseFormatter {
 public:
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::shared_ptr<Choices> choices;
  std::vector<text::OutputParser> parsers;
  std::string id, model;
  int64_t created = 0, n = 1, prompt_tokens = 0;
  bool include_usage = false, want_logprobs = false, report_cached = false;

  ojson chunk(int64_t index, ojson delta, ojson finish, ojson logprobs = ojson()) const {
    ojson choice = {{"index", index},
                    {"delta", std::move(delta)},
                    {"logprobs", std::move(logprobs)},
                    {"finish_reason", std::move(finish)}};
    return ojson{{"id", id},
                 {"object", "chat.completion.chunk"},
                 {"created", created},
                 {"model", model},
                 {"choices", ojson::array({choice})}};
  }

  bool open(const Send& send) override {
    for (int64_t i = 0; i < n; ++i)
      if (!send(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr))) return false;
    return true;
  }

  static ojson delta_json(const text::ParserDelta& d) {
    ojson delta = ojson::object();
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (auto& t : d.tool_calls) {
        ojson call = {{"index", t.index}};
        if (t.id) call["id"] = *t.id, call["type"] = "function";
        ojson fn = ojson::object();
        if (t.name) fn["name"] = *t.name;
        fn["arguments"] = t.arguments;
        call["function"] = fn;
        calls.push_back(call);
      }
      delta["tool_calls"] = calls;
    }
    return delta;
  }

  bool events(size_t i, ChoiceStream& c, const std::vector<TokenEvent>& evs, const Send& send) override {
    text::OutputParser& parser = parsers[i];
    for (auto& e : evs) {
      size_t before = c.sampled().size();
      text::ParserDelta d = parser.feed(c.apply(e));
      if (c.finished()) d.append(parser.finish(parser_stop(c)));
      ojson logprobs;
      if (want_logprobs && c.sampled().size() > before) logprobs = chat_logprobs(*tokenizer, sampled_since(c, before));
      if ((!d.empty() || !logprobs.is_null()) && !send(chunk(int64_t(i), delta_json(d), nullptr, logprobs)))
        return false;
      if (!c.finished()) continue;
      if (c.reason() == FinishReason::Error || parser.message().stream_error) {
        std::string msg = c.reason() == FinishReason::Error ? c.error()
                                                            : "malformed tool call after its header was streamed: " +
                                                                  parser.message().tool_call_error.value_or("");
        send(error_body(500, msg));
      }
      ojson fin = chunk(int64_t(i), ojson::object(), finish_reason_for(c, parser.message().finish_reason));
      fin["choices"][0]["matched_stop"] = matched_stop(c);
      return send(fin);
    }
    return true;
  }

  void close(const Send& send) override {
    if (!include_usage) return;
    int64_t completion = 0, cached = 0;
    for (auto& c : *choices)
      completion += c->completion_tokens(), cached = std::max(cached, c->handle().cached_tokens());
    send({{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"choices", ojson::array()},
          {"usage", openai_usage(prompt_tokens, completion, cached, report_cached)}});
  }
};

// Completions stream: text pieces (the echoed prompt before the first),
// logprobs, the finish reason on the last chunk of each choice.
class CompletionFormat : public SseFormatter {
 public:
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::shared_ptr<Choices> choices;
  std::vector<std::string> echoes;
  std::vector<bool> echoed;
  std::string id, model;
  int64_t created = 0, prompt_tokens = 0, logprobs_k = -1;
  bool include_usage = false, report_cached = false;

  ojson chunk(ojson choices_json) const {
    return {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", std::move(choices_json)}};
  }

  bool events(size_t i, ChoiceStream& c, const std::vector<TokenEvent>& evs, const Send& send) override {
    for (auto& e : evs) {
      size_t before = c.sampled().size();
      std::string piece = c.apply(e);
      if (!echoed[i]) piece = echoes[i] + piece, echoed[i] = true;
      ojson lp;
      if (logprobs_k >= 0 && c.sampled().size() > before)
        lp = completion_logprobs(*tokenizer, sampled_since(c, before));
      ojson choice = {{"index", i},
                      {"text", piece},
                      {"logprobs", lp},
                      {"finish_reason", c.finished() ? ojson(completion_finish_reason(c)) : ojson()}};
      if (c.finished()) choice["matched_stop"] = matched_stop(c);
      if ((!piece.empty() || c.finished() || !lp.is_null()) && !send(chunk(ojson::array({choice})))) return false;
      if (c.finished()) break;
    }
    return true;
  }

  void close(const Send& send) override {
    if (!include_usage) return;
    int64_t completion = 0, cached = 0;
    for (auto& c : *choices) completion += c->completion_tokens(), cached += c->handle().cached_tokens();
    ojson usage_chunk = chunk(ojson::array());
    usage_chunk["usage"] = openai_usage(prompt_tokens, completion, cached, report_cached);
    send(usage_chunk);
  }
};

// /generate stream: the whole result so far (cumulative text, like SGLang)
// after each batch of events of a choice; "index" when the request was a batch.
class GenerateFormat : public SseFormatter {
 public:
  std::function<ojson(ChoiceStream&)> result;
  bool batched = false;

  bool events(size_t i, ChoiceStream& c, const std::vector<TokenEvent>& evs, const Send& send) override {
    for (auto& e : evs) c.apply(e);
    ojson r = result(c);
    if (batched) r["index"] = i;
    return send(r);
  }
};

}  // namespace

// ---- /v1/chat/completions ----

std::vector<int32_t> Server::Impl::chat_prompt(const ojson& chat, const char* what, text::RenderedPrompt& rendered) {
  try {
    rendered = text::render_chat_request(chat, profile, render_options);
  } catch (const nlohmann::json::exception& e) {
    // A field of a type the checks let through: still the client's.
    throw BadRequest(std::string("invalid ") + what + " request: " + e.what());
  }
  for (auto& w : rendered.warnings) log("warning", w);
  return opt.allow_special_tokens_in_content ? tokenizer->encode(rendered.prompt)
                                             : tokenizer->encode(rendered.prompt, rendered.content_spans);
}

void Server::Impl::chat_completions(const std::string& raw, HttpResponse& res) {
  ojson body = parse_body(raw);
  check_chat_request(body);
  const std::string model = string_field(body, "model", model_name());
  const int64_t n = int_field(body, "n", 1, 1, 16);
  const bool stream = bool_field(body, "stream", false);
  const bool include_usage = include_usage_field(body);
  const bool want_logprobs = bool_field(body, "logprobs", false);
  const int64_t top_logprobs = int_field(body, "top_logprobs", 0, 0, 20);
  if (top_logprobs > 0 && !want_logprobs) throw BadRequest("'top_logprobs' requires 'logprobs': true");
  check_tool_choice(body);

  text::RenderedPrompt rendered;
  std::vector<int32_t> prompt = chat_prompt(body, "chat", rendered);
  const char* max_key = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                            ? "max_completion_tokens"
                            : "max_tokens";
  bool max_given = false;
  // Without max_tokens a chat turn may take what the context leaves.
  SamplingParams params =
      sampling_field(body, max_tokens_field(body, max_key, engine->context_length(), &max_given), 0, seeds);
  params.max_new_tokens_explicit = max_given;
  params.top_logprobs = want_logprobs ? top_logprobs : 0;
  text::ParserConfig parser_cfg = text::parser_config_for_request(body, profile, rendered.starts_in_reasoning,
                                                                  opt.reasoning_parser, opt.tool_call_parser);
  params.constraint = chat_constraint(body, tokenizer, parser_cfg, rendered.starts_in_reasoning, grammar_options());
  const int64_t prompt_tokens = int64_t(prompt.size());
  const ValidatedRequest checked = validate(std::move(prompt), params, max_key);
  const std::vector<std::string> stops = stop_field(body);

  const std::string id = rid_field(body, 1, "chatcmpl-" + random_hex(24), false)[0];
  auto choices = std::make_shared<Choices>();
  std::vector<text::OutputParser> parsers;
  std::vector<Engine::Submission> submissions;
  for (int64_t i = 0; i < n; ++i)
    submissions.push_back(
        {n == 1 ? id : id + "-" + std::to_string(i), checked.with_seed(choice_seed(params.seed, uint64_t(i)))});
  for (auto& handle : submit_all(std::move(submissions))) {
    choices->push_back(std::make_unique<ChoiceStream>(handle, tokenizer, stops, false));
    parsers.emplace_back(parser_cfg);
  }
  const int64_t created = unix_time();

  if (stream) {
    auto format = std::make_shared<ChatFormat>();
    format->tokenizer = tokenizer;
    format->choices = choices;
    format->parsers = std::move(parsers);
    format->id = id;
    format->model = model;
    format->created = created;
    format->n = n;
    format->prompt_tokens = prompt_tokens;
    format->include_usage = include_usage;
    format->want_logprobs = want_logprobs;
    format->report_cached = opt.enable_cache_report;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    stream_events(res, choices, format, metrics, opt.keepalive_seconds);
    return;
  }
  auto build = [tok = tokenizer, parser_cfg, want_logprobs, id, created, model, prompt_tokens,
                report_cached = opt.enable_cache_report](Choices& choices) {
    ojson out_choices = ojson::array();
    int64_t completion = 0, cached = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      ChoiceStream& c = *choices[i];
      text::ParsedMessage msg = text::parse_output(parser_cfg, c.text(), parser_stop(c));
      completion += c.completion_tokens();
      cached = std::max(cached, c.handle().cached_tokens());
      if (c.reason() == FinishReason::Error) throw std::runtime_error(c.error());
      ojson message = {{"role", "assistant"},
                       {"content", msg.content ? ojson(*msg.content) : ojson()},
                       {"reasoning_content", msg.reasoning_content ? ojson(*msg.reasoning_content) : ojson()}};
      if (!msg.tool_calls.empty()) {
        ojson calls = ojson::array();
        for (size_t k = 0; k < msg.tool_calls.size(); ++k)
          calls.push_back(
              {{"id", msg.tool_calls[k].id},
               {"index", int(k)},
               {"type", "function"},
               {"function", {{"name", msg.tool_calls[k].name}, {"arguments", msg.tool_calls[k].arguments}}}});
        message["tool_calls"] = calls;
      } else {
        message["tool_calls"] = nullptr;
      }
      out_choices.push_back({{"index", int64_t(i)},
                             {"message", message},
                             {"logprobs", want_logprobs ? chat_logprobs(*tok, c.sampled()) : ojson()},
                             {"finish_reason", finish_reason_for(c, msg.finish_reason)},
                             {"matched_stop", matched_stop(c)}});
    }
    return ojson{{"id", id},
                 {"object", "chat.completion"},
                 {"created", created},
                 {"model", model},
                 {"choices", out_choices},
                 {"usage", openai_usage(prompt_tokens, completion, cached, report_cached)}};
  };
  respond_when_done(res, choices, build, metrics);
}

// ---- /v1/completions (raw prompts, no parsers) ----

void Server::Impl::completions(const std::string& raw, HttpResponse& res) {
  ojson body = parse_body(raw);
  if (!body.contains("prompt")) throw BadRequest("'prompt' is required");
  const std::string model = string_field(body, "model", model_name());
  std::vector<std::vector<int32_t>> prompts = prompts_field(body["prompt"], "prompt", *tokenizer, 0);
  const int64_t n = int_field(body, "n", 1, 1, 16);
  const bool stream = bool_field(body, "stream", false);
  const bool echo = bool_field(body, "echo", false);
  const int64_t logprobs_k =
      body.contains("logprobs") && !body["logprobs"].is_null() ? int_field(body, "logprobs", 0, 0, 20) : -1;
  const bool include_usage = include_usage_field(body);
  check_response_format(body);
  const std::vector<std::string> stops = stop_field(body);
  const std::string id = string_field(body, "rid", "cmpl-" + random_hex(24));
  const std::shared_ptr<const ConstraintFactory> constraint = completion_constraint(body, tokenizer, grammar_options());
  // Every prompt is checked before the first one is submitted.
  std::vector<ValidatedRequest> checked;
  for (auto& prompt : prompts) {
    bool max_given = false;
    SamplingParams p = sampling_field(body, max_tokens_field(body, "max_tokens", 16, &max_given), 0, seeds);
    p.constraint = constraint;
    p.max_new_tokens_explicit = max_given;
    p.top_logprobs = std::max<int64_t>(logprobs_k, 0);
    checked.push_back(validate(prompt, p, "max_tokens"));
  }
  auto choices = std::make_shared<Choices>();
  std::vector<std::string> echoes;
  int64_t prompt_tokens = 0;
  std::vector<Engine::Submission> submissions;
  for (const ValidatedRequest& request : checked) {
    const std::vector<int32_t>& prompt = request.prompt();
    prompt_tokens += int64_t(prompt.size());
    for (int64_t i = 0; i < n; ++i) {
      submissions.push_back({id + "-" + std::to_string(submissions.size()),
                             request.with_seed(choice_seed(request.params().seed, uint64_t(i)))});
      echoes.push_back(echo ? tokenizer->decode(prompt) : "");
    }
  }
  for (auto& h : submit_all(std::move(submissions)))
    choices->push_back(std::make_unique<ChoiceStream>(h, tokenizer, stops, true));
  const int64_t created = unix_time();
  if (stream) {
    auto format = std::make_shared<CompletionFormat>();
    format->tokenizer = tokenizer;
    format->choices = choices;
    format->echoed.assign(choices->size(), false);
    format->echoes = std::move(echoes);
    format->id = id;
    format->model = model;
    format->created = created;
    format->prompt_tokens = prompt_tokens;
    format->logprobs_k = logprobs_k;
    format->include_usage = include_usage;
    format->report_cached = opt.enable_cache_report;
    res.set_header("Cache-Control", "no-cache");
    stream_events(res, choices, format, metrics, opt.keepalive_seconds);
    return;
  }
  auto build = [tok = tokenizer, echoes, logprobs_k, id, created, model, prompt_tokens,
                report_cached = opt.enable_cache_report](Choices& choices) {
    ojson out = ojson::array();
    int64_t completion = 0, cached = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      ChoiceStream& c = *choices[i];
      if (c.reason() == FinishReason::Error) throw std::runtime_error(c.error());
      completion += c.completion_tokens();
      cached += c.handle().cached_tokens();
      out.push_back({{"index", i},
                     {"text", echoes[i] + c.text()},
                     {"logprobs", logprobs_k >= 0 ? completion_logprobs(*tok, c.sampled()) : ojson()},
                     {"finish_reason", completion_finish_reason(c)},
                     {"matched_stop", matched_stop(c)}});
    }
    return ojson{{"id", id},           {"object", "text_completion"},
                 {"created", created}, {"model", model},
                 {"choices", out},     {"usage", openai_usage(prompt_tokens, completion, cached, report_cached)}};
  };
  respond_when_done(res, choices, build, metrics);
}

// ---- SGLang native /generate ----

void Server::Impl::generate(const std::string& raw, HttpResponse& res) {
  ojson body = parse_body(raw);
  std::vector<std::vector<int32_t>> prompts;
  bool batched = false;
  if (body.contains("input_ids") && !body["input_ids"].is_null()) {
    batched = body["input_ids"].is_array() && !body["input_ids"].empty() && body["input_ids"][0].is_array();
    prompts = prompts_field(body["input_ids"], "input_ids", *tokenizer, 0, PromptKind::Ids);
  } else if (body.contains("text") && !body["text"].is_null()) {
    batched = body["text"].is_array();
    prompts = prompts_field(body["text"], "text", *tokenizer, 0, PromptKind::Text);
  } else {
    throw BadRequest("either 'text' or 'input_ids' is required");
  }
  const ojson* sp_field = object_field(body, "sampling_params");
  ojson sp = sp_field ? *sp_field : ojson::object();
  if (sp.contains("sampling_seed") && !sp["sampling_seed"].is_null() && !sp["sampling_seed"].is_number_integer())
    throw BadRequest("'sampling_params.sampling_seed' must be an integer");
  if (sp.contains("sampling_seed") && !sp.contains("seed")) sp["seed"] = sp["sampling_seed"];
  const bool stream = bool_field(body, "stream", false);
  const bool return_logprob = bool_field(body, "return_logprob", false);
  const int64_t top_n = int_field(body, "top_logprobs_num", 0, 0, 20);
  // SGLang's input_token_logprobs (logprob_start_len >= 0): refused, not
  // silently left out. The model computes no prompt logprobs; with bounded
  // replay the late layers never see most of the prompt at all.
  if (return_logprob && int_field(body, "logprob_start_len", -1, -1, int64_t(1) << 40) >= 0)
    throw BadRequest(opt.bounded_replay ? "prompt logprobs (logprob_start_len >= 0) are not available with "
                                          "--enable-decoder-swa-bounded-replay"
                                        : "prompt logprobs (logprob_start_len >= 0) are not supported; use -1");
  const bool skip_special = bool_field(sp, "skip_special_tokens", true);
  const std::vector<std::string> stops = stop_field(sp);
  const std::vector<std::string> rids = rid_field(body, prompts.size(), random_hex(32), true);
  const std::shared_ptr<const ConstraintFactory> constraint = completion_constraint(sp, tokenizer, grammar_options());
  // Every prompt is checked before the first one is submitted.
  auto choices = std::make_shared<Choices>();
  std::vector<Engine::Submission> submissions;
  for (size_t k = 0; k < prompts.size(); ++k) {
    bool max_given = false;
    SamplingParams p = sampling_field(sp, max_tokens_field(sp, "max_new_tokens", 128, &max_given), 0, seeds);
    p.constraint = constraint;
    p.max_new_tokens_explicit = max_given;
    p.min_new_tokens = int_field(sp, "min_new_tokens", 0, 0, int64_t(1) << 40);
    p.top_logprobs = return_logprob ? top_n : 0;
    submissions.push_back({rids[k], validate(prompts[k], p, "max_new_tokens")});
  }
  for (auto& h : submit_all(std::move(submissions)))
    choices->push_back(std::make_unique<ChoiceStream>(h, tokenizer, stops, skip_special));
  auto result = [return_logprob, top_n, report_cached = opt.enable_cache_report](ChoiceStream& c) {
    RequestTimes t = c.handle().times();
    ojson finish = nullptr;
    if (c.finished()) {
      finish = {{"type", finish_reason_name(c.reason() == FinishReason::Error ? FinishReason::Abort : c.reason())},
                {"matched", matched_stop(c)}};
      if (!c.error().empty()) finish["message"] = c.error();
    }
    ojson meta = {{"id", c.handle().id()},
                  {"finish_reason", finish},
                  {"prompt_tokens", c.handle().prompt_tokens()},
                  {"completion_tokens", c.completion_tokens()},
                  {"e2e_latency", (t.finished > 0 ? t.finished : now_seconds()) - t.submitted}};
    if (report_cached) meta["cached_tokens"] = c.handle().cached_tokens();
    // SGLang's speculative fields (present when the request verified drafts).
    if (const int64_t verifies = c.handle().spec_verify_ct(); verifies > 0) {
      const int64_t drafted = c.handle().spec_draft_tokens(), accepted = c.handle().spec_accepted_tokens();
      meta["spec_verify_ct"] = verifies;
      meta["spec_draft_token_num"] = drafted;
      meta["spec_accept_token_num"] = accepted;
      meta["spec_accept_length"] = double(accepted + verifies) / double(verifies);
      meta["spec_accept_rate"] = drafted > 0 ? double(accepted) / double(drafted) : 0.0;
    }
    if (return_logprob) {
      ojson lp = ojson::array(), top = ojson::array();
      for (auto& s : c.sampled()) {
        lp.push_back(ojson::array({s.logprob, s.token, nullptr}));
        ojson alts = ojson::array();
        for (auto& [tid, v] : s.top) alts.push_back(ojson::array({v, tid, nullptr}));
        top.push_back(alts);
      }
      meta["output_token_logprobs"] = lp;
      if (top_n > 0) meta["output_top_logprobs"] = top;
    }
    return ojson{{"text", c.text()}, {"output_ids", c.output_ids()}, {"meta_info", meta}};
  };
  if (stream) {
    auto format = std::make_shared<GenerateFormat>();
    format->result = result;
    format->batched = batched;
    stream_events(res, choices, format, metrics, opt.keepalive_seconds);
    return;
  }
  respond_when_done(
      res, choices,
      [result, batched](Choices& choices) {
        if (!batched) return result(*choices[0]);
        ojson all = ojson::array();
        for (auto& c : choices) all.push_back(result(*c));
        return all;
      },
      metrics);
}

}  // namespace dsv4
