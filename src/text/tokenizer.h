// Byte-level BPE tokenizer compatible with Hugging Face `tokenizers` for the
// DeepSeek family (tokenizer.json with Split regex pre-tokenizers, ByteLevel,
// BPE merges and added tokens). Output must be identical to the Rust
// reference for every input, because prompt token ids decide what the model
// sees and whether a prefix cache hits.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

using TokenId = int32_t;

// A half-open byte range [begin, end) of a string.
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TextSpan&) const = default;
};

// Ids of the strings the engine relies on, resolved by string at load time so
// that a checkpoint with a different numbering still works. A missing entry is
// -1 (e.g. <｜System｜> does not exist in the V4 tokenizer).
struct SpecialTokenIds {
  TokenId bos = -1;              // <｜begin▁of▁sentence｜>
  TokenId eos = -1;              // <｜end▁of▁sentence｜>
  TokenId pad = -1;              // <｜▁pad▁｜>
  TokenId user = -1;             // <｜User｜>
  TokenId assistant = -1;        // <｜Assistant｜>
  TokenId system = -1;           // <｜System｜> (V4.1 only)
  TokenId think_begin = -1;      // <think>
  TokenId think_end = -1;        // </think>
  TokenId dsml = -1;             // ｜DSML｜
  TokenId latest_reminder = -1;  // <｜latest_reminder｜>
};

class Tokenizer {
 public:
  // Throws std::runtime_error with a message naming the file on any problem.
  static std::shared_ptr<const Tokenizer> from_file(const std::filesystem::path& tokenizer_json);
  static std::shared_ptr<const Tokenizer> from_json_text(std::string_view tokenizer_json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes like HF `encode(text, add_special_tokens=False)`: every added-token
  // string in the text becomes its id; no BOS is added. Invalid UTF-8 input is
  // first repaired with U+FFFD (HF cannot even represent it). Thread-safe.
  std::vector<TokenId> encode(std::string_view text) const;

  // Like encode(text), except that no added token (special or not) is
  // recognised inside `plain_spans`: the bytes there are encoded as ordinary
  // text (pre-tokenizer + byte-level BPE), so a literal "<｜User｜>" in user
  // content stays text instead of becoming the control token. Outside the
  // spans added tokens match as in encode(), except that a match may not run
  // into a span (the longest one ending before it wins). A span does not cut
  // the ordinary text around it: when no added-token string starts inside a
  // span the result equals encode(text). Spans may be unsorted, overlapping
  // or out of range (clamped). Invalid UTF-8 is repaired span by span, so the
  // offsets keep pointing at the same content.
  std::vector<TokenId> encode(std::string_view text, const std::vector<TextSpan>& plain_spans) const;

  // All of `text` as ordinary text: no added token is recognised.
  std::vector<TokenId> encode_ordinary(std::string_view text) const;

  // HF `decode(ids, skip_special_tokens)`; invalid byte sequences become U+FFFD.
  // Unknown ids are skipped.
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const;

  // Raw bytes of one token (byte-level mapping undone; added tokens verbatim).
  // Empty for unknown ids.
  std::string_view token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;  // added token flagged "special"
  bool is_added(TokenId id) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The token's string as written in tokenizer.json (byte-level alphabet).
  std::optional<std::string> id_to_token(TokenId id) const;

  // One past the largest id (model vocab plus added tokens).
  size_t vocab_size() const;
  const SpecialTokenIds& special_ids() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming responses: feed generated ids one by
// one and get text that never contains a broken UTF-8 sequence. Bytes of an
// incomplete character are held back until the next token completes them; the
// concatenation of all outputs plus finish() equals Tokenizer::decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens = false);

  std::string push(TokenId id);
  std::string push(const std::vector<TokenId>& ids);
  // Flushes held-back bytes (as U+FFFD, since they can no longer complete).
  std::string finish();
  // Bytes currently held back because they may start a multi-byte character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string drain(bool final);

  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4::text
