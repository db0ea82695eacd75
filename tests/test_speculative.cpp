// Speculative decoding's promises: the tokens and logprobs of a request are
// bitwise those of plain decoding (greedy and seeded sampling), whatever the
// drafter, the number of drafts, the batch and the chunking; drafts do get
// accepted (n-gram drafting on looping output), partly and fully; the
// rejection rule keeps the target distribution; simulated acceptance hits
// its mean; the gate turns a losing speculation off; requests under a
// grammar draft too, and tokens the grammar forces draft themselves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "golden_util.h"
#include "positions_constraint.h"
#include "request_outcome.h"
#include "striped_constraint.h"

namespace dsv4::test {
namespace {

std::shared_ptr<const Model> model_named(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Model>> models;
  auto& m = models[name];
  if (!m) m.reset(Model::load(model_dir(name)).release());
  return m;
}

// Prompts that repeat a short motif: the tiny random models then tend to
// continue in loops, which n-gram drafting predicts.
std::vector<int32_t> prompt_of(int64_t n, int32_t salt, int64_t period) {
  std::vector<int32_t> p = {0};
  for (int64_t i = 1; i < n; ++i) p.push_back(int32_t(((i % period) * 131 + salt * 17) % 511 + 1));
  return p;
}

SamplingParams greedy(int64_t max_new) {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.top_logprobs = 2;
  return p;
}

SamplingParams sampled(uint64_t seed, int64_t max_new) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 20;
  p.seed = seed;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.repetition_penalty = 1.05f;
  return p;
}

struct Case {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
};

std::vector<Case> cases(int count, bool sampling) {
  std::vector<Case> out;
  for (int i = 0; i < count; ++i) {
    const int64_t n = 20 + 29 * i, max_new = 12 + 7 * (i % 4);
    out.push_back({"r" + std::to_string(i), prompt_of(n, i, 3 + i % 5),
                   sampling ? sampled(uint64_t(100 + i), max_new) : greedy(max_new)});
  }
  return out;
}

std::vector<Outcome> run(const std::string& model, const EngineOptions& options, const std::vector<Case>& batch) {
  Engine engine(model_named(model), options);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Case& c : batch) handles.push_back(engine.submit(c.id, c.prompt, c.params));
  std::vector<Outcome> out;
  for (auto& h : handles) out.push_back(drain(h));
  return out;
}

EngineOptions plain_options(int64_t chunk) {
  EngineOptions o;
  o.chunked_prefill_size = chunk;
  o.prefix_cache_bytes = 0;
  return o;
}

EngineOptions spec_options(SpeculativeAlgorithm algorithm, int64_t drafts, int64_t chunk) {
  EngineOptions o = plain_options(chunk);
  o.speculative.algorithm = algorithm;
  o.speculative.num_draft_tokens = drafts + 1;
  o.speculative.num_steps = drafts;
  o.speculative.ngram_min_match = 1;
  o.speculative.ngram_max_match = 4;
  o.speculative.auto_bypass = false;  // speculate on every step: the gate is timing-dependent
  return o;
}

void expect_same(const std::vector<Outcome>& plain, const std::vector<Outcome>& spec, const std::string& what) {
  ASSERT_EQ(plain.size(), spec.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].tokens, spec[i].tokens) << what << " request " << i;
    ASSERT_EQ(plain[i].logprobs.size(), spec[i].logprobs.size());
    for (size_t t = 0; t < plain[i].logprobs.size(); ++t)
      EXPECT_EQ(std::memcmp(&plain[i].logprobs[t], &spec[i].logprobs[t], 4), 0) << what << " request " << i;
    EXPECT_EQ(plain[i].tops, spec[i].tops) << what << " request " << i;
    EXPECT_EQ(plain[i].reason, spec[i].reason);
  }
}

// ---- units -------------------------------------------------------------------

