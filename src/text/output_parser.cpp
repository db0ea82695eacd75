#include "text/output_parser.h"

#include <algorithm>
#include <initializer_list>
#include <random>

#include "text/dsml_syntax.h"
#include "text/json_limits.h"
#include "text/pyjson.h"
#include "text/utf8.h"

namespace dsv4::text {

using namespace dsml;

namespace {

constexpr std::string_view kThinkBegin = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

}  // namespace

void ParserDelta::append(ParserDelta&& other) {
  reasoning_content += other.reasoning_content;
  content += other.content;
  for (auto& t : other.tool_calls) tool_calls.push_back(std::move(t));
}

std::optional<ReasoningParserKind> parse_reasoning_parser_name(std::string_view name) {
  if (name == "deepseek-v4" || name == "deepseek_v4") return ReasoningParserKind::DeepSeekV4;
  if (name == "deepseek-v41" || name == "deepseek_v41") return ReasoningParserKind::DeepSeekV41;
  if (name == "none" || name.empty()) return ReasoningParserKind::None;
  return std::nullopt;
}

std::optional<ToolParserKind> parse_tool_parser_name(std::string_view name) {
  if (name == "deepseekv4") return ToolParserKind::DeepSeekV4;
  if (name == "deepseekv41") return ToolParserKind::DeepSeekV41;
  if (name == "none" || name.empty()) return ToolParserKind::None;
  return std::nullopt;
}

nlohmann::ordered_json ParsedMessage::to_json() const {
  nlohmann::ordered_json j;
  j["reasoning_content"] = reasoning_content ? nlohmann::ordered_json(*reasoning_content) : nullptr;
  j["content"] = content ? nlohmann::ordered_json(*content) : nullptr;
  if (tool_calls.empty()) {
    j["tool_calls"] = nullptr;
  } else {
    auto arr = nlohmann::ordered_json::array();
    for (size_t i = 0; i < tool_calls.size(); ++i) {
      nlohmann::ordered_json tc;
      tc["id"] = tool_calls[i].id;
      tc["index"] = i;
      tc["type"] = "function";
      tc["function"] = {{"name", tool_calls[i].name}, {"arguments", tool_calls[i].arguments}};
      arr.push_back(std::move(tc));
    }
    j["tool_calls"] = std::move(arr);
  }
  j["finish_reason"] = finish_reason;
  if (tool_call_error) j["tool_call_error"] = *tool_call_error;
  return j;
}

struct OutputParser::Impl {
  ParserConfig cfg;
  DsmlTags tags;
  std::mt19937_64 rng;

  // Reasoning stage.
  bool reasoning_active = false;  // a reasoning parser is configured
  bool in_reasoning = false;
  std::string rbuf;
  std::vector<std::string> reasoning_markers;   // searched while in reasoning
  std::vector<std::string> reasoning_holdback;  // prefixes held back while in reasoning
  std::vector<std::string> content_markers;     // think tags found in content

  // Tool stage.
  enum class ToolState { Disabled, Text, Block, Done, Failed } tstate = ToolState::Disabled;
  std::string tbuf;                          // Text: unreleased content; Block: unparsed block text
  std::string raw_block;                     // separator + block text, for the malformed fallback
  std::vector<std::string> opener_patterns;  // with and without the "\n\n" separator
  std::vector<std::string> openers;
  std::vector<std::string> value_ends;  // the tags that end a parameter value
  bool implicit_block = false;
  // The invoke being parsed: its header went out when its tag was complete,
  // its arguments go out a parameter (or a JSON body member) at a time.
  struct OpenInvoke {
    bool open = false;
    ToolCall call;                  // arguments: the JSON text sent so far
    std::vector<std::string> keys;  // parameter names so far (duplicates are malformed)
    size_t scanned = 0;             // bytes already searched for a close tag, so long values are scanned once
    // A string parameter streamed while it grows: its `"key": "` and this many
    // bytes of its raw value went out; the rest and the quote at its close.
    bool value_open = false;
    size_t value_sent = 0;
    // A JSON object body instead of parameter tags: where its scan stands.
    bool json_body = false;
    size_t json_pos = 0, json_member = 0;
    int json_depth = 0;
    bool json_in_string = false, json_escaped = false;
  } invoke;

