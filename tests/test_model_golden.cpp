// The forward pass against the official reference's golden logits, and the
// invariance promises: chunking, decode and thread count give the same bits.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "core/error.h"
#include "core/threads.h"
#include "golden_util.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace dsv4::test {
namespace {

struct Tolerance {
  double median, p99, max, mtp_median, mtp_p99, mtp_max;
};

Tolerance tolerance_for(const std::string& name) {
  if (name.find("bf16") != std::string::npos) return {5e-4, 3e-3, 2e-2, 5e-3, 2e-2, 5e-2};
  return {1e-4, 1e-3, 0.3, 1e-4, 1e-3, 0.5};
}

struct Case {
  std::unique_ptr<Model> model;
  TensorStore golden;
  std::vector<int32_t> all_tokens;  // prompt then decode tokens
  int64_t prompt_len = 0;
  RunResult one_shot;  // prefill of the prompt in one call, then decode
};

Case& load_case(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Case>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<Case>();
    slot->model = Model::load(model_dir(name));
    slot->golden = TensorStore::open(model_dir(name) + "/golden.safetensors");
    slot->all_tokens = read_i32(slot->golden, "tokens");
    slot->prompt_len = int64_t(slot->all_tokens.size());
    for (int32_t t : read_i32(slot->golden, "decode_tokens")) slot->all_tokens.push_back(t);
    slot->one_shot = run_schedule(*slot->model, slot->all_tokens, slot->prompt_len, slot->prompt_len, true);
  }
  return *slot;
}

class GoldenModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenModel, LogitsMatchReference) {
  Case& c = load_case(GetParam());
  const int64_t V = c.model->config().vocab_size, T = c.prompt_len;
  const int64_t N = int64_t(c.all_tokens.size());
  std::vector<float> expected = read_f32(c.golden, "prefill_logits");
  for (float v : read_f32(c.golden, "decode_logits")) expected.push_back(v);
  std::vector<float> dev = read_f32(c.golden, "fp64_check.logits_dev");
  std::vector<bool> skip(static_cast<size_t>(N));
  for (int64_t p = 0; p < N; ++p) skip[size_t(p)] = dev[size_t(p)] > 1e-3f;
  ErrorStats s = compare_rows(c.one_shot.logits.data(), expected.data(), N, V, skip);
  Tolerance tol = tolerance_for(GetParam());
  RecordProperty("median", std::to_string(s.median));
  std::printf("%s logits: median %.3g p99 %.3g max %.3g (pos %lld) argmax %.4f\n", GetParam().c_str(), s.median, s.p99,
              s.max, (long long)s.worst_position, s.argmax_agreement);
  EXPECT_LE(s.median, tol.median);
  EXPECT_LE(s.p99, tol.p99);
  EXPECT_LE(s.max, tol.max);
  EXPECT_GE(s.argmax_agreement, 0.99);
  (void)T;
}

TEST_P(GoldenModel, MtpLogitsMatchReference) {
  Case& c = load_case(GetParam());
  const int64_t V = c.model->config().vocab_size;
  const int64_t rows = int64_t(c.all_tokens.size()) - 1;
  std::vector<float> expected = read_f32(c.golden, "mtp_logits");
  for (float v : read_f32(c.golden, "mtp_decode_logits")) expected.push_back(v);
  ASSERT_EQ(int64_t(expected.size()), rows * V);
  std::vector<float> dev = read_f32(c.golden, "fp64_check.mtp_dev");
  std::vector<bool> skip(static_cast<size_t>(rows));
  for (int64_t p = 0; p < rows; ++p) skip[size_t(p)] = dev[size_t(p)] > 1e-3f;
  ErrorStats s = compare_rows(c.one_shot.mtp_logits.data(), expected.data(), rows, V, skip);
  Tolerance tol = tolerance_for(GetParam());
  std::printf("%s mtp: median %.3g p99 %.3g max %.3g (pos %lld) argmax %.4f\n", GetParam().c_str(), s.median, s.p99,
              s.max, (long long)s.worst_position, s.argmax_agreement);
  EXPECT_LE(s.median, tol.mtp_median);
  EXPECT_LE(s.p99, tol.mtp_p99);
  EXPECT_LE(s.max, tol.mtp_max);
  EXPECT_GE(s.argmax_agreement, 0.99);
  // The last row has no next token.
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_EQ(c.one_shot.mtp_logits[size_t(rows * V + v)], 0.0f);
  }
}

// Chunked prefill must give the very same bits as one-shot prefill, for the
// prompt and for the decode steps after it (chunk 1 is pure decode).
TEST_P(GoldenModel, ChunkedPrefillIsBitwiseIdentical) {
  Case& c = load_case(GetParam());
  for (int64_t chunk : {1, 7, 64, 128}) {
    RunResult r = run_schedule(*c.model, c.all_tokens, c.prompt_len, chunk, true);
    EXPECT_EQ(0, std::memcmp(r.logits.data(), c.one_shot.logits.data(), r.logits.size() * 4))
        << "logits differ with chunk size " << chunk;
    EXPECT_EQ(0, std::memcmp(r.mtp_logits.data(), c.one_shot.mtp_logits.data(), r.mtp_logits.size() * 4))
        << "MTP logits differ with chunk size " << chunk;
  }
}

TEST_P(GoldenModel, ThreadCountDoesNotChangeBits) {
  Case& c = load_case(GetParam());
  const int saved = compute_threads();
  set_compute_threads(1);
  RunResult single = run_schedule(*c.model, c.all_tokens, c.prompt_len, 64, true);
  set_compute_threads(3);
  RunResult three = run_schedule(*c.model, c.all_tokens, c.prompt_len, 64, true);
  set_compute_threads(saved);
  EXPECT_EQ(0, std::memcmp(single.logits.data(), c.one_shot.logits.data(), single.logits.size() * 4));
  EXPECT_EQ(0, std::memcmp(three.logits.data(), c.one_shot.logits.data(), three.logits.size() * 4));
  EXPECT_EQ(0, std::memcmp(three.mtp_logits.data(), c.one_shot.mtp_logits.data(), three.mtp_logits.size() * 4));
}