TEST(Ngram, ProposesWhatFollowedTheLongestRecentMatch) {
  NgramIndex index(1, 4);
  std::vector<int32_t> h = {5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7};
  index.extend(h);
  // Suffix [6, 7]: occurred ending at 3 (followed by 8) and at 7 (followed by
  // 9); both match 2 tokens, the more recent wins.
  EXPECT_EQ(index.propose(h, 2), (std::vector<int32_t>{9, 2}));
  h.push_back(9);
  index.extend(h);
  // [6, 7, 9] matches 3 tokens at end 8 only.
  EXPECT_EQ(index.propose(h, 5), (std::vector<int32_t>{2, 6, 7, 9}));
  std::vector<int32_t> none = {1, 2, 3};
  NgramIndex empty(2, 4);
  empty.extend(none);
  EXPECT_TRUE(empty.propose(none, 4).empty());
}

TEST(SpecAccept, SimulatedAcceptanceHasTheRequestedMean) {
  for (double len : {1.0, 2.0, 2.5, 3.3, 4.0}) {
    int64_t tokens = 0;
    for (int64_t step = 0; step < 1000; ++step) tokens += simulated_accepts(len, step) + 1;
    EXPECT_NEAR(double(tokens) / 1000.0, len, 1e-3) << len;
  }
}

TEST(SpecAccept, RejectionRuleKeepsTheTargetDistribution) {
  // A fixed row of logits; the draft is token 2. Over many seeds, the draft
  // is accepted with probability p(2) and the emitted tokens follow p.
  const std::vector<float> logits = {1.0f, 0.2f, 1.5f, -0.5f, 0.7f, 0.0f};
  const int64_t vocab = int64_t(logits.size());
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<double> target(static_cast<size_t>(vocab));
  double z = 0;
  for (float v : logits) z += std::exp(double(v));
  for (int64_t v = 0; v < vocab; ++v) target[size_t(v)] = std::exp(double(logits[size_t(v)])) / z;
  const int trials = 40000;
  std::vector<int> counts(size_t(vocab), 0);
  int accepted = 0;
  for (int i = 0; i < trials; ++i) {
    p.seed = uint64_t(i) * 7919 + 1;
    VerifiedToken v = verify_draft(logits.data(), vocab, p, {}, {}, 3, {}, 2);
    ++counts[size_t(v.token.token)];
    accepted += v.accepted;
    EXPECT_EQ(v.accepted, v.token.token == 2);
  }
  const double sigma = std::sqrt(target[2] * (1 - target[2]) / trials);
  EXPECT_NEAR(double(accepted) / trials, target[2], 5 * sigma);
  for (int64_t v = 0; v < vocab; ++v) {
    const double s = std::sqrt(target[size_t(v)] * (1 - target[size_t(v)]) / trials);
    EXPECT_NEAR(double(counts[size_t(v)]) / trials, target[size_t(v)], 5 * s) << "token " << v;
  }
}

TEST(SpecGate, TurnsALosingSpeculationOffAndProbesRarely) {
  SpeculationGate gate;
  int spec_steps = 0;
  for (int step = 0; step < 2000; ++step) {
    const bool spec = gate.speculate(16);
    spec_steps += spec;
    // Speculation: 3x the time for 1.5x the tokens.
    gate.record(16, spec, spec ? 0.3 : 0.1, spec ? 24 : 16);
  }
  EXPECT_LT(spec_steps, 2000 * 0.02) << "a losing speculation ran too often";
  EXPECT_LT(gate.gain(16), 1.0);
  SpeculationGate winning;
  int plain_steps = 0;
  for (int step = 0; step < 2000; ++step) {
    const bool spec = winning.speculate(1);
    plain_steps += !spec;
    winning.record(1, spec, spec ? 0.12 : 0.1, spec ? 3 : 1);
  }
  EXPECT_LT(plain_steps, 2000 * 0.1);
  EXPECT_GT(winning.gain(1), 2.0);
}