  // Emission.
  std::string pending_reasoning_utf8, pending_content_utf8;
  std::string reasoning_all, content_all;
  ParsedMessage msg;
  bool finished = false;

  explicit Impl(ParserConfig c) : cfg(std::move(c)) {
    rng.seed(cfg.id_seed ? cfg.id_seed : std::random_device{}());
    reasoning_active = cfg.reasoning != ReasoningParserKind::None && cfg.options.separate_reasoning;
    in_reasoning = reasoning_active && cfg.starts_in_reasoning;
    const bool tools_on = cfg.tools_enabled && cfg.tools != ToolParserKind::None;
    tags = tags_for(cfg.tools == ToolParserKind::None ? ToolParserKind::DeepSeekV4 : cfg.tools,
                    cfg.options.accept_short_dsml_dialect);
    reasoning_markers = {std::string(kThinkEnd), std::string(kThinkBegin)};
    if (tools_on && cfg.options.dsml_ends_reasoning) {
      const bool v41 = cfg.tools == ToolParserKind::DeepSeekV41;
      reasoning_markers.push_back(v41 ? "<｜DSML｜ " : "<｜DSML｜");
      if (cfg.options.accept_short_dsml_dialect) reasoning_markers.push_back(v41 ? "<DSML｜ " : "<DSML｜");
    }
    reasoning_holdback = reasoning_markers;
    for (size_t i = 2; i < reasoning_markers.size(); ++i) reasoning_holdback.push_back("\n\n" + reasoning_markers[i]);
    content_markers = {std::string(kThinkEnd), std::string(kThinkBegin)};
    for (const auto* list : {&tags.param_close, &tags.invoke_close, &tags.block_close})
      value_ends.insert(value_ends.end(), list->begin(), list->end());
    if (tools_on) {
      tstate = ToolState::Text;
      openers = tags.block_open;
      for (const auto& o : tags.invoke_open) openers.push_back(o);
      for (const auto& o : openers) {
        opener_patterns.push_back(o);
        opener_patterns.push_back("\n\n" + o);
      }
    }
  }

  std::string new_call_id() {
    static const char* hex = "0123456789abcdef";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id.push_back(hex[rng() & 15]);
    return id;
  }

  // Releases text on a channel without splitting a UTF-8 sequence.
  static void release(std::string& pending, std::string_view text, std::string& out, bool final) {
    pending.append(text);
    const size_t n = final ? pending.size() : utf8::complete_prefix_length(pending);
    out.append(pending, 0, n);
    pending.erase(0, n);
  }

  void emit_reasoning(std::string_view text, ParserDelta& d, bool final) {
    std::string out;
    release(pending_reasoning_utf8, text, out, final);
    reasoning_all += out;
    d.reasoning_content += out;
  }

  void emit_content(std::string_view text, ParserDelta& d, bool final) {
    std::string out;
    release(pending_content_utf8, text, out, final);
    content_all += out;
    d.content += out;
  }

  // ---- reasoning stage ---------------------------------------------------

  // Think tags are interpreted in content only until a tool-call block
  // starts: inside DSML they are argument data.
  bool tool_takes_think_tags() const { return tstate == ToolState::Disabled || tstate == ToolState::Text; }

