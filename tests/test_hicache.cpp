// HiCache (docs/hicache.md): a request resuming from any tier of the prefix
// cache (L1, L2, L3, L3 after a restart) gets the tokens and logprobs of a
// cold run, bit for bit, for a shared system prompt, a continued
// conversation and a branch off an earlier turn; damaged, truncated and
// foreign records are never used; a tiny budget under many concurrent
// requests, identical concurrent requests and a flush under load keep every
// answer exact; an unwritable directory only turns the storage tier off.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "golden_util.h"
#include "model/fingerprint.h"

namespace dsv4::test {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const Model> shared_model() {
  static std::shared_ptr<const Model> m(Model::load(model_dir("tiny-flash-fp8")).release());
  return m;
}

std::vector<int32_t> tokens_of(int64_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((i * 131 + salt * 17 + salt * i % 7) % 511 + 1));
  return p;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t cached = 0;
};

Outcome drain(const std::shared_ptr<RequestHandle>& h) {
  Outcome o;
  std::vector<TokenEvent> ev;
  for (bool done = false; !done;) {
    h->wait(ev, 5.0);
    for (auto& e : ev) {
      if (e.has_token) o.tokens.push_back(e.sampled.token), o.logprobs.push_back(e.sampled.logprob);
      done = done || e.finished;
    }
    ev.clear();
  }
  o.cached = h->cached_tokens();
  return o;
}

SamplingParams sampled(uint64_t seed, int64_t max_new = 8) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.seed = seed;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.top_logprobs = 2;
  return p;
}

// Small pages and checkpoints, so that 100-token prompts cross several.
EngineOptions cache_options(int64_t device_bytes = int64_t(64) << 20, int64_t host_bytes = 0,
                            const std::string& dir = "") {
  EngineOptions o;
  o.chunked_prefill_size = 48;
  o.prefix_cache_bytes = device_bytes;
  o.hicache.page_tokens = 16;
  o.hicache.checkpoint_interval = 32;
  o.hicache.host_bytes = host_bytes;
  o.hicache.prefetch_threshold = 1;
  if (!dir.empty()) {
    o.hicache.storage_dir = dir;
    o.hicache.model_identity = model_fingerprint(model_dir("tiny-flash-fp8"));
    o.hicache.prefetch_policy = PrefetchPolicy::WaitComplete;
  }
  return o;
}

Outcome cold(const std::vector<int32_t>& prompt, const SamplingParams& p) {
  EngineOptions o;
  o.prefix_cache_bytes = 0;
  Engine e(shared_model(), o);
  return drain(e.submit("cold", prompt, p));
}

void expect_same(const Outcome& a, const Outcome& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.logprobs, b.logprobs);  // bitwise
}

