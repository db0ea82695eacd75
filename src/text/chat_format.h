// What the chat encoder (chat_encoder.cpp) and the request layer
// (chat_request.cpp) share inside the text module: the special tokens of the
// DeepSeek-V4 chat format and small JSON accessors with the reference's
// semantics.
#pragma once
#include <string>
#include <string_view>

#include "text/chat_encoder.h"
#include "text/pyjson.h"

namespace dsv4::text::chat_detail {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kImagePlaceholder = "<｜deepseek_image｜>";

inline const ojson& get_or_null(const ojson& obj, const char* key) {
  static const ojson null_value;
  if (!obj.is_object()) return null_value;
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

inline bool has_non_null(const ojson& obj, const char* key) { return !get_or_null(obj, key).is_null(); }

inline std::string str_of(const ojson& v, std::string_view what) {
  if (v.is_string()) return v.get<std::string>();
  throw EncoderError(std::string(what) + " must be a string");
}

// `content or ""` in the reference.
inline std::string content_or_empty(const ojson& msg) {
  const ojson& c = get_or_null(msg, "content");
  if (!python_truthy(c)) return "";
  if (c.is_string()) return c.get<std::string>();
  throw EncoderError("message content must be a string");
}

}  // namespace dsv4::text::chat_detail
