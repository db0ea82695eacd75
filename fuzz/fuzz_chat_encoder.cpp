// Chat-encoder fuzz target: any JSON request either renders or is refused
// with EncoderError; nothing else may escape, for every profile and flavor.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "text/chat_encoder.h"

using namespace dsv4::text;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto request = ojson::parse(data, data + size, nullptr, false);
  if (request.is_discarded()) return 0;
  for (auto profile :
       {EncoderProfile::V4Preview, EncoderProfile::V4_0731, EncoderProfile::V41, EncoderProfile::V41TierTable}) {
    for (const auto& opts : {RenderOptions{}, RenderOptions::reference(), RenderOptions::vllm()}) {
      try {
        (void)render_chat_request(request, profile, opts);
      } catch (const EncoderError&) {
      } catch (const std::exception& e) {
        std::fprintf(stderr, "unexpected exception: %s\n", e.what());
        std::abort();
      }
    }
  }
  return 0;
}
