// The refreshed checkpoints that bundle a DSpark head (V4-Flash-0731,
// V4-Pro-0813 layout; here the smoke shapes, `make-model --preset
// smoke-0731`): they load with every DSpark tensor checked, a missing or
// mis-shaped one is named, and the main model computes exactly what the
// same checkpoint without the head computes (target-only serving). The
// draft depends only on the tokens (not on chunking or batching), and
// DSPARK speculation gives plain decoding's tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "positions_constraint.h"
#include "request_outcome.h"
#include "striped_constraint.h"

namespace dsv4::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class DsparkCheckpoint : public ::testing::Test {
 protected:
  // CTest runs every test in a process of its own, and writing the
  // checkpoints takes most of a test's time. Its fixtures write them once:
  // the smoke checkpoint the server tests use (`dsv4 make-model`) and the
  // 0731 one beside it (`--preset smoke-0731`, the same seed), removed after
  // the suite. Run alone, the binary writes its own copies.
  static void SetUpTestSuite() {
    dspark_dir_ = DSV4_DSPARK_MODEL;
    plain_dir_ = DSV4_SMOKE_MODEL;
    if (fs::exists(dspark_dir_ / "config.json") && fs::exists(plain_dir_ / "config.json")) return;
    owned_root_ = fs::temp_directory_path() / ("dsv4_dspark_" + std::to_string(::getpid()));
    dspark_dir_ = owned_root_ / "0731";
    plain_dir_ = owned_root_ / "plain";
    SyntheticSpec spec;
    spec.preset = "smoke-0731";
    write_synthetic_checkpoint(spec, dspark_dir_.string(), "");
    spec.preset = "smoke";
    write_synthetic_checkpoint(spec, plain_dir_.string(), "");
  }
  static void TearDownTestSuite() {
    if (!owned_root_.empty()) fs::remove_all(owned_root_);
  }

  // A copy of the 0731 checkpoint with its safetensors header edited.
  std::string load_error_after(const std::function<void(json&)>& edit) {
    const fs::path dir = fs::temp_directory_path() / ("dsv4_dspark_edited_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(dspark_dir_ / "config.json", dir / "config.json");
    std::ifstream in(dspark_dir_ / "model.safetensors", std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string all = bytes.str();
    uint64_t n;
    std::memcpy(&n, all.data(), 8);
    json header = json::parse(all.substr(8, n));
    edit(header);
    std::string h = header.dump();
    while (h.size() % 8) h.push_back(' ');
    const uint64_t size = h.size();
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << h << all.substr(8 + n);
    out.close();
    std::string error;
    try {
      Model::load(dir.string());
    } catch (const Error& e) {
      error = e.what();
    }
    fs::remove_all(dir);
    return error;
  }

  static fs::path dspark_dir_, plain_dir_, owned_root_;
};
fs::path DsparkCheckpoint::dspark_dir_, DsparkCheckpoint::plain_dir_, DsparkCheckpoint::owned_root_;

TEST_F(DsparkCheckpoint, LoadsWithItsHeadAndNoMtp) {
  auto model = Model::load(dspark_dir_.string());
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.dspark_stages, 3);
  EXPECT_EQ(c.dspark_block_size, 5);
  EXPECT_EQ(c.dspark_noise_token_id, 128799);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(c.n_mtp_layers, 0) << "the legacy num_nextn_predict_layers must be ignored";
  EXPECT_FALSE(model->has_mtp());
  ASSERT_TRUE(model->weights().dspark.has_value());
  EXPECT_EQ(model->weights().dspark->stages.size(), 3u);
  EXPECT_EQ(model->weights().dspark->main_proj.cols, 3 * c.dim);
}

TEST_F(DsparkCheckpoint, MainModelMatchesTheCheckpointWithoutTheHead) {
  auto with_head = Model::load(dspark_dir_.string());
  auto plain = Model::load(plain_dir_.string());
  const std::vector<int32_t> tokens = {0, 5, 77, 1024, 99, 31337, 7, 8};
  const int64_t n = int64_t(tokens.size()), vocab = plain->config().vocab_size;
  std::vector<float> a(size_t(n * vocab)), b(size_t(n * vocab));
  SequenceState sa = with_head->new_state(), sb = plain->new_state();
  with_head->forward(sa, tokens.data(), n, a.data());
  plain->forward(sb, tokens.data(), n, b.data());
  EXPECT_EQ(a, b);
}

TEST_F(DsparkCheckpoint, MissingDsparkTensorIsNamed) {
  const std::string e = load_error_after([](json& h) { h.erase("mtp.2.markov_head.markov_w2.weight"); });
  EXPECT_NE(e.find("missing tensor mtp.2.markov_head.markov_w2.weight"), std::string::npos) << e;
  const std::string stage = load_error_after([](json& h) { h.erase("mtp.1.attn.wkv.weight"); });
  EXPECT_NE(stage.find("mtp.1.attn.wkv.weight"), std::string::npos) << stage;
}

TEST_F(DsparkCheckpoint, MisShapedDsparkTensorIsNamed) {
  const std::string e = load_error_after([](json& h) {
    auto shape = h["mtp.2.confidence_head.proj.weight"]["shape"];
    h["mtp.2.confidence_head.proj.weight"]["shape"] = {shape[1], shape[0]};
  });
  EXPECT_NE(e.find("mtp.2.confidence_head.proj.weight"), std::string::npos) << e;
}

// The prompt's target-layer states go into the rings, chunked or one token
// at a time; drafts after the last position, alone or batched.
struct Drafted {
  std::vector<int32_t> ids;
  std::vector<float> logits, confidence;
};

SequenceState prefill(const Model& model, const std::vector<int32_t>& tokens, int64_t chunk) {
  const ModelConfig& c = model.config();
  const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  SequenceState state = model.new_state();
  for (int64_t b = 0; b < int64_t(tokens.size()); b += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(tokens.size()) - b);
    std::vector<float> hidden(size_t(n * width));
    BatchItem item{&state, tokens.data() + b, n};
    item.dspark_hidden = hidden.data();
    model.forward_batch({item});
    model.dspark_extend(state, hidden.data(), b, n);
  }
  return state;
}

