#include "server/structured_output.h"

#include "text/grammar_dsml.h"
#include "text/grammar_json.h"
#include "text/grammar_matcher.h"
#include "text/grammar_regex.h"

namespace dsv4 {

namespace {

// The engine's view of a text::GrammarMatcher (the mask layouts are the same).
class MatcherConstraint : public TokenConstraint {
 public:
  explicit MatcherConstraint(text::GrammarMatcher matcher) : matcher_(std::move(matcher)) {}
  bool fill_mask(TokenMask& mask) override { return matcher_.fill_mask(mask); }
  bool can_finish() const override { return matcher_.can_finish(); }
  bool accept(int32_t token) override { return matcher_.accept(token); }
  void rollback(int64_t n_tokens) override { matcher_.rollback(n_tokens); }
  int64_t max_rollback() const override { return int64_t(text::GrammarMatcher::kHistory); }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<MatcherConstraint>(*this); }

 private:
  text::GrammarMatcher matcher_;
};

class MatcherFactory : public ConstraintFactory {
 public:
  MatcherFactory(std::shared_ptr<const text::CompiledGrammar> grammar, int32_t activate_after, std::string trigger)
      : grammar_(std::move(grammar)), activate_after_(activate_after), trigger_(std::move(trigger)) {}
  std::unique_ptr<TokenConstraint> start() const override {
    return std::make_unique<MatcherConstraint>(text::GrammarMatcher(grammar_, activate_after_, trigger_));
  }

