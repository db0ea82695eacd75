#include "text/request_parsing.h"

#include <stdexcept>
#include <string>

namespace dsv4::text {

void set_parser_kinds(ParserConfig& cfg, EncoderProfile profile, std::string_view reasoning_parser,
                      std::string_view tool_parser) {
  const bool v41 = is_v41(profile);
  if (reasoning_parser.empty() || reasoning_parser == "auto") {
    cfg.reasoning = v41 ? ReasoningParserKind::DeepSeekV41 : ReasoningParserKind::DeepSeekV4;
  } else {
    auto k = parse_reasoning_parser_name(reasoning_parser);
    if (!k) throw std::runtime_error("unknown --reasoning-parser '" + std::string(reasoning_parser) + "'");
    cfg.reasoning = *k;
  }
  if (tool_parser.empty() || tool_parser == "auto") {
    cfg.tools = v41 ? ToolParserKind::DeepSeekV41 : ToolParserKind::DeepSeekV4;
  } else {
    auto k = parse_tool_parser_name(tool_parser);
    if (!k) throw std::runtime_error("unknown --tool-call-parser '" + std::string(tool_parser) + "'");
    cfg.tools = *k;
  }
}

ParserConfig parser_config_for_request(const ojson& req, EncoderProfile profile, bool starts_in_reasoning,
                                       std::string_view reasoning_parser, std::string_view tool_parser) {
  ParserConfig cfg;
  set_parser_kinds(cfg, profile, reasoning_parser, tool_parser);
  cfg.starts_in_reasoning = starts_in_reasoning;
  const ojson tools = req.contains("tools") ? req["tools"] : ojson();
  const bool choice_none = req.contains("tool_choice") && req["tool_choice"] == "none";
  cfg.tools_enabled = tools.is_array() && !tools.empty() && !choice_none;
  if (cfg.tools_enabled)
    for (const auto& t : tools)
      if (t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].contains("name") &&
          t["function"]["name"].is_string())
        cfg.tool_names.push_back(t["function"]["name"].get<std::string>());
  if (req.contains("separate_reasoning") && req["separate_reasoning"].is_boolean())
    cfg.options.separate_reasoning = req["separate_reasoning"].get<bool>();
  return cfg;
}

}  // namespace dsv4::text
