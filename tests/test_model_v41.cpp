// DeepSeek-V4.1 against the official V4.1 reference (tiny-v41-flash: layer
// roles, two-level top-k, Engram, lagged HC pre, DSpark), with the
// golden README's pass criteria, and the determinism promises: chunking,
// threads, batches, SIMD paths and rollback give the same bits, and so does
// a DSpark draft, however its positions were reached.
#include <gtest/gtest.h>

#include "core/threads.h"
#include "golden_util.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace dsv4::test {
namespace {

const char* kCase = "tiny-v41-flash";

struct V41Case {
  std::unique_ptr<Model> model;
  TensorStore golden;
  std::vector<int32_t> tokens;  // prompt then decode tokens
  int64_t prompt_len = 0;
  RunResult one_shot;
};

V41Case& v41() {
  static std::unique_ptr<V41Case> c;
  if (!c) {
    c = std::make_unique<V41Case>();
    c->model = Model::load(model_dir(kCase));
    c->golden = TensorStore::open(model_dir(kCase) + "/golden.safetensors");
    c->tokens = read_i32(c->golden, "tokens");
    c->prompt_len = int64_t(c->tokens.size());
    for (int32_t t : read_i32(c->golden, "decode_tokens")) c->tokens.push_back(t);
    c->one_shot = run_schedule(*c->model, c->tokens, c->prompt_len, c->prompt_len, false);
  }
  return *c;
}

// The target layers' states of every position, as the DSpark rings need
// them, from a run in chunks of `chunk`.
std::vector<float> dspark_hidden(const Model& model, const std::vector<int32_t>& tokens, int64_t chunk) {
  const ModelConfig& c = model.config();
  const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim, n = int64_t(tokens.size());
  std::vector<float> hidden(size_t(n * width));
  SequenceState state = model.new_state();
  for (int64_t b = 0; b < n; b += chunk) {
    BatchItem item{&state, tokens.data() + b, std::min(chunk, n - b)};
    item.dspark_hidden = hidden.data() + b * width;
    model.forward_batch({item});
  }
  return hidden;
}

struct Draft {
  std::vector<float> logits, confidence;
  std::vector<int32_t> ids;
};

// The draft after position p with token p+1 as its first input (the
// convention of `dsv4 logits --dspark`).
Draft draft_after(const Model& model, const std::vector<int32_t>& tokens, const std::vector<float>& hidden, int64_t p) {
  const ModelConfig& c = model.config();
  const int64_t block = c.dspark_block_size, width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  Draft d{std::vector<float>(size_t(block * c.vocab_size)), std::vector<float>(size_t(block)),
          std::vector<int32_t>(size_t(block + 1))};
  SequenceState state = model.new_state();
  const int64_t first = std::max<int64_t>(0, p + 1 - c.window);
  model.dspark_extend(state, hidden.data() + first * width, first, p + 1 - first);
  model.dspark_draft({DsparkDraftItem{&state, tokens[size_t(p + 1)], block, d.ids.data(), d.logits.data(),
                                      d.confidence.data(), {}}});
  return d;
}

TEST(V41Golden, LogitsMatchReference) {
  V41Case& c = v41();
  const int64_t V = c.model->config().vocab_size, N = int64_t(c.tokens.size());
  std::vector<float> expected = read_f32(c.golden, "prefill_logits");
  for (float v : read_f32(c.golden, "decode_logits")) expected.push_back(v);
  const std::vector<float> fp64 = read_f32(c.golden, "fp64_check.logits_dev");
  const std::vector<float> route = read_f32(c.golden, "route_check.logits_dev");
  std::vector<bool> skip(static_cast<size_t>(N));
  for (int64_t p = 0; p < N; ++p) skip[size_t(p)] = fp64[size_t(p)] > 1e-3f || route[size_t(p)] > 1e-3f;
  const ErrorStats s = compare_rows(c.one_shot.logits.data(), expected.data(), N, V, skip);
  std::printf("%s logits: median %.3g p99 %.3g max %.3g (pos %lld) argmax %.4f\n", kCase, s.median, s.p99, s.max,
              (long long)s.worst_position, s.argmax_agreement);
  EXPECT_LE(s.median, 1e-4);
  EXPECT_LE(s.p99, 1e-3);
  EXPECT_LE(s.max, 0.3);
  EXPECT_GE(s.argmax_agreement, 0.99);
  // Over every position too (the exact numerics agree where the fp32 route
  // of the reference itself wobbles).
  const ErrorStats all = compare_rows(c.one_shot.logits.data(), expected.data(), N, V);
  EXPECT_LE(all.max, 1e-3);
}

TEST(V41Golden, DsparkDraftsMatchReference) {
  V41Case& c = v41();
  const ModelConfig& cfg = c.model->config();
  const int64_t V = cfg.vocab_size, block = cfg.dspark_block_size;
  const std::vector<int32_t> positions = read_i32(c.golden, "dspark.positions");
  const std::vector<int32_t> inputs = read_i32(c.golden, "dspark.input_tokens");
  const std::vector<float> logits = read_f32(c.golden, "dspark.logits"), conf = read_f32(c.golden, "dspark.confidence");
  const std::vector<int32_t> ids = read_i32(c.golden, "dspark.draft_ids");
  const std::vector<float> route = read_f32(c.golden, "route_check.dspark_dev");
  const std::vector<float> hidden = dspark_hidden(*c.model, c.tokens, c.prompt_len);
  std::vector<double> errors;
  int64_t checked = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    if (route[i] > 1e-3f) continue;  // the reference's two routes disagree there
    const int64_t p = positions[i];
    ASSERT_EQ(inputs[i], c.tokens[size_t(p + 1)]);
    const Draft d = draft_after(*c.model, c.tokens, hidden, p);
    for (int64_t k = 0; k <= block; ++k) EXPECT_EQ(d.ids[size_t(k)], ids[i * size_t(block + 1) + size_t(k)]) << p;
    double e = 0;
    for (int64_t k = 0; k < block * V; ++k) e = std::max(e, double(std::fabs(d.logits[size_t(k)] - logits[i * size_t(block * V) + size_t(k)])));
    errors.push_back(e);
    for (int64_t k = 0; k < block; ++k) {
      const double ref = conf[i * size_t(block) + size_t(k)];
      EXPECT_LE(std::fabs(d.confidence[size_t(k)] - ref), 1e-3 * std::max(1.0, std::fabs(ref))) << p;
    }
    ++checked;
  }
  std::sort(errors.begin(), errors.end());
  ASSERT_GT(checked, 60);
  const double median = errors[errors.size() / 2], p99 = errors[size_t(0.99 * double(errors.size() - 1))];
  std::printf("%s dspark: %lld positions, median %.3g p99 %.3g max %.3g\n", kCase, (long long)checked, median, p99,
              errors.back());
  EXPECT_LE(median, 1e-4);
  EXPECT_LE(p99, 1e-3);
  EXPECT_LE(errors.back(), 0.5);
}