// A machine that slowed speculation down for a while (another tenant, a
// noisy neighbour) and then sped up again: the first probe after that must
// bring speculation back, not be averaged into the slow phase's rate. With
// the stale average moved a quarter of the way per probe, speculation lost
// three more probes, 256 steps apart, and ran in under a third of the later
// steps.
TEST(SpecGate, AProbeReplacesAStaleAverage) {
  SpeculationGate gate;
  int spec_late = 0;
  for (int step = 0; step < 1300; ++step) {
    const bool spec = gate.speculate(1);
    const bool slow_phase = step < 300;
    if (!slow_phase) spec_late += spec;
    // Plain: 10 tokens/s. Speculation: 4 tokens/s, then 16.
    if (!spec)
      gate.record(1, false, 0.1, 1);
    else
      gate.record(1, true, slow_phase ? 0.25 : 0.125, slow_phase ? 1 : 2);
  }
  EXPECT_GT(spec_late, 1000 * 0.7) << "speculation stayed off after the machine recovered";
  EXPECT_GT(gate.gain(1), 1.5);
}

// A probe that costs many plain steps (after a bypass the drafter catches up
// on the window it skipped: on the 2-layer V4-Flash slice at batch 4 one
// probe took as long as about 20 plain steps) is made rare enough that the
// probes cost about 2% of plain decoding's time. Doubling up to 1 in 256
// steps alone left 256-step runs 6-10% slower than plain.
TEST(SpecGate, AnExpensiveProbeIsPaidForByTheStepsBetweenProbes) {
  SpeculationGate gate;
  double seconds = 0;
  int64_t tokens = 0;
  const int64_t batch = 4, steps = 40000;
  for (int64_t step = 0; step < steps; ++step) {
    const bool spec = gate.speculate(batch);
    // Plain: 50 ms a step. A probe: 1 s for four tokens a sequence.
    const double took = spec ? 1.0 : 0.05;
    const int64_t made = spec ? 4 * batch : batch;
    gate.record(batch, spec, took, made);
    seconds += took;
    tokens += made;
  }
  const double plain_seconds = double(tokens) / double(batch) * 0.05;
  EXPECT_LT(seconds / plain_seconds, 1.03) << "the probes cost more than their budget";
  EXPECT_LT(gate.gain(batch), 1.0);
}

// A drafter that catches up on the positions a bypass skipped (up to a
// window of 128) makes a probe's cost grow with the bypass before it: here
// 0.3 s for the verify and the drafts, plus 10 ms a skipped step. Found
// probe by probe, the intervals grow 16, about 280, then ~1400 steps, and the
// probe after 280 steps (catching up on the whole window) cost 1.6 s,
// about 5% of the 600 steps after a 150-step warm-up, where a server that
// just started or a bench counts. Predicted from the first probe (its
// catch-up scaled to the window) the next probe waits long enough at once.
TEST(SpecGate, AProbeAfterAShortBypassPredictsTheWholeWindowsCatchUp) {
  auto overhead_after_warm_up = [](int64_t catch_up_steps) {
    SpeculationGate gate(true, catch_up_steps);
    const int64_t batch = 4, warm_up = 150, counted = 600;
    int64_t skipped = 0;
    double seconds = 0;
    int64_t tokens = 0;
    for (int64_t step = 0; step < warm_up + counted; ++step) {
      const bool spec = gate.speculate(batch);
      const double took = spec ? 0.3 + 0.01 * double(std::min<int64_t>(skipped, 128)) : 0.05;
      const int64_t made = spec ? 4 * batch : batch;
      skipped = spec ? 0 : skipped + 1;
      gate.record(batch, spec, took, made);
      if (step >= warm_up) seconds += took, tokens += made;
    }
    return seconds / (double(tokens) / double(batch) * 0.05);
  };
  EXPECT_LT(overhead_after_warm_up(128), 1.02);
  EXPECT_GT(overhead_after_warm_up(0), 1.03);  // what the budget alone gave (the gate's own window is unknown)
}