std::vector<Drafted> draft(const Model& model, std::vector<SequenceState*> states, const std::vector<int32_t>& first) {
  const ModelConfig& c = model.config();
  const int64_t block = c.dspark_block_size;
  std::vector<Drafted> out(states.size());
  std::vector<DsparkDraftItem> items;
  for (size_t i = 0; i < states.size(); ++i) {
    out[i].ids.resize(size_t(block + 1));
    out[i].logits.resize(size_t(block * c.vocab_size));
    out[i].confidence.resize(size_t(block));
    items.push_back({states[i], first[i], block, out[i].ids.data(), out[i].logits.data(), out[i].confidence.data(), {}});
  }
  model.dspark_draft(items);
  return out;
}

TEST_F(DsparkCheckpoint, DraftDependsOnlyOnTheTokens) {
  auto model = Model::load(dspark_dir_.string());
  std::vector<int32_t> a, b;
  for (int i = 0; i < 150; ++i) a.push_back(int32_t((i * 7919) % 120000 + 3));
  for (int i = 0; i < 40; ++i) b.push_back(int32_t((i * 104729) % 120000 + 5));
  SequenceState whole = prefill(*model, a, 1000), chunked = prefill(*model, a, 37), single = prefill(*model, a, 1);
  SequenceState other = prefill(*model, b, 16);
  const auto alone = draft(*model, {&whole}, {11});
  const auto by_chunks = draft(*model, {&chunked}, {11});
  const auto by_tokens = draft(*model, {&single}, {11});
  const auto batched = draft(*model, {&other, &whole}, {99, 11});
  for (const auto* d : {&by_chunks[0], &by_tokens[0], &batched[1]}) {
    EXPECT_EQ(d->ids, alone[0].ids);
    EXPECT_EQ(d->logits, alone[0].logits);
    EXPECT_EQ(d->confidence, alone[0].confidence);
  }
  EXPECT_EQ(alone[0].ids[0], 11);
  // The Markov bias is in the logits: each id is its row's argmax.
  const int64_t V = model->config().vocab_size;
  for (int64_t i = 0; i < model->config().dspark_block_size; ++i) {
    const float* row = alone[0].logits.data() + i * V;
    EXPECT_EQ(alone[0].ids[size_t(i + 1)], int32_t(std::max_element(row, row + V) - row));
  }
  // A draft leaves the state as it was: drafting again gives the same.
  EXPECT_EQ(draft(*model, {&whole}, {11})[0].logits, alone[0].logits);
}

TEST_F(DsparkCheckpoint, SpeculationGivesPlainDecodingsTokens) {
  std::shared_ptr<const Model> model(Model::load(dspark_dir_.string()).release());
  auto run = [&](bool speculate, bool sampling) {
    EngineOptions o;
    o.prefix_cache_bytes = 0;
    o.chunked_prefill_size = 29;
    if (speculate) {
      o.speculative.algorithm = SpeculativeAlgorithm::Dspark;
      o.speculative.dspark_block = model->config().dspark_block_size;
      o.speculative.num_draft_tokens = o.speculative.dspark_block + 1;
      o.speculative.auto_bypass = false;
    }
    Engine engine(model, o);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int r = 0; r < 4; ++r) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 30 + 25 * r; ++i) prompt.push_back(int32_t(((i % (3 + r)) * 7919 + r) % 120000 + 3));
      SamplingParams p;
      p.temperature = sampling ? 0.7f : 0.0f;
      p.seed = uint64_t(r + 1);
      p.max_new_tokens = 20;
      p.ignore_eos = true;
      // Two requests under a grammar: their drafts are fitted to it.
      if (r % 2) p.constraint = std::make_shared<StripedFactory>(r == 1 ? 2 : 0, 1000);
      handles.push_back(engine.submit("r" + std::to_string(r), prompt, p));
    }
    std::vector<std::vector<int32_t>> out;
    int64_t verifies = 0;
    for (auto& h : handles) {
      std::vector<TokenEvent> events;
      std::vector<int32_t> tokens;
      for (bool done = false; !done;) {
        events.clear();
        h->wait(events, 5.0);
        for (auto& e : events) {
          if (e.has_token) tokens.push_back(e.sampled.token);
          done |= e.finished;
        }
      }
      out.push_back(tokens);
      verifies += h->spec_verify_ct();
    }
    if (speculate) {
      EXPECT_GT(verifies, 0);
    }
    return out;
  };
  for (bool sampling : {false, true}) EXPECT_EQ(run(true, sampling), run(false, sampling)) << sampling;
}