// A draft depends on the tokens only: the same bits whether the positions
// were prefilled at once, in chunks or decoded one at a time.
TEST(V41Golden, DsparkDraftIndependentOfSchedule) {
  V41Case& c = v41();
  const std::vector<int32_t> prefix(c.tokens.begin(), c.tokens.begin() + 200);
  const std::vector<float> once = dspark_hidden(*c.model, prefix, 200);
  for (int64_t chunk : {1, 37}) {
    const std::vector<float> chunked = dspark_hidden(*c.model, prefix, chunk);
    ASSERT_EQ(0, std::memcmp(once.data(), chunked.data(), once.size() * 4)) << "chunk " << chunk;
  }
  const Draft a = draft_after(*c.model, prefix, once, 150), b = draft_after(*c.model, prefix, once, 150);
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4));
}

TEST(V41Golden, ChunkedPrefillIsBitwiseIdentical) {
  V41Case& c = v41();
  for (int64_t chunk : {1, 7, 64, 128}) {
    const RunResult r = run_schedule(*c.model, c.tokens, c.prompt_len, chunk, false);
    EXPECT_EQ(0, std::memcmp(r.logits.data(), c.one_shot.logits.data(), r.logits.size() * 4)) << "chunk " << chunk;
  }
}

TEST(V41Golden, ThreadsAndSimdPathsDoNotChangeBits) {
  V41Case& c = v41();
  const int saved = compute_threads();
  set_compute_threads(1);
  const RunResult single = run_schedule(*c.model, c.tokens, c.prompt_len, 64, false);
  set_compute_threads(saved);
  EXPECT_EQ(0, std::memcmp(single.logits.data(), c.one_shot.logits.data(), single.logits.size() * 4));
  const KernelBackend& chosen = c.model->backend();
  EXPECT_TRUE(chosen.exact()) << "V4.1 loads with the exact numerics";
  for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) continue;
    const KernelBackend& backend = backend_by_name(std::string(kernel_isa_name(isa)) + "-exact");
    SCOPED_TRACE(backend.name());
    c.model->set_backend(backend);
    const RunResult r = run_schedule(*c.model, c.tokens, c.prompt_len, 100, false);
    EXPECT_EQ(0, std::memcmp(r.logits.data(), c.one_shot.logits.data(), r.logits.size() * 4));
  }
  c.model->set_backend(chosen);
}