// ---- the engine: bitwise exactness -------------------------------------------

TEST(SpecEngine, NgramGreedyIsBitwisePlainAndAcceptsDrafts) {
  struct Config {
    const char* model;
    int64_t drafts, chunk;
  };
  const auto batch = cases(8, false);
  std::map<std::string, std::vector<Outcome>> plain;
  std::map<std::string, int64_t> accepted_by_model;
  for (Config config : {Config{"tiny-flash-fp8", 1, 17}, Config{"tiny-flash-fp8", 3, 2048},
                        Config{"tiny-flash-fp8", 7, 17}, Config{"tiny-pro-fp8", 5, 31}}) {
    if (!plain.count(config.model)) plain[config.model] = run(config.model, plain_options(64), batch);
    const auto spec = run(config.model, spec_options(SpeculativeAlgorithm::Ngram, config.drafts, config.chunk), batch);
    const std::string what = std::string(config.model) + " NGRAM drafts " + std::to_string(config.drafts);
    expect_same(plain[config.model], spec, what);
    int64_t verifies = 0, drafted = 0, accepted = 0;
    for (auto& o : spec) verifies += o.verifies, drafted += o.drafted, accepted += o.accepted;
    EXPECT_GT(verifies, 0) << what;
    EXPECT_LT(accepted, drafted) << what;  // partial acceptance: some rejected tails rolled back
    accepted_by_model[config.model] += accepted;
  }
  // The looping outputs let n-gram drafts through.
  for (auto& [model, accepted] : accepted_by_model) EXPECT_GT(accepted, 0) << model;
}

// The verify step's head on each sequence's first rows, then on the rest
// for those that accepted them (forced here at every step): still bitwise
// plain, greedy and sampled, and both the skipped rows and (where greedy
// n-gram drafts run long) the second passes happen.
TEST(SpecEngine, VerifyHeadOnFirstRowsIsBitwisePlain) {
  for (bool sampling : {false, true}) {
    const auto batch = cases(8, sampling);
    const auto plain = run("tiny-flash-fp8", plain_options(64), batch);
    for (SpeculativeAlgorithm algorithm : {SpeculativeAlgorithm::Ngram, SpeculativeAlgorithm::Eagle}) {
      EngineOptions options = spec_options(algorithm, 3, 64);
      options.speculative.head_rows_skipped_min = 0;
      Engine engine(model_named("tiny-flash-fp8"), options);
      std::vector<std::shared_ptr<RequestHandle>> handles;
      for (const Case& c : batch) handles.push_back(engine.submit(c.id, c.prompt, c.params));
      std::vector<Outcome> spec;
      for (auto& h : handles) spec.push_back(drain(h));
      const std::string what = std::string(speculative_algorithm_name(algorithm)) + (sampling ? " sampled" : " greedy");
      expect_same(plain, spec, what);
      const EngineMetrics m = engine.metrics();
      EXPECT_GT(m.spec_head_rows_skipped_total, 0) << what;
      EXPECT_GT(m.spec_head_rows_total, 0) << what;
      if (algorithm == SpeculativeAlgorithm::Ngram && !sampling) {  // looping greedy output accepts runs
        EXPECT_GT(m.spec_head_second_passes_total, 0) << what;
      }
    }
  }
}

// With the default threshold a lone sequence never skips: a second pass of
// the head would cost more than the few rows it saves.
TEST(SpecEngine, VerifyHeadRunsWholeForALoneSequence) {
  const auto batch = cases(1, false);
  Engine engine(model_named("tiny-flash-fp8"), spec_options(SpeculativeAlgorithm::Ngram, 3, 64));
  drain(engine.submit(batch[0].id, batch[0].prompt, batch[0].params));
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.spec_head_rows_total, 0);
  EXPECT_EQ(m.spec_head_rows_skipped_total, 0);
  EXPECT_EQ(m.spec_head_second_passes_total, 0);
}