// Until the engine retired every request (its cache inserts come after the
// last token's event) and storage wrote what was queued.
void settle(Engine& e) {
  for (int i = 0; i < 500 && (e.metrics().running > 0 || e.metrics().queued > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  e.drain_cache_storage();
}

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("dsv4-hicache-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

TEST(HiCache, SharedSystemPromptResumesFromAnInPromptCheckpoint) {
  Engine e(shared_model(), cache_options());
  const auto system = tokens_of(75, 1);
  const auto a = cat(system, tokens_of(20, 2)), b = cat(system, tokens_of(63, 3));  // b crosses 128
  drain(e.submit("a", a, sampled(1)));
  const Outcome warm = drain(e.submit("b", b, sampled(2)));
  EXPECT_EQ(warm.cached, 64);  // the deepest checkpoint (every 32 tokens) inside the shared 75
  expect_same(warm, cold(b, sampled(2)));
}

TEST(HiCache, SameConversationAndABranchOffAnEarlierTurn) {
  Engine e(shared_model(), cache_options());
  const auto turn1 = tokens_of(100, 4);  // turn 2 resumes at 107 and crosses 128
  const Outcome r1 = drain(e.submit("t1", turn1, sampled(3)));
  // The next turn resends the conversation: prompt + answer + a new message.
  const auto conv1 = cat(turn1, r1.tokens);
  const auto turn2 = cat(conv1, tokens_of(30, 5));
  const Outcome r2 = drain(e.submit("t2", turn2, sampled(4)));
  EXPECT_EQ(r2.cached, int64_t(conv1.size()) - 1);  // all but the answer's last token, never fed
  expect_same(r2, cold(turn2, sampled(4)));
  const auto turn3 = cat(cat(turn2, r2.tokens), tokens_of(10, 6));
  const Outcome r3 = drain(e.submit("t3", turn3, sampled(5)));
  EXPECT_EQ(r3.cached, int64_t(turn2.size() + r2.tokens.size()) - 1);
  expect_same(r3, cold(turn3, sampled(5)));
  // A branch: turn 2 again with another message.
  const auto branch = cat(conv1, tokens_of(41, 7));
  const Outcome rb = drain(e.submit("branch", branch, sampled(6)));
  EXPECT_EQ(rb.cached, int64_t(conv1.size()) - 1);
  expect_same(rb, cold(branch, sampled(6)));
  // The same prompt again: its logits are stored, no forward pass at all.
  const Outcome again = drain(e.submit("again", branch, sampled(6)));
  EXPECT_EQ(again.cached, int64_t(branch.size()));
  expect_same(again, rb);
}

TEST(HiCache, HitsFromTheHostTierAfterL1Evicts) {
  // L1 holds about one prompt's parts; L2 holds them all.
  Engine e(shared_model(), cache_options(int64_t(2) << 20, int64_t(64) << 20));
  const auto first = tokens_of(90, 8);
  drain(e.submit("first", first, sampled(7)));
  for (int i = 0; i < 4; ++i) drain(e.submit("other" + std::to_string(i), tokens_of(90, 20 + i), sampled(8)));
  const HiCacheMetrics before = e.metrics().hicache;
  EXPECT_GT(before.evictions_device, 0);
  const auto longer = cat(first, tokens_of(9, 9));
  const Outcome warm = drain(e.submit("again", longer, sampled(9)));
  EXPECT_EQ(warm.cached, int64_t(first.size()));
  const HiCacheMetrics after = e.metrics().hicache;
  EXPECT_GT(after.cached_host, before.cached_host);
  EXPECT_GT(after.load_back_tokens, before.load_back_tokens);
  expect_same(warm, cold(longer, sampled(9)));
}

TEST(HiCache, StorageTierSurvivesARestartAndServesTheSameBits) {
  const std::string dir = temp_dir("restart");
  const auto prompt = tokens_of(100, 10);
  const auto longer = cat(prompt, tokens_of(43, 11));
  {
    Engine e(shared_model(), cache_options(int64_t(64) << 20, int64_t(128) << 20, dir));
    drain(e.submit("a", prompt, sampled(10)));
    settle(e);
    EXPECT_GT(e.metrics().hicache.storage.writes, 0);
  }
  // A new engine (a restarted server): nothing in memory, the files remain.
  Engine e(shared_model(), cache_options(int64_t(64) << 20, int64_t(128) << 20, dir));
  const Outcome warm = drain(e.submit("b", longer, sampled(11)));
  EXPECT_EQ(warm.cached, int64_t(prompt.size()));
  const HiCacheMetrics m = e.metrics().hicache;
  EXPECT_EQ(m.cached_storage, int64_t(prompt.size()));
  EXPECT_EQ(m.hit_storage, 1);
  expect_same(warm, cold(longer, sampled(11)));
  // The identical prompt: its logits came from storage too.
  Engine e2(shared_model(), cache_options(int64_t(64) << 20, int64_t(128) << 20, dir));
  const Outcome same = drain(e2.submit("c", prompt, sampled(10)));
  EXPECT_EQ(same.cached, int64_t(prompt.size()));
  expect_same(same, cold(prompt, sampled(10)));
  fs::remove_all(dir);
}

// Damages every record of a storage directory with `damage`, then checks
// that a restarted engine serves the prompt exactly, from no damaged record.
void check_damage(const std::string& name, const std::function<void(const fs::path&, size_t)>& damage) {
  const std::string dir = temp_dir(name);
  const auto prompt = tokens_of(90, 12), longer = cat(prompt, tokens_of(51, 13));
  {
    Engine e(shared_model(), cache_options(int64_t(64) << 20, int64_t(128) << 20, dir));
    drain(e.submit("a", prompt, sampled(12)));
    settle(e);
  }
  std::vector<fs::path> files;
  for (auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
  ASSERT_GT(files.size(), 3u);
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i < files.size(); ++i) damage(files[i], i);
  Engine e(shared_model(), cache_options(int64_t(64) << 20, int64_t(128) << 20, dir));
  const Outcome warm = drain(e.submit("b", longer, sampled(13)));
  const HiCacheMetrics m = e.metrics().hicache;
  EXPECT_EQ(m.cached_storage, 0) << name;
  EXPECT_GT(m.storage.corrupt, 0) << name;
  expect_same(warm, cold(longer, sampled(13)));
  fs::remove_all(dir);
}

TEST(HiCache, FlippedBytesAreDetectedAndNeverUsed) {
  check_damage("flip", [](const fs::path& f, size_t i) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = fs::file_size(f);
    // Header, token ids and payload in turn.
    const size_t at = i % 3 == 0 ? 40 : i % 3 == 1 ? 125 : size_t(size) - 17;
    io.seekg(std::streamoff(at));
    char c;
    io.read(&c, 1);
    c = char(c ^ 0x10);
    io.seekp(std::streamoff(at));
    io.write(&c, 1);
  });
}

TEST(HiCache, TruncatedRecordsAreDetectedAndNeverUsed) {
  check_damage("truncate", [](const fs::path& f, size_t i) {
    const auto size = fs::file_size(f);
    fs::resize_file(f, i % 2 ? size - 1 : size / 2);
  });
}

TEST(HiCache, AnotherModelsRecordsAreNeverUsed) {
  // The records of a second model (another identity, the same prompts) take
  // the names of the first model's records.
  const std::string other = temp_dir("other-model");
  const auto prompt = tokens_of(90, 12);
  {
    EngineOptions o = cache_options(int64_t(64) << 20, int64_t(128) << 20, other);
    o.hicache.model_identity = model_fingerprint(model_dir("tiny-flash-bf16"));
    Engine e(std::shared_ptr<const Model>(Model::load(model_dir("tiny-flash-bf16")).release()), o);
    drain(e.submit("a", prompt, sampled(12)));
    settle(e);
  }
  std::vector<fs::path> theirs;
  for (auto& f : fs::directory_iterator(other)) theirs.push_back(f.path());
  std::sort(theirs.begin(), theirs.end(), [](auto& a, auto& b) { return fs::file_size(a) < fs::file_size(b); });
  check_damage("swap", [&](const fs::path& f, size_t i) { fs::copy_file(theirs[i % theirs.size()], f,
                                                                          fs::copy_options::overwrite_existing); });
  fs::remove_all(other);
}

TEST(HiCache, FingerprintChangesWithTheWeights) {
  const std::string dir = temp_dir("fingerprint");
  fs::copy(model_dir("tiny-flash-fp8"), dir);
  const std::string before = model_fingerprint(dir);
  EXPECT_EQ(before, model_fingerprint(model_dir("tiny-flash-fp8")));
  for (auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") {
      std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(std::streamoff(fs::file_size(f.path()) - 5));
      io.write("x", 1);
    }
  EXPECT_NE(before, model_fingerprint(dir));
  fs::remove_all(dir);
}

TEST(HiCache, UnwritableDirectoryTurnsTheStorageTierOffWithOneWarning) {
  const std::string file = temp_dir("not-a-dir");
  std::ofstream(file) << "x";
  EngineOptions o = cache_options(int64_t(64) << 20, int64_t(128) << 20, file + "/cache");
  int warnings = 0;
  o.hicache.warn = [&](const std::string&) { ++warnings; };
  Engine e(shared_model(), o);
  const auto prompt = tokens_of(70, 14);
  const Outcome r = drain(e.submit("a", prompt, sampled(14)));
  expect_same(r, cold(prompt, sampled(14)));
  EXPECT_FALSE(e.metrics().hicache.storage.enabled);
  EXPECT_EQ(warnings, 1);
  fs::remove(file);
}

TEST(HiCache, TinyBudgetUnderManyConcurrentRequestsKeepsEveryAnswerExact) {
  // Budgets of a few parts: eviction runs on nearly every insert while the
  // requests share prefixes and hold leases.
  EngineOptions o = cache_options(int64_t(3) << 20, int64_t(4) << 20);
  o.hicache.write_policy = WritePolicy::WriteBack;
  Engine e(shared_model(), o);
  const auto system = tokens_of(40, 15);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 24; ++i) {
    prompts.push_back(cat(i % 2 ? system : tokens_of(24, 16), tokens_of(10 + i, 30 + i % 5)));
    handles.push_back(e.submit("c" + std::to_string(i), prompts.back(), sampled(100 + uint64_t(i % 5), 4)));
  }
  std::vector<Outcome> got;
  for (auto& h : handles) got.push_back(drain(h));
  EXPECT_GT(e.metrics().hicache.evictions_device, 0);
  EXPECT_GT(e.metrics().hicache.evictions_host, 0);
  for (size_t i = 0; i < prompts.size(); i += 3) expect_same(got[i], cold(prompts[i], sampled(100 + i % 5, 4)));
}

TEST(HiCache, TwoRequestsCreatingTheSamePrefixAtOnce) {
  Engine e(shared_model(), cache_options());
  const auto prompt = tokens_of(80, 17);
  auto a = e.submit("a", prompt, sampled(18)), b = e.submit("b", prompt, sampled(18));
  const Outcome ra = drain(a), rb = drain(b);
  settle(e);
  expect_same(ra, rb);
  expect_same(ra, cold(prompt, sampled(18)));
  const HiCacheMetrics m = e.metrics().hicache;
  EXPECT_EQ(m.nodes, 5);  // 80 tokens: five pages of 16, stored once
  const Outcome again = drain(e.submit("c", prompt, sampled(18)));
  EXPECT_EQ(again.cached, 80);
  expect_same(again, ra);
}

TEST(HiCache, FlushUnderLoadLetsRunningRequestsFinishExactly) {
  const std::string dir = temp_dir("flush");
  Engine e(shared_model(), cache_options(int64_t(64) << 20, int64_t(128) << 20, dir));
  const auto system = tokens_of(60, 19);
  drain(e.submit("warm", cat(system, tokens_of(5, 1)), sampled(1)));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(cat(system, tokens_of(12 + i, 40 + i)));
    handles.push_back(e.submit("f" + std::to_string(i), prompts.back(), sampled(50 + uint64_t(i), 12)));
    if (i == 2) {
      EXPECT_TRUE(e.flush_cache());
    }
  }
  for (size_t i = 0; i < handles.size(); ++i) expect_same(drain(handles[i]), cold(prompts[i], sampled(50 + i, 12)));
  settle(e);
  EXPECT_TRUE(e.flush_cache());
  e.drain_cache_storage();
  const HiCacheMetrics m = e.metrics().hicache;
  EXPECT_EQ(m.nodes, 0);
  EXPECT_EQ(m.device_bytes + m.host_bytes, 0);
  size_t left = 0;
  for (auto& f : fs::directory_iterator(dir)) left += f.path().extension() == ".dsv4";
  EXPECT_EQ(left, 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsv4::test