  void reasoning_feed(std::string_view text, ParserDelta& d, bool final) {
    if (!reasoning_active) {
      tool_feed(text, d, final);
      return;
    }
    rbuf.append(text);
    while (true) {
      if (!in_reasoning && !tool_takes_think_tags()) {
        std::string rest = std::move(rbuf);
        rbuf.clear();
        tool_feed(rest, d, final);
        return;
      }
      const auto& markers = in_reasoning ? reasoning_markers : content_markers;
      const Found f = find_first(rbuf, markers);
      if (f.pos == std::string::npos) break;
      const std::string m = markers[f.marker];
      if (in_reasoning) {
        std::string_view before(rbuf.data(), f.pos);
        if (f.marker >= 2) {
          // Implicit end of reasoning at a DSML marker: the separator and the
          // marker go on to the tool parser as content.
          size_t sep = 0;
          if (before.size() >= 2 && before.substr(before.size() - 2) == "\n\n") sep = 2;
          emit_reasoning(before.substr(0, before.size() - sep), d, true);
          in_reasoning = false;
          rbuf.erase(0, f.pos - sep);
          continue;
        }
        emit_reasoning(before, d, true);
        in_reasoning = m == kThinkBegin;  // an echoed <think> is just dropped
        rbuf.erase(0, f.pos + m.size());
      } else {
        std::string before = rbuf.substr(0, f.pos);
        rbuf.erase(0, f.pos);
        tool_feed(before, d, false);
        if (!tool_takes_think_tags()) continue;     // the tag is inside a DSML block
        if (m == kThinkBegin) in_reasoning = true;  // another think block; a stray </think> is dropped
        rbuf.erase(0, m.size());
      }
    }
    if (final) {
      std::string rest = std::move(rbuf);
      rbuf.clear();
      if (in_reasoning) {
        emit_reasoning(rest, d, true);
        tool_feed("", d, true);
      } else {
        tool_feed(rest, d, true);
      }
      return;
    }
    const size_t hold = pending_marker_suffix(rbuf, in_reasoning ? reasoning_holdback : content_markers);
    std::string ready = rbuf.substr(0, rbuf.size() - hold);
    rbuf.erase(0, ready.size());
    if (in_reasoning) {
      emit_reasoning(ready, d, false);
    } else {
      tool_feed(ready, d, false);
    }
  }

  // ---- tool stage ----------------------------------------------------------

  void fail(const std::string& reason, ParserDelta& d) {
    if (!msg.tool_call_error) msg.tool_call_error = reason;
    if (!msg.tool_calls.empty() || invoke.open) msg.stream_error = true;
    invoke.open = false;
    tstate = ToolState::Failed;
    // The block could not be parsed: it is ordinary text after all.
    std::string text = std::move(raw_block);
    raw_block.clear();
    tbuf.clear();
    emit_content(text, d, false);
  }

  void tool_feed(std::string_view text, ParserDelta& d, bool final) {
    switch (tstate) {
      case ToolState::Disabled:
      case ToolState::Failed: emit_content(text, d, final); return;
      case ToolState::Done:
        if (cfg.options.keep_text_after_tool_calls) {
          emit_content(text, d, final);
        } else if (final) {
          emit_content("", d, true);
        }
        return;
      case ToolState::Text:
        tbuf.append(text);
        text_step(d, final);
        return;
      case ToolState::Block:
        tbuf.append(text);
        raw_block.append(text);
        block_step(d, final);
        return;
    }
  }

  void text_step(ParserDelta& d, bool final) {
    const Found f = find_first(tbuf, openers);
    if (f.pos != std::string::npos) {
      std::string_view before(tbuf.data(), f.pos);
      std::string sep;
      if (before.size() >= 2 && before.substr(before.size() - 2) == "\n\n") {
        sep = "\n\n";
        before.remove_suffix(2);
      }
      emit_content(before, d, true);
      const std::string& opener = openers[f.marker];
      implicit_block = f.marker >= tags.block_open.size();
      raw_block = sep + tbuf.substr(f.pos);
      tbuf = implicit_block ? tbuf.substr(f.pos) : tbuf.substr(f.pos + opener.size());
      tstate = ToolState::Block;
      block_step(d, final);
      return;
    }
    if (final) {
      emit_content(tbuf, d, true);
      tbuf.clear();
      return;
    }
    const size_t hold = pending_marker_suffix(tbuf, opener_patterns);
    emit_content(std::string_view(tbuf.data(), tbuf.size() - hold), d, false);
    tbuf.erase(0, tbuf.size() - hold);
  }

