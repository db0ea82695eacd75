// Constrained decoding for a request: response_format (json_object,
// json_schema), SGLang's regex / ebnf / json_schema parameters and forced tool
// calls become a grammar (text/grammar*.h) that the engine applies through its
// TokenConstraint interface (engine/constraint.h). See docs/structured-outputs.md.
#pragma once

#include <memory>

#include "engine/constraint.h"
#include "server/http_common.h"
#include "text/grammar_json.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace dsv4 {

// /v1/chat/completions: response_format, regex, ebnf, tool_choice required or
// named. With `starts_in_reasoning` the constraint starts after </think>.
// Null when the request has no constraint; 400 (BadRequest) naming what is
// not supported.
std::shared_ptr<const ConstraintFactory> chat_constraint(const ojson& body,
                                                         const std::shared_ptr<const text::Tokenizer>& tokenizer,
                                                         const text::ParserConfig& parser, bool starts_in_reasoning,
                                                         const text::JsonGrammarOptions& options);

// /v1/completions (the body) and /generate (its sampling_params):
// response_format, json_schema (a schema or its JSON text), regex, ebnf.
std::shared_ptr<const ConstraintFactory> completion_constraint(const ojson& fields,
                                                               const std::shared_ptr<const text::Tokenizer>& tokenizer,
                                                               const text::JsonGrammarOptions& options);

}  // namespace dsv4
