#include "text/grammar_dsml.h"

#include "text/grammar_json.h"

namespace dsv4::text {

std::string dsml_block_opener(bool v41) { return v41 ? "<｜DSML｜ calls>" : "<｜DSML｜tool_calls>"; }

Grammar dsml_tool_call_grammar(const std::vector<ToolGrammarSpec>& tools, bool v41, bool exactly_one,
                               const JsonGrammarOptions& options, bool after_opener) {
  if (tools.empty()) throw GrammarError("no tool to call");
  const std::string dsml = "｜DSML｜";
  const std::string block = v41 ? " calls" : "tool_calls", invoke = v41 ? " invoke" : "invoke";
  GrammarBuilder b;
  std::vector<GrammarBuilder::Sequence> invokes;
  for (const ToolGrammarSpec& tool : tools) {
    // The name sits inside a quoted attribute the parser reads up to '"'.
    if (tool.name.empty() || tool.name.find_first_of("\"<>\n") != std::string::npos)
      throw GrammarError("tool name '" + tool.name + "' cannot be forced (empty, or with '\"', '<', '>' or a newline)");
    uint32_t arguments;
    try {
      arguments = tool.schema.is_null() ? add_any_json_object(b, options) : add_json_schema(b, tool.schema, options);
    } catch (const GrammarError& e) {
      throw GrammarError("tool '" + tool.name + "': " + e.what());
    }
    invokes.push_back(b.literal("<" + dsml + invoke + " name=\"" + tool.name + "\">\n") +
                      GrammarBuilder::Sequence{GrammarBuilder::call(arguments)} +
                      b.literal("\n</" + dsml + invoke + ">\n"));
  }
  const GrammarBuilder::Symbol one = b.choice(invokes, "invoke");
  const GrammarBuilder::Symbol calls = exactly_one ? one : b.repeat({one}, 1, -1, {}, "invokes");
  const uint32_t root = b.new_rule("tool_calls");
  b.add_alternative(root, b.literal((after_opener ? "" : "\n\n" + dsml_block_opener(v41)) + "\n") +
                              GrammarBuilder::Sequence{calls} + b.literal("</" + dsml + block + ">"));
  return b.build(root);
}

}  // namespace dsv4::text
