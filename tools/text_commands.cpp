// Text-layer subcommands (tokenize, detokenize, render, parse). Their
// interfaces are stable: test harnesses and people debugging prompts rely on
// them. Output is exact (no trailing newline after raw text) so it can be
// compared byte for byte.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "commands.h"
#include "text/chat_encoder.h"
#include "text/json_limits.h"
#include "text/output_parser.h"
#include "text/request_parsing.h"
#include "text/tokenizer.h"

namespace dsv4::tools {

namespace {

namespace fs = std::filesystem;
using text::ojson;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_raw(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

std::string ids_json(const std::vector<text::TokenId>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  return out + "]";
}

std::vector<text::TokenId> parse_ids(const std::string& spec) {
  std::string s = spec;
  for (char& c : s) {
    if (c == '[' || c == ']') c = ' ';
  }
  std::vector<text::TokenId> ids;
  std::string item;
  auto flush = [&] {
    const auto b = item.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) {
      item.clear();
      return;
    }
    const auto e = item.find_last_not_of(" \t\r\n");
    const std::string t = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(t, &used);
    } catch (...) {
      used = 0;
    }
    if (used != t.size() || v < 0 || v > INT32_MAX) throw std::runtime_error("invalid token id \"" + t + "\"");
    ids.push_back(static_cast<text::TokenId>(v));
    item.clear();
  };
  for (char c : s) {
    if (c == ',' || c == '\n') {
      flush();
    } else {
      item.push_back(c);
    }
  }
  flush();
  return ids;
}

fs::path model_tokenizer(const std::string& dir) {
  const fs::path p = fs::path(dir) / "tokenizer.json";
  if (!fs::is_regular_file(p)) {
    throw std::runtime_error("model directory " + dir +
                             " has no tokenizer.json (copy one, e.g. assets/dsv4-tokenizer/tokenizer.json)");
  }
  return p;
}

ojson model_config(const std::string& dir, bool required) {
  const fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(p)) {
    if (required) throw std::runtime_error("model directory " + dir + " has no config.json");
    return ojson::object();
  }
  try {
    return ojson::parse(read_file(p.string()));
  } catch (const ojson::parse_error& e) {
    throw std::runtime_error(p.string() + ": invalid JSON: " + e.what());
  }
}

text::EncoderProfile choose_profile(const std::string& dir, const std::string& profile_flag,
                                    const std::string& tool_parser_flag) {
  if (!profile_flag.empty()) {
    auto p = text::parse_profile_name(profile_flag);
    if (!p) throw std::runtime_error("unknown --profile '" + profile_flag + "' (v4, v4-0731, v41, v41-tiers)");
    return *p;
  }
  return text::select_profile(model_config(dir, true), tool_parser_flag, dir);
}

text::RenderOptions options_for(const std::string& semantics, text::EncoderProfile profile) {
  if (semantics == "reference") return text::RenderOptions::reference();
  if (semantics == "vllm") return text::RenderOptions::vllm();
  if (semantics == "sglang" || semantics == "server") return text::RenderOptions::from_environment(profile);
  throw std::runtime_error("unknown --semantics '" + semantics + "' (reference, sglang, vllm)");
}

// A golden case file carries the request under "request"; plain requests are
// used as they are.
ojson load_request(const std::string& path) {
  ojson j;
  try {
    j = text::parse_json_limited(read_file(path));
  } catch (const ojson::parse_error& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  } catch (const text::JsonDepthError& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (j.is_object() && !j.contains("messages") && j.contains("request") && j["request"].is_object())
    return j["request"];
  return j;
}

template <typename F>
void guarded(const char* name, int& exit_code, F&& body) {
  try {
    body();
    exit_code = 0;
  } catch (const text::EncoderError& e) {
    std::fprintf(stderr, "dsv4 %s: request error: %s\n", name, e.what());
    exit_code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4 %s: error: %s\n", name, e.what());
    exit_code = 1;
  }
}

}  // namespace