TEST_F(DsparkCheckpoint, MarkovChainDraftsInsideTheGrammar) {
  // Two tokens allowed at each of 30 positions: an unconstrained Markov
  // chain on random weights almost never proposes either (the first draft
  // is refused and the drafts end), a chain drawn inside the grammar keeps
  // its block; output bitwise plain either way.
  std::shared_ptr<const Model> model(Model::load(dspark_dir_.string()).release());
  const int64_t block = model->config().dspark_block_size;
  auto run = [&](bool speculate) {
    EngineOptions o;
    o.prefix_cache_bytes = 0;
    if (speculate) {
      o.speculative.algorithm = SpeculativeAlgorithm::Dspark;
      o.speculative.dspark_block = block;
      o.speculative.num_draft_tokens = block + 1;
      o.speculative.auto_bypass = false;
    }
    Engine engine(model, o);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int r = 0; r < 3; ++r) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 20 + 7 * r; ++i) prompt.push_back(int32_t((i * 7919 + 31 * r) % 120000 + 3));
      SamplingParams p;
      p.temperature = 0.0f;
      p.max_new_tokens = 40;
      p.constraint = std::make_shared<PositionsFactory>(30, [](int32_t) { return std::vector<int32_t>{400, 401}; });
      handles.push_back(engine.submit("r" + std::to_string(r), prompt, p));
    }
    std::vector<Outcome> out;
    for (auto& h : handles) out.push_back(drain(h));
    return out;
  };
  const std::vector<Outcome> plain = run(false), spec = run(true);
  ASSERT_EQ(plain.size(), spec.size());
  for (size_t i = 0; i < spec.size(); ++i) {
    EXPECT_EQ(spec[i].tokens, plain[i].tokens) << i;
    EXPECT_EQ(spec[i].logprobs, plain[i].logprobs) << i;
    ASSERT_EQ(spec[i].tokens.size(), 31u) << i;  // 30 choices, then EOS
    EXPECT_EQ(spec[i].reason, FinishReason::Stop) << i;
    // Every step after the first token verified drafts, all but the last
    // one or two a full block: without drafts inside the grammar nearly
    // every step is a plain one.
    const int64_t plain_steps = 30 - (spec[i].verifies + spec[i].accepted);
    EXPECT_LE(plain_steps, 2) << "verifies " << spec[i].verifies << ", accepted " << spec[i].accepted;
    EXPECT_GE(spec[i].drafted, block * (spec[i].verifies - 2)) << "verifies " << spec[i].verifies;
  }
}

TEST(DsparkConfig, RefreshedPresetsHaveTheOfficialLayout) {
  SyntheticSpec spec;
  spec.preset = "flash-0731";
  spec.layers = 43;
  ModelConfig flash = parse_config(synthetic_config(spec).dump(), "flash-0731");
  EXPECT_EQ(flash.compress_ratios.size(), 46u);
  EXPECT_EQ(flash.dspark_target_layer_ids, (std::vector<int64_t>{40, 41, 42}));
  EXPECT_EQ(flash.dspark_markov_rank, 256);
  spec.preset = "pro-0813";
  spec.layers = 61;
  ModelConfig pro = parse_config(synthetic_config(spec).dump(), "pro-0813");
  EXPECT_EQ(pro.compress_ratios.size(), 64u);
  EXPECT_EQ(pro.dspark_target_layer_ids, (std::vector<int64_t>{58, 59, 60}));
  EXPECT_EQ(pro.dspark_markov_rank, 512);
  EXPECT_EQ(pro.dspark_stages, 3);
  EXPECT_EQ(pro.n_mtp_layers, 0);
}

TEST(DsparkConfig, BadFieldsAreNamed) {
  SyntheticSpec spec;
  spec.preset = "smoke-0731";
  json c = synthetic_config(spec);
  c["dspark_target_layer_ids"] = {0, 9, 1};
  try {
    parse_config(c.dump(), "config.json");
    FAIL() << "a target layer past the main layers must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dspark_target_layer_ids"), std::string::npos) << e.what();
  }
  c = synthetic_config(spec);
  c["compress_ratios"].back() = 4;
  try {
    parse_config(c.dump(), "config.json");
    FAIL() << "a compressed DSpark stage must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSpark stages must have compress ratio 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv4::test
