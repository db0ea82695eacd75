// Decode and verify steps hand a ratio-128 layer's compressed rows to the
// attention as stored FP8 rows (the backend decodes them per key tile);
// prefill chunks decode them first. Both give the bits of one prefill.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/threads.h"
#include "golden_util.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace dsv4::test {
namespace {

// 300 tokens: two compressed rows in each ratio-128 layer by the end.
// Decoded one token at a time from 120 on (each step reads the rows as
// stored) on every path, and in chunks of 4 (stored) and 17 (decoded
// first) on the best one.
TEST(StoredRows, DecodeAndVerifyStepsGiveThePrefillBits) {
  for (const char* name : {"tiny-flash-fp8", "tiny-pro-fp8"}) {
    SCOPED_TRACE(name);
    const std::unique_ptr<Model> model = Model::load(model_dir(name));
    const int64_t n = 300, V = model->config().vocab_size, W = model->config().hc_mult * model->config().dim;
    std::mt19937 rng(17);
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (auto& t : tokens) t = int32_t(rng() % uint32_t(V));
    const RunResult one_shot = run_schedule(*model, tokens, n, n, false);
    const KernelBackend& saved = model->backend();
    for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
      if (!kernel_isa_supported(isa)) continue;
      model->set_backend(backend_by_name(kernel_isa_name(isa)));
      SCOPED_TRACE(kernel_isa_name(isa));
      const RunResult steps = run_schedule(*model, tokens, 120, 120, false);
      EXPECT_EQ(0, std::memcmp(steps.logits.data(), one_shot.logits.data(), steps.logits.size() * 4));
      if (isa != best_kernel_isa()) continue;
      for (int64_t chunk : {4, 17}) {
        SCOPED_TRACE("chunks of " + std::to_string(chunk));
        std::vector<float> logits(size_t(n * V)), hc(size_t(n * W));
        SequenceState state = model->new_state();
        for (int64_t b = 0; b < n; b += b < 120 ? 120 : chunk) {
          const int64_t len = std::min(b < 120 ? 120 : chunk, n - b);
          model->forward(state, tokens.data() + b, len, logits.data() + b * V, hc.data() + b * W);
        }
        EXPECT_EQ(0, std::memcmp(logits.data(), one_shot.logits.data(), logits.size() * 4));
      }
    }
    model->set_backend(saved);
  }
}

}  // namespace
}  // namespace dsv4::test