 private:
  std::shared_ptr<const text::CompiledGrammar> grammar_;
  int32_t activate_after_;
  std::string trigger_;
};

bool present(const ojson& j, const char* key) { return j.is_object() && j.contains(key) && !j[key].is_null(); }

// One grammar source of a request, before compiling: a cache key and how to build it.
struct GrammarSource {
  std::string what;  // for "at most one" errors
  std::string key;
  std::function<text::Grammar()> compile;
  std::string trigger = {};  // non-empty: the grammar starts after this text
};

GrammarSource schema_source(const std::string& what, const ojson& schema, const text::JsonGrammarOptions& options) {
  return {what, "json_schema\n" + schema.dump(),
          [schema, options] { return text::json_schema_grammar(schema, options); }};
}

// response_format, json_schema, regex, ebnf: at most one of them.
std::optional<GrammarSource> format_source(const ojson& fields, const text::JsonGrammarOptions& options) {
  std::vector<GrammarSource> found;
  if (const ojson* rf = present(fields, "response_format") ? &fields["response_format"] : nullptr) {
    const std::string type =
        rf->is_object() && rf->contains("type") && (*rf)["type"].is_string() ? (*rf)["type"].get<std::string>() : "";
    if (type == "json_object") {
      found.push_back({"response_format", "json_object", [options] { return text::json_object_grammar(options); }});
    } else if (type == "json_schema") {
      const ojson& spec = (*rf)["json_schema"];
      if (!spec.is_object()) throw BadRequest("'response_format.json_schema' must be an object");
      const ojson schema = present(spec, "schema") ? spec["schema"] : ojson::object();
      found.push_back(schema_source("response_format", schema, options));
    } else if (type == "structural_tag") {
      throw BadRequest(
          "'response_format.type' structural_tag is not supported (json_object, json_schema and text are)");
    } else if (type != "text" && !type.empty()) {
      throw BadRequest("'response_format.type' must be text, json_object or json_schema");
    }
  }
  if (present(fields, "json_schema")) {
    ojson schema = fields["json_schema"];
    if (schema.is_string()) {
      schema = ojson::parse(schema.get<std::string>(), nullptr, false);
      if (schema.is_discarded()) throw BadRequest("'json_schema' is not valid JSON");
    }
    found.push_back(schema_source("json_schema", schema, options));
  }
  if (present(fields, "regex")) {
    if (!fields["regex"].is_string()) throw BadRequest("'regex' must be a string");
    const std::string pattern = fields["regex"].get<std::string>();
    found.push_back({"regex", "regex\n" + pattern, [pattern] { return text::regex_grammar(pattern); }});
  }
  if (present(fields, "ebnf")) {
    if (!fields["ebnf"].is_string()) throw BadRequest("'ebnf' must be a string");
    const std::string ebnf = fields["ebnf"].get<std::string>();
    found.push_back({"ebnf", "ebnf\n" + ebnf, [ebnf] { return text::ebnf_grammar(ebnf); }});
  }
  if (found.size() > 1) throw BadRequest("give at most one of 'response_format', 'json_schema', 'regex' and 'ebnf'");
  if (found.empty()) return std::nullopt;
  return found[0];
}

// tool_choice "required" or a named function: the DSML block, forced.
// "auto" (or none given) with a strict tool: the block, once the model opens
// it, completes as valid DSML with arguments that match the strict schemas.
std::optional<GrammarSource> tool_source(const ojson& body, const text::ParserConfig& parser,
                                         const text::JsonGrammarOptions& options) {
  if (!present(body, "tools") || !body["tools"].is_array() || body["tools"].empty()) return std::nullopt;
  const ojson choice = present(body, "tool_choice") ? body["tool_choice"] : ojson("auto");
  std::string forced;
  bool triggered = false;
  if (choice.is_object()) {
    forced = choice["function"]["name"].get<std::string>();  // check_tool_choice checked the shape
  } else if (choice == "auto") {
    // Only for strict tools: the grammar writes arguments as a JSON body,
    // which a strict schema asks for; free tools keep the model's own format.
    for (const ojson& tool : body["tools"])
      triggered = triggered || (present(tool["function"], "strict") && tool["function"]["strict"].get<bool>());
    if (!triggered) return std::nullopt;
  } else if (choice != "required") {
    return std::nullopt;
  }
  std::vector<text::ToolGrammarSpec> specs;
  for (const ojson& tool : body["tools"]) {
    const ojson& fn = tool["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!forced.empty() && name != forced) continue;
    const bool strict = present(fn, "strict") && fn["strict"].get<bool>();
    specs.push_back({name, strict && present(fn, "parameters") ? ojson(fn["parameters"]) : ojson()});
  }
  const bool one =
      !forced.empty() || (present(body, "parallel_tool_calls") && body["parallel_tool_calls"].is_boolean() &&
                          !body["parallel_tool_calls"].get<bool>());
  const bool v41 = parser.tools == text::ToolParserKind::DeepSeekV41;
  ojson key = ojson::array();
  for (auto& s : specs) key.push_back({s.name, s.schema});
  return GrammarSource{triggered ? "tools" : "tool_choice",
                       std::string("tools\n") + (v41 ? "v41\n" : "v4\n") + (one ? "one\n" : "many\n") +
                           (triggered ? "triggered\n" : "") + key.dump(),
                       [specs, v41, one, options, triggered] {
                         return text::dsml_tool_call_grammar(specs, v41, one, options, /*after_opener=*/triggered);
                       },
                       triggered ? text::dsml_block_opener(v41) : ""};
}

std::shared_ptr<const ConstraintFactory> make_factory(const GrammarSource& source,
                                                      const std::shared_ptr<const text::Tokenizer>& tokenizer,
                                                      int32_t activate_after, const text::JsonGrammarOptions& options) {
  try {
    const std::string key = "max_string_chars=" + std::to_string(options.max_string_chars) + "\n" + source.key;
    auto grammar = text::cached_grammar(key, tokenizer, source.compile);
    grammar->warm_start();
    return std::make_shared<MatcherFactory>(std::move(grammar), activate_after, source.trigger);
  } catch (const text::GrammarError& e) {
    throw BadRequest("'" + source.what + "': " + e.what());
  }
}

}  // namespace

std::shared_ptr<const ConstraintFactory> chat_constraint(const ojson& body,
                                                         const std::shared_ptr<const text::Tokenizer>& tokenizer,
                                                         const text::ParserConfig& parser, bool starts_in_reasoning,
                                                         const text::JsonGrammarOptions& options) {
  std::optional<GrammarSource> format = format_source(body, options);
  std::optional<GrammarSource> tools = tool_source(body, parser, options);
  // A response format with strict tools under "auto": the format wins (the
  // content is the JSON; a tool call cannot also be guaranteed).
  if (format && tools && !tools->trigger.empty()) tools.reset();
  if (format && tools)
    throw BadRequest("a forced tool call ('tool_choice') cannot be combined with '" + format->what + "'");
  if (!format && !tools) return nullptr;
  // A reasoning turn thinks freely first; the grammar starts after </think>.
  const int32_t think_end = tokenizer->special_ids().think_end;
  return make_factory(format ? *format : *tools, tokenizer, starts_in_reasoning ? think_end : -1, options);
}

std::shared_ptr<const ConstraintFactory> completion_constraint(const ojson& fields,
                                                               const std::shared_ptr<const text::Tokenizer>& tokenizer,
                                                               const text::JsonGrammarOptions& options) {
  std::optional<GrammarSource> format = format_source(fields, options);
  return format ? make_factory(*format, tokenizer, -1, options) : nullptr;
}

}  // namespace dsv4