// Every CPU backend (scalar reference, AVX2, AVX-512, each with its own
// batch-1, few-token and packed kernels), selected through the kernel
// interface at run time, gives the whole model, prefill, decode and MTP,
// the same bits: a machine without AVX-512 serves the same tokens. The
// scalar backend's logits are also compared with the reference directly.
TEST_P(GoldenModel, SimdPathDoesNotChangeBits) {
  Case& c = load_case(GetParam());
  const KernelBackend& saved = c.model->backend();
  for (KernelIsa isa : {KernelIsa::Scalar, KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) continue;
    const KernelBackend& backend = backend_by_name(kernel_isa_name(isa));
    SCOPED_TRACE(backend.name());
    c.model->set_backend(backend);
    RunResult r = run_schedule(*c.model, c.all_tokens, c.prompt_len, c.prompt_len, true);
    EXPECT_EQ(0, std::memcmp(r.logits.data(), c.one_shot.logits.data(), r.logits.size() * 4));
    EXPECT_EQ(0, std::memcmp(r.mtp_logits.data(), c.one_shot.mtp_logits.data(), r.mtp_logits.size() * 4));
    if (isa == KernelIsa::Scalar) {
      const int64_t V = c.model->config().vocab_size, N = int64_t(c.all_tokens.size());
      std::vector<float> expected = read_f32(c.golden, "prefill_logits");
      for (float v : read_f32(c.golden, "decode_logits")) expected.push_back(v);
      std::vector<float> dev = read_f32(c.golden, "fp64_check.logits_dev");
      std::vector<bool> skip(static_cast<size_t>(N));
      for (int64_t p = 0; p < N; ++p) skip[size_t(p)] = dev[size_t(p)] > 1e-3f;
      ErrorStats s = compare_rows(r.logits.data(), expected.data(), N, V, skip);
      Tolerance tol = tolerance_for(GetParam());
      EXPECT_LE(s.median, tol.median);
      EXPECT_LE(s.p99, tol.p99);
      EXPECT_LE(s.max, tol.max);
    }
  }
  c.model->set_backend(saved);
}

// Sequences batched together (continuous batching: a long prefill chunk next
// to decode steps of other sequences) get exactly the bits they get alone.
TEST_P(GoldenModel, BatchingDoesNotChangeBits) {
  Case& c = load_case(GetParam());
  const Model& m = *c.model;
  const int64_t V = m.config().vocab_size, N = int64_t(c.all_tokens.size());
  std::vector<int32_t> other(c.all_tokens.rbegin(), c.all_tokens.rend());
  other[0] = 0;
  // Sequence A: the golden tokens in chunks of 50. Sequence B: other tokens,
  // one at a time. Sequence C joins later with chunks of 33.
  SequenceState a = m.new_state(), b = m.new_state(), cs = m.new_state();
  std::vector<float> la(size_t(N * V)), lb(size_t(N * V)), lc(size_t(N * V));
  int64_t pa = 0, pb = 0, pc = 0;
  while (pa < N || pb < N || pc < N) {
    std::vector<BatchItem> items;
    int64_t na = std::min<int64_t>(50, N - pa), nc = pb >= 20 ? std::min<int64_t>(33, N - pc) : 0;
    if (na > 0) items.push_back({&a, c.all_tokens.data() + pa, na, la.data() + pa * V});
    if (pb < N) items.push_back({&b, other.data() + pb, 1, lb.data() + pb * V});
    if (nc > 0) items.push_back({&cs, other.data() + pc, nc, lc.data() + pc * V});
    m.forward_batch(items);
    pa += std::max<int64_t>(na, 0);
    pb += pb < N ? 1 : 0;
    pc += nc;
  }
  EXPECT_EQ(0, std::memcmp(la.data(), c.one_shot.logits.data(), la.size() * 4));
  RunResult alone = run_schedule(m, other, N, N, false);
  EXPECT_EQ(0, std::memcmp(lb.data(), alone.logits.data(), lb.size() * 4));
  EXPECT_EQ(0, std::memcmp(lc.data(), alone.logits.data(), lc.size() * 4));
}

// A snapshot taken mid-sequence restores a state that continues with the
// same bits, and snapshots of equal states are equal bytes.
TEST_P(GoldenModel, SnapshotRestoresByteExactly) {
  Case& c = load_case(GetParam());
  const Model& m = *c.model;
  const int64_t V = m.config().vocab_size, split = 200, n = 40;
  SequenceState a = m.new_state();
  std::vector<float> logits(size_t((split + n) * V));
  m.forward(a, c.all_tokens.data(), split, logits.data());
  std::vector<uint8_t> snap = a.snapshot();
  SequenceState b = m.new_state();
  b.restore(snap);
  EXPECT_EQ(snap, b.snapshot());
  std::vector<float> la(size_t(n * V)), lb(size_t(n * V));
  m.forward(a, c.all_tokens.data() + split, n, la.data());
  m.forward(b, c.all_tokens.data() + split, n, lb.data());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
  EXPECT_EQ(0, std::memcmp(la.data(), c.one_shot.logits.data() + split * V, la.size() * 4));
  snap.resize(snap.size() / 2);
  EXPECT_THROW(b.restore(snap), Error);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenModel, ::testing::Values("tiny-flash-bf16", "tiny-flash-fp8", "tiny-pro-fp8"),
                         case_name);

}  // namespace
}  // namespace dsv4::test