TEST(SpecEngine, NgramSampledIsBitwisePlainAloneAndBatched) {
  const auto batch = cases(6, true);
  const auto plain = run("tiny-flash-fp8", plain_options(64), batch);
  const auto spec = run("tiny-flash-fp8", spec_options(SpeculativeAlgorithm::Ngram, 4, 64), batch);
  expect_same(plain, spec, "sampled NGRAM batched");
  const auto alone = run("tiny-flash-fp8", spec_options(SpeculativeAlgorithm::Ngram, 4, 2048), {batch[3]});
  expect_same({plain[3]}, alone, "sampled NGRAM alone");
}

TEST(SpecEngine, EagleGreedyAndSampledAreBitwisePlain) {
  for (const char* model : {"tiny-flash-fp8", "tiny-flash-bf16"}) {
    for (bool sampling : {false, true}) {
      const auto batch = cases(6, sampling);
      const auto plain = run(model, plain_options(2048), batch);
      for (int64_t steps : {1, 3}) {
        const auto spec = run(model, spec_options(SpeculativeAlgorithm::Eagle, steps, 33), batch);
        expect_same(plain, spec, std::string(model) + " EAGLE steps " + std::to_string(steps));
        int64_t verifies = 0;
        for (auto& o : spec) verifies += o.verifies;
        EXPECT_GT(verifies, 0);
      }
    }
  }
}

TEST(SpecEngine, EagleDraftsMatchAPlainMtpRun) {
  // The first draft of a step is the MTP block's argmax at the last fed
  // position, computed from exact inputs: compare with the model's own MTP
  // over the same tokens, run from scratch.
  auto model = model_named("tiny-flash-fp8");
  const ModelConfig& c = model->config();
  const std::vector<int32_t> prompt = prompt_of(150, 3, 4);
  SequenceState state = model->new_state();
  const int64_t n = int64_t(prompt.size()), width = c.hc_mult * c.dim;
  std::vector<float> logits(size_t(n * c.vocab_size)), hc(size_t(n * width));
  model->forward(state, prompt.data(), n, logits.data(), hc.data());
  const float* last = logits.data() + (n - 1) * c.vocab_size;
  const int32_t next = int32_t(std::max_element(last, last + c.vocab_size) - last);
  std::vector<int32_t> shifted(prompt.begin() + 1, prompt.end());
  shifted.push_back(next);
  std::vector<float> mtp(size_t(n * c.vocab_size));
  model->forward_mtp(state, hc.data(), shifted.data(), n, mtp.data());
  const float* row = mtp.data() + (n - 1) * c.vocab_size;
  const int32_t expected = int32_t(std::max_element(row, row + c.vocab_size) - row);
  // The engine runs the block only over the last window of positions
  // before the first draft: the last row must come out the same.
  SequenceState skipped = model->new_state();
  model->forward(skipped, prompt.data(), n, nullptr, nullptr);
  skipped.mtp_tokens = n - c.window;
  std::vector<float> mtp_window(size_t(c.window * c.vocab_size));
  model->forward_mtp(skipped, hc.data() + (n - c.window) * width, shifted.data() + (n - c.window), c.window,
                     mtp_window.data());
  const float* window_row = mtp_window.data() + (c.window - 1) * c.vocab_size;
  EXPECT_EQ(std::memcmp(window_row, row, size_t(c.vocab_size) * 4), 0)
      << "the MTP row of the last position must not depend on positions before its window";
  EXPECT_EQ(int32_t(std::max_element(window_row, window_row + c.vocab_size) - window_row), expected);
}