  void block_step(ParserDelta& d, bool final) {
    while (tstate == ToolState::Block) {
      if (invoke.open) {
        if (!invoke_step(d)) break;
        continue;
      }
      size_t i = 0;
      while (i < tbuf.size() && is_ws(tbuf[i])) ++i;
      std::string_view rest(tbuf.data() + i, tbuf.size() - i);
      size_t len = 0;
      if (rest.empty()) break;
      if (starts_with_any(rest, tags.block_close, &len)) {
        tstate = ToolState::Done;
        std::string after = tbuf.substr(i + len);
        tbuf.clear();
        raw_block.clear();
        if (cfg.options.keep_text_after_tool_calls) emit_content(after, d, false);
        break;
      }
      if (starts_with_any(rest, tags.invoke_open, &len)) {
        const size_t header_len = open_invoke(rest.substr(len), d);
        if (header_len == 0) break;  // incomplete tag, or failed
        tbuf.erase(0, i + len + header_len);
        continue;
      }
      if (is_proper_prefix_of_any(rest, tags.block_close) || is_proper_prefix_of_any(rest, tags.invoke_open)) break;
      if (implicit_block && !msg.tool_calls.empty()) {
        // No wrapper: the invokes ended; what follows is not part of a block.
        tstate = ToolState::Done;
        std::string after = std::move(tbuf);
        tbuf.clear();
        raw_block.clear();
        if (cfg.options.keep_text_after_tool_calls) emit_content(after, d, false);
        break;
      }
      fail("invalid tool call", d);
      return;
    }
    if (final && tstate == ToolState::Block) {
      bool only_ws = std::all_of(tbuf.begin(), tbuf.end(), is_ws);
      if (!invoke.open && !msg.tool_calls.empty() && only_ws) {
        tstate = ToolState::Done;  // a missing final close tag is tolerated
        raw_block.clear();
        tbuf.clear();
      } else {
        fail("unterminated tool call", d);
      }
    }
  }

  // ---- one invoke, streamed as it is parsed --------------------------------

  // `after`: the text right after an invoke opener. Once the tag is complete
  // and names a known tool, the call's header goes out; returns the tag's
  // length then, 0 while it is incomplete or when it failed.
  size_t open_invoke(std::string_view after, ParserDelta& d) {
    if (after.empty()) return 0;
    if (!(is_ws(after[0]) || after[0] == '>')) {
      fail("invalid tool call", d);
      return 0;
    }
    std::vector<std::pair<std::string, std::string>> attrs;
    const size_t header_len = parse_attributes(after, attrs);
    if (header_len == kNeedMore) {
      if (after.size() > kMaxTagBytes) fail("invalid tool call", d);
      return 0;
    }
    const std::string* name_attr = header_len == std::string_view::npos ? nullptr : attr(attrs, "name");
    if (!name_attr || name_attr->empty()) {
      fail("invalid tool call", d);
      return 0;
    }
    const std::string name = cfg.options.decode_dsml_entities ? decode_entities(*name_attr) : *name_attr;
    if (!cfg.options.forward_unknown_tools && !cfg.tool_names.empty() &&
        std::find(cfg.tool_names.begin(), cfg.tool_names.end(), name) == cfg.tool_names.end()) {
      fail("unknown tool", d);
      return 0;
    }
    invoke = OpenInvoke{};
    invoke.open = true;
    invoke.call = ToolCall{new_call_id(), utf8::to_valid_lossy(name), ""};
    ToolCallDelta header;
    header.index = static_cast<int>(msg.tool_calls.size());
    header.id = invoke.call.id;
    header.name = invoke.call.name;
    d.tool_calls.push_back(std::move(header));
    return header_len;
  }

  void emit_arguments(std::string piece, ParserDelta& d, bool closes = false) {
    invoke.call.arguments += piece;
    ToolCallDelta fragment;
    fragment.index = static_cast<int>(msg.tool_calls.size());
    fragment.arguments = std::move(piece);
    fragment.closes = closes;
    d.tool_calls.push_back(std::move(fragment));
  }