// Two sequences in one batch (different lengths, mid-group positions of the
// ratio-2 layers) get the bits each gets alone.
TEST(V41Golden, BatchedSequencesGetTheirOwnBits) {
  V41Case& c = v41();
  const Model& m = *c.model;
  const int64_t V = m.config().vocab_size;
  SequenceState a = m.new_state(), b = m.new_state();
  std::vector<float> la(size_t(41 * V)), lb(size_t(30 * V));
  const std::vector<int32_t> other(c.tokens.begin() + 100, c.tokens.begin() + 130);
  m.forward_batch({BatchItem{&a, c.tokens.data(), 41, la.data()}, BatchItem{&b, other.data(), 30, lb.data()}});
  EXPECT_EQ(0, std::memcmp(la.data(), c.one_shot.logits.data(), la.size() * 4));
  SequenceState alone = m.new_state();
  std::vector<float> l_alone(size_t(30 * V));
  m.forward(alone, other.data(), 30, l_alone.data());
  EXPECT_EQ(0, std::memcmp(lb.data(), l_alone.data(), lb.size() * 4));
}

// Rollback into a chunk and a snapshot round trip leave the state a run that
// stopped there would have: the next logits are the same bits (the Engram
// history and the sources' rows included).
TEST(V41Golden, RollbackAndSnapshotAreBitwise) {
  V41Case& c = v41();
  const Model& m = *c.model;
  const int64_t V = m.config().vocab_size;
  SequenceState s = m.new_state();
  m.forward(s, c.tokens.data(), 201, nullptr);
  s.checkpoint();
  m.forward(s, c.tokens.data() + 201, 6, nullptr);
  s.rollback(203);
  s.end_checkpoint();
  SequenceState restored = m.new_state();
  restored.restore(s.snapshot());
  for (SequenceState* state : {&s, &restored}) {
    std::vector<float> logits(size_t(4 * V));
    m.forward(*state, c.tokens.data() + 203, 4, logits.data());
    EXPECT_EQ(0, std::memcmp(logits.data(), c.one_shot.logits.data() + 203 * V, logits.size() * 4));
  }
}

}  // namespace
}  // namespace dsv4::test

namespace dsv4::test {
namespace {

// Bounded replay: the late layers run on the prompt's last window only. Not
// the bits of a full prefill (late-layer windows start empty), but close;
// the test reports how close, and checks what must hold exactly: a replay
// point at or before the chunk changes nothing, and a replayed prefill in
// chunks gives the bits of a replayed prefill in one piece.
TEST(V41Replay, LastWindowOnlyIsCloseAndScheduleIndependent) {
  V41Case& c = v41();
  const Model& m = *c.model;
  const int64_t V = m.config().vocab_size, T = c.prompt_len, N = int64_t(c.tokens.size());
  ASSERT_EQ(m.replay_layer(), 6);
  auto run = [&](int64_t replay_from, int64_t chunk) {
    SequenceState s = m.new_state();
    std::vector<float> logits(size_t((N - T + 1) * V));
    for (int64_t b = 0; b < T; b += chunk) {
      const int64_t n = std::min(chunk, T - b);
      BatchItem item{&s, c.tokens.data() + b, n, b + n == T ? logits.data() : nullptr};
      item.last_logits_only = true;
      item.replay_from = replay_from;
      m.forward_batch({item});
    }
    for (int64_t p = T; p < N; ++p) m.forward(s, c.tokens.data() + p, 1, logits.data() + (p - T + 1) * V);
    return logits;
  };
  const std::vector<float> full = run(-1, T), replayed = run(T - m.config().window, T);
  EXPECT_EQ(run(0, T), full) << "a replay point at the start changes nothing";
  EXPECT_EQ(run(T - m.config().window, 50), replayed) << "replay in chunks";
  double worst = 0, first = 0;
  for (int64_t r = 0; r <= N - T; ++r) {
    double e = 0;
    for (int64_t v = 0; v < V; ++v) e = std::max(e, double(std::fabs(full[size_t(r * V + v)] - replayed[size_t(r * V + v)])));
    worst = std::max(worst, e);
    if (r == 0) first = e;
  }
  std::printf("bounded replay vs full prefill: last prompt logits max |diff| %.3g, over the %lld decode steps after %.3g\n",
              first, (long long)(N - T), worst);
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(first, 5.0);
}

}  // namespace
}  // namespace dsv4::test