// A draft vocabulary (--speculative-token-map): the MTP logits of its tokens
// are bitwise the whole head's, the others -infinity; requests drafting
// with it stay bitwise plain, greedy and sampled.
TEST(SpecEngine, DraftVocabularyScoresItsTokensAndKeepsTheOutput) {
  std::shared_ptr<Model> model(Model::load(model_dir("tiny-flash-fp8")).release());
  const ModelConfig& c = model->config();
  const std::vector<int32_t> prompt = prompt_of(40, 5, 3);
  const int64_t n = int64_t(prompt.size()), width = c.hc_mult * c.dim;
  std::vector<float> hc(size_t(n * width));
  SequenceState main_state = model->new_state();
  model->forward(main_state, prompt.data(), n, nullptr, hc.data());
  std::vector<int32_t> shifted(prompt.begin() + 1, prompt.end());
  shifted.push_back(7);
  auto mtp_logits = [&] {
    SequenceState state = model->new_state();
    std::vector<float> out(size_t(n * c.vocab_size));
    model->forward_mtp(state, hc.data(), shifted.data(), n, out.data());
    return out;
  };
  const std::vector<float> whole = mtp_logits();
  std::vector<int32_t> vocab;
  for (int32_t id = int32_t(c.vocab_size) - 1; id >= 0; id -= 3) vocab.push_back(id);  // any order
  model->set_draft_vocab(vocab);
  EXPECT_EQ(model->draft_vocab().size(), vocab.size());
  const std::vector<float> narrowed = mtp_logits();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t id = 0; id < c.vocab_size; ++id) {
      const size_t at = size_t(t * c.vocab_size + id);
      if ((c.vocab_size - 1 - id) % 3 == 0)
        ASSERT_EQ(std::memcmp(&narrowed[at], &whole[at], 4), 0) << "row " << t << " token " << id;
      else
        ASSERT_EQ(narrowed[at], -std::numeric_limits<float>::infinity()) << "row " << t << " token " << id;
    }
  EXPECT_LT(model->token_cost().mtp_head_bytes, model->token_cost().head_bytes);

  const auto batch = cases(5, false);
  const auto plain = run("tiny-flash-fp8", plain_options(2048), batch);
  for (bool sampling : {false, true}) {
    const auto requests = sampling ? cases(5, true) : batch;
    const auto reference = sampling ? run("tiny-flash-fp8", plain_options(2048), requests) : plain;
    Engine engine(model, spec_options(SpeculativeAlgorithm::Eagle, 3, 33));
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const Case& r : requests) handles.push_back(engine.submit(r.id, r.prompt, r.params));
    std::vector<Outcome> spec;
    for (auto& h : handles) spec.push_back(drain(h));
    expect_same(reference, spec, sampling ? "sampled EAGLE, draft vocabulary" : "greedy EAGLE, draft vocabulary");
    int64_t verifies = 0;
    for (auto& o : spec) verifies += o.verifies;
    EXPECT_GT(verifies, 0);
  }
  model->set_draft_vocab({});
  EXPECT_TRUE(model->draft_vocab().empty());
  EXPECT_EQ(model->token_cost().mtp_head_bytes, model->token_cost().head_bytes);
}