  // One member of the arguments object, `"key": value` with the separators
  // of Python's json.dumps, so that the fragments add up to the JSON text the
  // whole call has always had.
  bool emit_member(const std::string& key, const std::string& value_json, ParserDelta& d) {
    if (std::find(invoke.keys.begin(), invoke.keys.end(), key) != invoke.keys.end()) {
      fail("duplicate parameter name", d);
      return false;
    }
    std::string piece = invoke.keys.empty() ? "{" : ", ";
    piece += python_json_dumps(utf8::to_valid_lossy(key)) + ": " + value_json;
    invoke.keys.push_back(key);
    emit_arguments(std::move(piece), d);
    return true;
  }

  void close_invoke(ParserDelta& d) {
    emit_arguments(invoke.call.arguments.empty() ? "{}" : "}", d, true);
    msg.tool_calls.push_back(std::move(invoke.call));
    invoke.open = false;
  }

  // Parses what follows in the open invoke (tbuf): a parameter, the close
  // tag, or the start of a JSON body. False while waiting for text or after
  // a failure.
  bool invoke_step(ParserDelta& d) {
    if (invoke.json_body) return json_body_step(d);
    size_t i = 0;
    while (i < tbuf.size() && is_ws(tbuf[i])) ++i;
    std::string_view rest(tbuf.data() + i, tbuf.size() - i);
    if (rest.empty()) return false;
    size_t len = 0;
    if (starts_with_any(rest, tags.invoke_close, &len)) {
      close_invoke(d);
      tbuf.erase(0, i + len);
      return true;
    }
    if (starts_with_any(rest, tags.param_open, &len)) {
      size_t consumed = 0;
      if (!parameter(rest.substr(len), d, &consumed)) return false;
      tbuf.erase(0, i + len + consumed);
      return true;
    }
    if (invoke.keys.empty() && rest[0] == '{') {
      // A JSON object body instead of parameter tags (SGLang V4.1 grammar
      // mode, and this engine's constrained tool calls).
      tbuf.erase(0, i);
      invoke.json_body = true;
      return true;
    }
    if (is_proper_prefix_of_any(rest, tags.invoke_close) || is_proper_prefix_of_any(rest, tags.param_open))
      return false;
    fail("invalid tool call", d);
    return false;
  }

  // `after`: the text right after a parameter opener. A parameter ends at its
  // close tag; an invoke or block close tag before it makes the call malformed.
  bool parameter(std::string_view after, ParserDelta& d, size_t* consumed) {
    if (after.empty()) return false;
    if (!is_ws(after[0])) {
      fail("invalid tool call", d);
      return false;
    }
    std::vector<std::pair<std::string, std::string>> pattrs;
    const size_t header_len = parse_attributes(after, pattrs);
    if (header_len == kNeedMore) {
      if (after.size() > kMaxTagBytes) fail("invalid tool call", d);
      return false;
    }
    const std::string* key = header_len == std::string_view::npos ? nullptr : attr(pattrs, "name");
    if (!key) {
      fail("invalid tool call", d);
      return false;
    }
    // Resume the close-tag search where the previous feed stopped, so a long
    // value streamed in small chunks is scanned once, not per chunk.
    const size_t from = std::max(header_len, invoke.scanned > 64 ? invoke.scanned - 64 : size_t{0});
    const TagHit end = find_earliest(after, from, {&tags.param_close, &tags.invoke_close, &tags.block_close});
    const bool ent = cfg.options.decode_dsml_entities;
    const std::string* is_str = attr(pattrs, "string");
    const bool string_param = !is_str || *is_str != "false";
    if (end.pos == std::string_view::npos) {
      invoke.scanned = after.size();
      // A string value streams as it grows (not with entity decoding, where
      // a cut could fall inside an entity).
      if (string_param && !ent) stream_value(*key, after.substr(header_len), d);
      return false;
    }
    invoke.scanned = 0;
    if (end.list != 0) {
      fail("invalid tool call", d);
      return false;
    }
    if (invoke.value_open) {
      emit_arguments(
          json_string_body(after.substr(header_len + invoke.value_sent, end.pos - header_len - invoke.value_sent)) +
              "\"",
          d);
      invoke.value_open = false;
      invoke.value_sent = 0;
      *consumed = end.pos + end.len;
      return true;
    }
    std::string value(after.substr(header_len, end.pos - header_len));
    if (ent) value = decode_entities(value);
    // Non-string values are inserted as written when they are JSON (the
    // official parser does so); otherwise, leniently, as a string.
    // nlohmann's lexer takes a NUL byte for the end of its input, so
    // "null\0junk" would pass as JSON: values with NULs are strings.
    const bool verbatim = !string_param && value.find('\0') == std::string::npos && utf8::is_valid(value) &&
                          nlohmann::json::accept(value);
    if (!emit_member(ent ? decode_entities(*key) : *key,
                     verbatim ? value : python_json_dumps(utf8::to_valid_lossy(value)), d))
      return false;
    *consumed = end.pos + end.len;
    return true;
  }

