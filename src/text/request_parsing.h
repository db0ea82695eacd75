// How a chat request and the server's parser flags choose the output parsers
// (shared by `dsv4 parse` and the server, so both answer alike).
#pragma once
#include <string_view>

#include "text/chat_encoder.h"
#include "text/output_parser.h"

namespace dsv4::text {

// Sets cfg.reasoning / cfg.tools from the --reasoning-parser /
// --tool-call-parser values ("" or "auto" = the profile's own parsers).
// Throws std::runtime_error for an unknown name.
void set_parser_kinds(ParserConfig& cfg, EncoderProfile profile, std::string_view reasoning_parser,
                      std::string_view tool_parser);

// reasoning_parser / tool_parser: the server flags ("" = from the profile,
// "none" = off). Throws std::runtime_error for an unknown parser name.
ParserConfig parser_config_for_request(const ojson& request, EncoderProfile profile, bool starts_in_reasoning,
                                       std::string_view reasoning_parser, std::string_view tool_parser);

}  // namespace dsv4::text