TEST(SpecEngine, DraftVocabularyRefusesBadIds) {
  std::shared_ptr<Model> model(Model::load(model_dir("tiny-flash-fp8")).release());
  const int32_t vocab = int32_t(model->config().vocab_size);
  auto message = [&](std::vector<int32_t> ids) {
    try {
      model->set_draft_vocab(std::move(ids));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({1, vocab}).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(message({-1, 2}).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(message({4, 9, 4}).find("token id 4 repeats"), std::string::npos);
  EXPECT_TRUE(model->draft_vocab().empty()) << "a refused list leaves the whole head";
}

TEST(SpecTokenMap, ReadsJsonAndTextAndRefusesTheRest) {
  // A folder of this process's own: fixed names straight in /tmp would
  // collide between test runs side by side and stay behind.
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("dsv4-token-map-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root);
  const std::string dir = root.string();
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  EXPECT_EQ(load_token_map(write("map.json", " [3, 1, 2]\n")), (std::vector<int32_t>{3, 1, 2}));
  EXPECT_EQ(load_token_map(write("map.txt", "5\n6 7\n")), (std::vector<int32_t>{5, 6, 7}));
  auto message = [&](const std::string& path) {
    try {
      load_token_map(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(write("freq_32768.pt", "PK")).find("convert the map to JSON"), std::string::npos);
  EXPECT_NE(message(dir + "/absent.json").find("cannot open"), std::string::npos);
  EXPECT_NE(message(write("empty.txt", " \n")).find("no token ids"), std::string::npos);
  EXPECT_NE(message(write("word.txt", "1 2x 3")).find("\"2x\" is not a token id"), std::string::npos);
  EXPECT_NE(message(write("float.json", "[1, 2.5]")).find("2.5"), std::string::npos);
  EXPECT_NE(message(write("broken.json", "[1, 2")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(message(write("negative.txt", "-4")).find("-4 is not a token id"), std::string::npos);
  std::filesystem::remove_all(root);
}

TEST(SpecEngine, SimulatedAcceptanceReachesItsLength) {
  EngineOptions o = spec_options(SpeculativeAlgorithm::Eagle, 3, 2048);
  o.speculative.simulate_accept_len = 2.5;
  const auto out = run("tiny-flash-fp8", o, {{"sim", prompt_of(40, 1, 7), greedy(61)}});
  ASSERT_EQ(out[0].tokens.size(), 61u);
  // 60 tokens after the first come from verify steps of 2.5 tokens on average.
  EXPECT_NEAR(double(out[0].accepted + out[0].verifies) / double(out[0].verifies), 2.5, 0.1);
}

TEST(SpecEngine, StopTokenInsideAcceptedDraftsEndsThere) {
  // Greedy run without speculation; then the same request with its 6th
  // token as a stop token, speculating: it must stop exactly there.
  const Case c{"stop", prompt_of(60, 2, 3), greedy(30)};
  const auto plain = run("tiny-flash-fp8", plain_options(2048), {c});
  Case stopping = c;
  stopping.params.stop_token_ids = {plain[0].tokens[5]};
  const auto want = run("tiny-flash-fp8", plain_options(2048), {stopping});
  const auto spec = run("tiny-flash-fp8", spec_options(SpeculativeAlgorithm::Ngram, 7, 2048), {stopping});
  expect_same(want, spec, "stop token");
  EXPECT_EQ(spec[0].reason, FinishReason::Stop);
}

// ---- constrained requests -------------------------------------------------------

// Every other case constrained, the first ones after a free span.
std::vector<Case> constrained_cases(int count, bool sampling) {
  std::vector<Case> out = cases(count, sampling);
  for (size_t i = 0; i < out.size(); i += 2)
    out[i].params.constraint = std::make_shared<StripedFactory>(int64_t(i % 4 == 0 ? 3 : 0), 1000);
  return out;
}

void expect_striped(const Outcome& o, int64_t free, const std::string& what) {
  for (size_t i = size_t(free); i < o.tokens.size(); ++i)
    EXPECT_TRUE(StripedConstraint::allowed(int64_t(i) - free, o.tokens[i])) << what << " token " << i;
}

TEST(SpecEngine, ConstrainedRequestsDraftAndStayBitwisePlain) {
  struct Config {
    SpeculativeAlgorithm algorithm;
    int64_t drafts;
    bool sampling;
  };
  std::map<bool, std::vector<Outcome>> plain;
  for (Config config : {Config{SpeculativeAlgorithm::Ngram, 3, false}, Config{SpeculativeAlgorithm::Ngram, 7, false},
                        Config{SpeculativeAlgorithm::Ngram, 4, true}, Config{SpeculativeAlgorithm::Eagle, 3, false},
                        Config{SpeculativeAlgorithm::Eagle, 2, true}}) {
    const auto batch = constrained_cases(6, config.sampling);
    if (!plain.count(config.sampling)) plain[config.sampling] = run("tiny-flash-fp8", plain_options(64), batch);
    const auto spec = run("tiny-flash-fp8", spec_options(config.algorithm, config.drafts, 33), batch);
    const std::string what = std::string(speculative_algorithm_name(config.algorithm)) + " drafts " +
                             std::to_string(config.drafts) + (config.sampling ? " sampled" : " greedy");
    expect_same(plain[config.sampling], spec, what);
    int64_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < batch.size(); i += 2) {
      expect_striped(spec[i], i % 4 == 0 ? 3 : 0, what);
      drafted += spec[i].drafted, accepted += spec[i].accepted;
    }
    // The constrained requests drafted (forced tokens at least) and had
    // drafts accepted.
    EXPECT_GT(drafted, 0) << what;
    EXPECT_GT(accepted, 0) << what;
  }
}

TEST(SpecEngine, TokensTheGrammarForcesDraftThemselves) {
  // Every token forced: with nothing the n-gram drafter could match, the
  // grammar alone drafts, and every draft is accepted.
  Case c{"forced", prompt_of(30, 5, 4), greedy(40)};
  c.params.ignore_eos = false;
  c.params.constraint = std::make_shared<PositionsFactory>(24, [](int32_t k) { return std::vector<int32_t>{400 + k}; });
  const auto plain = run("tiny-flash-fp8", plain_options(2048), {c});
  const auto spec = run("tiny-flash-fp8", spec_options(SpeculativeAlgorithm::Ngram, 5, 2048), {c});
  expect_same(plain, spec, "forced");
  ASSERT_EQ(spec[0].tokens.size(), 25u);  // 24 forced, then EOS
  for (int32_t i = 0; i < 24; ++i) EXPECT_EQ(spec[0].tokens[size_t(i)], 400 + i);
  EXPECT_EQ(spec[0].reason, FinishReason::Stop);
  EXPECT_EQ(spec[0].accepted, spec[0].drafted);
  EXPECT_LE(spec[0].verifies, 6);  // the first token is drawn plainly, then 6 tokens per step
}

TEST(SpecEngine, MtpChainDraftsInsideTheGrammar) {
  // Two tokens allowed at each of 30 positions: an unmasked MTP chain on
  // random weights almost never proposes either (its first draft would be
  // refused and the drafts would end), a chain drawn inside the grammar
  // drafts its full length on every step; output bitwise plain either way.
  std::vector<Case> batch;
  for (int i = 0; i < 3; ++i) {
    Case c{"two choices " + std::to_string(i), prompt_of(20 + 7 * i, 3 + i, 5), greedy(40)};
    c.params.ignore_eos = false;
    c.params.constraint = std::make_shared<PositionsFactory>(30, [](int32_t) {
      return std::vector<int32_t>{400, 401};
    });
    batch.push_back(c);
  }
  const auto plain = run("tiny-flash-fp8", plain_options(2048), batch);
  const auto spec = run("tiny-flash-fp8", spec_options(SpeculativeAlgorithm::Eagle, 3, 2048), batch);
  expect_same(plain, spec, "two choices");
  for (const Outcome& o : spec) {
    ASSERT_EQ(o.tokens.size(), 31u);  // 30 choices, then EOS
    EXPECT_EQ(o.reason, FinishReason::Stop);
    // Every step after the first token verified drafts (all but the last
    // one or two a full chain of 3): without drafts inside the grammar
    // nearly every step is a plain one.
    const int64_t plain_steps = 30 - (o.verifies + o.accepted);
    EXPECT_LE(plain_steps, 2) << "verifies " << o.verifies << ", accepted " << o.accepted;
    EXPECT_GE(o.drafted, 3 * (o.verifies - 2)) << "verifies " << o.verifies;
  }
}

}  // namespace
}  // namespace dsv4::test