  // JSON string text of `raw` without its quotes: escaping is per character,
  // so pieces cut at UTF-8 boundaries add up to the whole value's.
  static std::string json_string_body(std::string_view raw) {
    const std::string quoted = python_json_dumps(utf8::to_valid_lossy(raw));
    return quoted.substr(1, quoted.size() - 2);
  }

  // Sends what can no longer change of a growing string value: not a suffix
  // that may be the start of a close tag, nor an unfinished UTF-8 sequence.
  void stream_value(const std::string& key, std::string_view value, ParserDelta& d) {
    std::string_view ready = value.substr(0, value.size() - pending_marker_suffix(value, value_ends));
    ready.remove_prefix(std::min(invoke.value_sent, ready.size()));
    ready = ready.substr(0, utf8::stable_prefix_length(ready));
    if (!invoke.value_open) {
      // A repeated name waits for its close tag, which decides the failure's
      // reason (a malformed value comes first) whatever the chunking.
      if (std::find(invoke.keys.begin(), invoke.keys.end(), key) != invoke.keys.end()) return;
      std::string piece = invoke.keys.empty() ? "{" : ", ";
      piece += python_json_dumps(utf8::to_valid_lossy(key)) + ": \"" + json_string_body(ready);
      invoke.keys.push_back(key);
      invoke.value_open = true;
      emit_arguments(std::move(piece), d);
    } else if (!ready.empty()) {
      emit_arguments(json_string_body(ready), d);
    }
    invoke.value_sent += ready.size();
  }

