// Tokenizer fuzz target. Properties: encoding never fails, decode(encode(x))
// gives back x (after U+FFFD repair of invalid UTF-8), and the streaming
// detokenizer agrees with decode for arbitrary id sequences.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace dsv4::text;

static std::shared_ptr<const Tokenizer> tokenizer() {
  static auto t = Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/assets/dsv4-tokenizer/tokenizer.json");
  return t;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = tokenizer();
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto ids = tok->encode(input);
  if (tok->decode(ids) != utf8::to_valid_lossy(input)) std::abort();

  // The same bytes read as token ids.
  std::vector<TokenId> raw_ids;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    raw_ids.push_back(static_cast<TokenId>((data[i] | (data[i + 1] << 8) | (data[i + 2] << 16)) % 130000));
  }
  for (bool skip : {false, true}) {
    StreamDecoder sd(tok, skip);
    std::string streamed;
    for (auto id : raw_ids) {
      const std::string piece = sd.push(id);
      if (!utf8::is_valid(piece)) std::abort();
      streamed += piece;
    }
    streamed += sd.finish();
    if (streamed != tok->decode(raw_ids, skip)) std::abort();
  }
  return 0;
}
