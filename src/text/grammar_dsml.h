// The DSML tool-call block as a grammar (SGLang's structural tag for DeepSeek),
// for tool_choice "required" and a named function: what the model writes then
// always parses into tool calls (output_parser.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/grammar.h"
#include "text/grammar_json.h"

namespace dsv4::text {

struct ToolGrammarSpec {
  std::string name;
  // The arguments' JSON Schema when the tool is strict; null: any JSON object.
  nlohmann::ordered_json schema;
};

// "\n\n<｜DSML｜tool_calls>\n" (V4.1: " calls"), then invokes of the given tools
// (one when `exactly_one`, else one or more), each
// "<｜DSML｜invoke name=\"NAME\">\n" + a JSON object + "\n</｜DSML｜invoke>\n",
// then the block's close tag. The arguments are a JSON object body rather than
// parameter tags: the parser accepts both, and JSON is where schemas apply
// (SGLang's V4.1 grammar does the same).
// `after_opener`: the block from right after its opener (for a constraint
// triggered by the opener, tool_choice "auto").
Grammar dsml_tool_call_grammar(const std::vector<ToolGrammarSpec>& tools, bool v41, bool exactly_one,
                               const JsonGrammarOptions& options = {}, bool after_opener = false);
// The block opener, "<｜DSML｜tool_calls>" (V4.1: "<｜DSML｜ calls>").
std::string dsml_block_opener(bool v41);

}  // namespace dsv4::text