void register_text_commands(CLI::App& app, int& exit_code) {
  // tokenize ---------------------------------------------------------------
  {
    auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids (no BOS added), printed as a JSON array");
    auto tokenizer = std::make_shared<std::string>();
    auto text_arg = std::make_shared<std::string>();
    auto file_arg = std::make_shared<std::string>();
    cmd->add_option("--tokenizer", *tokenizer, "tokenizer.json")->required();
    auto* t = cmd->add_option("--text", *text_arg, "text to encode");
    auto* f = cmd->add_option("--file", *file_arg, "file whose bytes are encoded");
    t->excludes(f);
    cmd->callback([=, &exit_code] {
      guarded("tokenize", exit_code, [&] {
        if (t->count() == 0 && f->count() == 0) throw std::runtime_error("give --text or --file");
        const auto tok = text::Tokenizer::from_file(*tokenizer);
        const std::string input = f->count() ? read_file(*file_arg) : *text_arg;
        write_raw(ids_json(tok->encode(input)) + "\n");
      });
    });
  }
  // detokenize ---------------------------------------------------------------
  {
    auto* cmd = app.add_subcommand("detokenize", "Decode token ids (e.g. 1,2,3 or [1, 2, 3]) to text");
    auto tokenizer = std::make_shared<std::string>();
    auto ids = std::make_shared<std::string>();
    auto skip = std::make_shared<bool>(false);
    cmd->add_option("--tokenizer", *tokenizer, "tokenizer.json")->required();
    cmd->add_option("--ids", *ids, "comma-separated ids, a JSON array, or @FILE")->required();
    cmd->add_flag("--skip-special-tokens", *skip, "drop special added tokens (BOS/EOS/...)");
    cmd->callback([=, &exit_code] {
      guarded("detokenize", exit_code, [&] {
        const auto tok = text::Tokenizer::from_file(*tokenizer);
        const std::string spec = (!ids->empty() && (*ids)[0] == '@') ? read_file(ids->substr(1)) : *ids;
        write_raw(tok->decode(parse_ids(spec), *skip));
      });
    });
  }
  // render ---------------------------------------------------------------------
  {
    auto* cmd = app.add_subcommand("render", "Print the exact prompt for an OpenAI-style chat request");
    auto model = std::make_shared<std::string>();
    auto request = std::make_shared<std::string>();
    auto profile = std::make_shared<std::string>();
    auto semantics = std::make_shared<std::string>("reference");
    auto tool_parser = std::make_shared<std::string>();
    auto as_ids = std::make_shared<bool>(false);
    auto content_as_text = std::make_shared<bool>(false);
    cmd->add_option("--model", *model, "model directory (config.json; tokenizer.json for --ids)")->required();
    cmd->add_option("--request", *request, "request JSON (or a golden encoding case)")->required();
    cmd->add_option("--profile", *profile, "encoder profile: v4 | v4-0731 | v41 | v41-tiers");
    cmd->add_option("--tool-call-parser", *tool_parser, "picks the encoder like the server does");
    cmd->add_option("--semantics", *semantics,
                    "reference (encoder bytes, default) | sglang (the server's choices) | vllm");
    cmd->add_flag("--ids", *as_ids, "print token ids as a JSON array instead of the prompt");
    cmd->add_flag("--no-special-tokens-in-content", *content_as_text,
                  "with --ids: encode special-token text inside user-controlled content (user, tool, assistant "
                  "history, tool schemas) as plain text, as `dsv4 serve` does by default; the prompt string is "
                  "the same either way (docs/security-special-tokens.md)");
    cmd->callback([=, &exit_code] {
      guarded("render", exit_code, [&] {
        const auto prof = choose_profile(*model, *profile, *tool_parser);
        const auto opts = options_for(*semantics, prof);
        const auto rendered = text::render_chat_request(load_request(*request), prof, opts);
        for (const auto& w : rendered.warnings) std::fprintf(stderr, "dsv4 render: warning: %s\n", w.c_str());
        if (*as_ids) {
          const auto tok = text::Tokenizer::from_file(model_tokenizer(*model));
          write_raw(ids_json(*content_as_text ? tok->encode(rendered.prompt, rendered.content_spans)
                                              : tok->encode(rendered.prompt)) +
                    "\n");
        } else {
          write_raw(rendered.prompt);
        }
      });
    });
  }
  // parse ----------------------------------------------------------------------
  {
    auto* cmd = app.add_subcommand("parse",
                                   "Parse generated text into {reasoning_content, content, tool_calls, finish_reason}");
    auto model = std::make_shared<std::string>();
    auto request = std::make_shared<std::string>();
    auto text_file = std::make_shared<std::string>();
    auto reasoning_parser = std::make_shared<std::string>();
    auto tool_parser = std::make_shared<std::string>();
    auto profile = std::make_shared<std::string>();
    auto semantics = std::make_shared<std::string>("sglang");
    auto stop = std::make_shared<std::string>("eos");
    auto forward_unknown = std::make_shared<bool>(false);
    auto dsml_ends_reasoning = std::make_shared<std::string>("on");
    auto short_dialect = std::make_shared<std::string>("on");
    auto entities = std::make_shared<bool>(false);
    auto keep_after = std::make_shared<bool>(false);
    cmd->add_option("--model", *model, "model directory (config.json)")->required();
    cmd->add_option("--request", *request, "the chat request JSON the text answers (or a golden parsing case)")
        ->required();
    cmd->add_option("--text", *text_file, "file with the generated text (EOS text, if present, ends it)");
    cmd->add_option("--reasoning-parser", *reasoning_parser, "deepseek-v4 | deepseek-v41 | none");
    cmd->add_option("--tool-call-parser", *tool_parser, "deepseekv4 | deepseekv41 | none");
    cmd->add_option("--profile", *profile, "encoder profile override: v4 | v4-0731 | v41 | v41-tiers");
    cmd->add_option("--semantics", *semantics, "how the request was rendered: sglang (default) | reference | vllm");
    cmd->add_option("--stop", *stop, "why generation ended: eos | length | abort");
    cmd->add_flag("--forward-unknown-tools", *forward_unknown, "execute calls to undeclared tools");
    cmd->add_option("--dsml-ends-reasoning", *dsml_ends_reasoning, "on | off");
    cmd->add_option("--accept-short-dsml", *short_dialect, "on | off");
    cmd->add_flag("--decode-dsml-entities", *entities, "decode &lt; &gt; &amp; &quot; inside DSML");
    cmd->add_flag("--keep-text-after-tool-calls", *keep_after, "keep text after a closed block as content");
    cmd->callback([=, &exit_code] {
      guarded("parse", exit_code, [&] {
        ojson req;
        try {
          req = text::parse_json_limited(read_file(*request));
        } catch (const ojson::parse_error& e) {
          throw std::runtime_error(*request + ": invalid JSON: " + e.what());
        } catch (const text::JsonDepthError& e) {
          throw std::runtime_error(*request + ": " + e.what());
        }
        text::ParserConfig cfg;
        std::string raw;
        std::string stop_reason = *stop;
        text::EncoderProfile prof;
        auto on_off = [](const std::string& v, const char* flag) {
          if (v == "on" || v == "true" || v == "1") return true;
          if (v == "off" || v == "false" || v == "0") return false;
          throw std::runtime_error(std::string(flag) + " takes on|off");
        };
        cfg.options.dsml_ends_reasoning = on_off(*dsml_ends_reasoning, "--dsml-ends-reasoning");
        cfg.options.accept_short_dsml_dialect = on_off(*short_dialect, "--accept-short-dsml");
        if (req.is_object() && req.contains("prompt_ends_with") && req.contains("raw")) {
          // A golden parsing case: everything the parser needs is in it.
          prof = req.value("dialect", "v4") == "v41" ? text::EncoderProfile::V41 : text::EncoderProfile::V4Preview;
          cfg.starts_in_reasoning = req["prompt_ends_with"] == "<think>";
          cfg.tools_enabled = req.value("tools_enabled", false);
          if (req.contains("tools") && req["tools"].is_array()) {
            for (const auto& t : req["tools"]) {
              if (t.is_string()) cfg.tool_names.push_back(t.get<std::string>());
            }
          }
          if (req.contains("settings") && req["settings"].is_object()) {
            const auto& s = req["settings"];
            cfg.options.dsml_ends_reasoning = s.value("dsml_ends_reasoning", cfg.options.dsml_ends_reasoning);
            cfg.options.accept_short_dsml_dialect =
                s.value("accept_short_dsml_dialect", cfg.options.accept_short_dsml_dialect);
            cfg.options.decode_dsml_entities = s.value("decode_dsml_entities", cfg.options.decode_dsml_entities);
            cfg.options.forward_unknown_tools = s.value("forward_unknown_tools", cfg.options.forward_unknown_tools);
          }
          raw = req["raw"].get<std::string>();
          if (stop->empty() || *stop == "eos") stop_reason = req.value("stop", "eos");
        } else {
          if (req.is_object() && !req.contains("messages") && req.contains("request")) req = req["request"];
          prof = choose_profile(*model, *profile, *tool_parser);
          const auto rendered = text::render_chat_request(req, prof, options_for(*semantics, prof));
          // The same request-to-parser mapping as the server.
          const text::ParserConfig from_request =
              text::parser_config_for_request(req, prof, rendered.starts_in_reasoning, "", "");
          cfg.starts_in_reasoning = from_request.starts_in_reasoning;
          cfg.tools_enabled = from_request.tools_enabled;
          cfg.tool_names = from_request.tool_names;
          cfg.options.separate_reasoning = from_request.options.separate_reasoning;
        }
        if (!text_file->empty()) raw = read_file(*text_file);
        const std::string eos = "<｜end▁of▁sentence｜>";
        if (const auto p = raw.find(eos); p != std::string::npos) raw.resize(p);

        text::set_parser_kinds(cfg, prof, *reasoning_parser, *tool_parser);
        cfg.options.forward_unknown_tools = cfg.options.forward_unknown_tools || *forward_unknown;
        cfg.options.decode_dsml_entities = cfg.options.decode_dsml_entities || *entities;
        cfg.options.keep_text_after_tool_calls = *keep_after;
        text::StopReason reason = text::StopReason::Stop;
        if (stop_reason == "length") {
          reason = text::StopReason::Length;
        } else if (stop_reason == "abort") {
          reason = text::StopReason::Abort;
        } else if (stop_reason != "eos" && stop_reason != "stop") {
          throw std::runtime_error("--stop takes eos | length | abort");
        }
        const auto msg = text::parse_output(cfg, raw, reason);
        write_raw(msg.to_json().dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n");
      });
    });
  }
}

}  // namespace dsv4::tools