  // A JSON object body (tbuf starts at its '{'): each top-level member goes
  // out when the ',' or '}' after it arrives; at the invoke's close tag the
  // whole body must parse, and its Python-style dump must be what was sent.
  bool json_body_step(ParserDelta& d) {
    OpenInvoke& in = invoke;
    const TagHit end =
        find_earliest(tbuf, in.scanned > 64 ? in.scanned - 64 : 0, {&tags.invoke_close, &tags.block_close});
    // No terminator can lie inside a tag, so scanning up to the first tag
    // (or the end of the text so far) never depends on how the text was cut.
    const size_t limit = end.pos == std::string_view::npos ? tbuf.size() : end.pos;
    for (; in.json_pos < limit; ++in.json_pos) {
      const char c = tbuf[in.json_pos];
      if (in.json_in_string) {
        if (in.json_escaped) {
          in.json_escaped = false;
        } else if (c == '\\') {
          in.json_escaped = true;
        } else if (c == '"') {
          in.json_in_string = false;
        }
        continue;
      }
      if (in.json_depth == 0) {
        if (in.json_pos == 0) in.json_depth = 1, in.json_member = 1;
        continue;  // after the body only whitespace may follow: the final parse checks it
      }
      if (c == '"') {
        in.json_in_string = true;
      } else if (c == '{' || c == '[') {
        ++in.json_depth;
      } else if (c == ']' && in.json_depth == 1) {
        fail("invalid tool call", d);
        return false;
      } else if ((c == ',' || c == '}') && in.json_depth == 1) {
        if (!json_member(std::string_view(tbuf).substr(in.json_member, in.json_pos - in.json_member), c == '}', d))
          return false;
        in.json_member = in.json_pos + 1;
        if (c == '}') in.json_depth = 0;
      } else if (c == '}' || c == ']') {
        --in.json_depth;
      }
    }
    if (end.pos == std::string_view::npos) {
      in.scanned = tbuf.size();
      return false;
    }
    if (end.list != 0) {
      fail("invalid tool call", d);
      return false;
    }
    try {
      const auto obj = parse_json_limited(std::string_view(tbuf).substr(0, end.pos));
      if (!obj.is_object()) throw std::runtime_error("not an object");
      const std::string sent = in.call.arguments + (in.call.arguments.empty() ? "{}" : "}");
      if (in.json_depth != 0 || python_json_dumps(obj) != sent) throw std::runtime_error("not what was streamed");
    } catch (const std::exception&) {
      fail("invalid tool call", d);
      return false;
    }
    close_invoke(d);
    tbuf.erase(0, end.pos + end.len);
    return true;
  }

  // One top-level member of a JSON body; empty only as the whole of `{}`.
  bool json_member(std::string_view text, bool last, ParserDelta& d) {
    if (std::all_of(text.begin(), text.end(), is_ws)) {
      if (last && invoke.keys.empty()) return true;
      fail("invalid tool call", d);
      return false;
    }
    std::string key, value_json;
    try {
      const auto obj = parse_json_limited("{" + std::string(text) + "}");
      if (obj.size() != 1) throw std::runtime_error("not one member");
      key = obj.begin().key();
      value_json = python_json_dumps(obj.begin().value());
    } catch (const std::exception&) {
      fail("invalid tool call", d);
      return false;
    }
    return emit_member(key, value_json, d);
  }

  void settle(StopReason reason) {
    msg.reasoning_content = reasoning_all.empty() ? std::nullopt : std::optional<std::string>(reasoning_all);
    if (msg.stream_error) {
      // Non-streamed view of a block that failed after headers went out:
      // no calls, the text as it was generated (policy 2).
      msg.tool_calls.clear();
    }
    msg.content = content_all.empty() ? std::nullopt : std::optional<std::string>(content_all);
    switch (reason) {
      case StopReason::Abort: msg.finish_reason = "abort"; break;
      case StopReason::Length: msg.finish_reason = msg.tool_calls.empty() ? "length" : "tool_calls"; break;
      case StopReason::Stop: msg.finish_reason = msg.tool_calls.empty() ? "stop" : "tool_calls"; break;
    }
  }
};

OutputParser::OutputParser(ParserConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

ParserDelta OutputParser::feed(std::string_view text) noexcept {
  ParserDelta d;
  if (impl_->finished) return d;
  try {
    impl_->reasoning_feed(text, d, false);
  } catch (...) {
    // Allocation failure is the only thing that can get here; keep the text.
    d.content.append(text);
  }
  return d;
}

ParserDelta OutputParser::finish(StopReason reason) noexcept {
  ParserDelta d;
  if (impl_->finished) return d;
  try {
    impl_->reasoning_feed("", d, true);
    impl_->emit_reasoning("", d, true);
    impl_->emit_content("", d, true);
    impl_->settle(reason);
  } catch (...) {
  }
  impl_->finished = true;
  return d;
}

const ParsedMessage& OutputParser::message() const noexcept { return impl_->msg; }

ParsedMessage parse_output(const ParserConfig& config, std::string_view text, StopReason reason) {
  OutputParser p(config);
  p.feed(text);
  p.finish(reason);
  return p.message();
}

}  // namespace dsv4::text
