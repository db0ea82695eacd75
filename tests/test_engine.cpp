// The engine's promises: a seeded request gives the same tokens and logprobs
// alone, in a crowded batch, with chunked prefill and from the prefix cache;
// cancellation frees the sequence; limits give clear errors.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "golden_util.h"

namespace dsv4::test {
namespace {

std::shared_ptr<const Model> shared_model() {
  static std::shared_ptr<const Model> m(Model::load(model_dir("tiny-flash-fp8")).release());
  return m;
}

std::vector<int32_t> prompt_of(int64_t n, int32_t salt) {
  std::vector<int32_t> p = {0};
  for (int64_t i = 1; i < n; ++i) p.push_back(int32_t((i * 131 + salt * 17) % 511 + 1));
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::None;
  int64_t cached = 0;
};

Outcome drain(const std::shared_ptr<RequestHandle>& h) {
  Outcome o;
  std::vector<TokenEvent> ev;
  for (;;) {
    h->wait(ev, 5.0);
    bool done = false;
    for (auto& e : ev) {
      if (e.has_token) o.tokens.push_back(e.sampled.token), o.logprobs.push_back(e.sampled.logprob);
      if (e.finished) done = true, o.reason = e.reason;
    }
    ev.clear();
    if (done) break;
  }
  o.cached = h->cached_tokens();
  return o;
}

SamplingParams sampled(uint64_t seed, int64_t max_new) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.top_k = 50;
  p.seed = seed;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.top_logprobs = 3;
  return p;
}

TEST(Engine, SeededRequestIsIdenticalAloneAndUnderLoad) {
  EngineOptions opt;
  opt.chunked_prefill_size = 64;
  opt.prefix_cache_bytes = 0;
  Outcome alone;
  {
    Engine e(shared_model(), opt);
    alone = drain(e.submit("alone", prompt_of(300, 1), sampled(7, 24)));
  }
  ASSERT_EQ(alone.tokens.size(), 24u);
  Engine e(shared_model(), opt);
  std::vector<std::shared_ptr<RequestHandle>> others;
  for (int i = 0; i < 12; ++i)
    others.push_back(e.submit("other" + std::to_string(i), prompt_of(20 + 37 * i, i + 2), sampled(100 + i, 16 + i)));
  auto target = e.submit("target", prompt_of(300, 1), sampled(7, 24));
  for (int i = 0; i < 6; ++i)
    others.push_back(e.submit("late" + std::to_string(i), prompt_of(150, 50 + i), sampled(9, 10)));
  Outcome crowded = drain(target);
  for (auto& h : others) drain(h);
  EXPECT_EQ(crowded.tokens, alone.tokens);
  EXPECT_EQ(crowded.logprobs, alone.logprobs);  // bitwise
}

// The profiling hook sees every step enter its three phases in order, on
// the scheduler thread, and changes no token.
TEST(Engine, PhaseHookSeesEveryStepInOrderAndChangesNothing) {
  EngineOptions opt;
  opt.prefix_cache_bytes = 0;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 6;
  greedy.ignore_eos = true;
  Outcome plain;
  {
    Engine e(shared_model(), opt);
    plain = drain(e.submit("plain", prompt_of(40, 3), greedy));
  }
  std::vector<StepPhase> phases;
  std::thread::id caller;
  bool one_thread = true;
  opt.on_phase = [&](StepPhase phase) {
    if (phases.empty()) caller = std::this_thread::get_id();
    one_thread = one_thread && std::this_thread::get_id() == caller;
    phases.push_back(phase);
  };
  Outcome hooked;
  {
    Engine e(shared_model(), opt);
    hooked = drain(e.submit("hooked", prompt_of(40, 3), greedy));
  }  // joined: the hook's writes are visible here
  EXPECT_EQ(hooked.tokens, plain.tokens);
  EXPECT_EQ(hooked.logprobs, plain.logprobs);
  EXPECT_TRUE(one_thread);
  EXPECT_NE(caller, std::this_thread::get_id());
  // A step per token (the prompt's gives the first), each in four phases,
  // the last (Done) after the step's events: the handle saw the last token
  // before the engine's last Done, which the join above waits for.
  ASSERT_EQ(phases.size() % 4, 0u);
  EXPECT_GE(phases.size() / 4, 6u);
  for (size_t i = 0; i < phases.size(); ++i) EXPECT_EQ(int(phases[i]), int(i % 4)) << "call " << i;
}

TEST(Engine, PrefixCacheHitGivesTheSameBits) {
  EngineOptions opt;
  opt.chunked_prefill_size = 50;
  Engine e(shared_model(), opt);
  Outcome first = drain(e.submit("a", prompt_of(200, 3), sampled(11, 12)));
  EXPECT_EQ(first.cached, 0);
  Outcome again = drain(e.submit("b", prompt_of(200, 3), sampled(11, 12)));
  EXPECT_EQ(again.cached, 200);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.logprobs, first.logprobs);
  // A longer prompt sharing the prefix reuses it and matches a cold run.
  std::vector<int32_t> longer = prompt_of(200, 3);
  for (int i = 0; i < 77; ++i) longer.push_back(int32_t(5 + i));
  Outcome warm = drain(e.submit("c", longer, sampled(12, 8)));
  EXPECT_EQ(warm.cached, 200);
  EngineOptions cold_opt = opt;
  cold_opt.prefix_cache_bytes = 0;
  Engine cold(shared_model(), cold_opt);
  Outcome fresh = drain(cold.submit("d", longer, sampled(12, 8)));
  EXPECT_EQ(warm.tokens, fresh.tokens);
  EXPECT_EQ(warm.logprobs, fresh.logprobs);
  EXPECT_TRUE(e.flush_cache());
  EXPECT_EQ(e.metrics().prefix_cache_entries, 0);
}

// A client that has its answer and flushes the cache finds it empty: the
// finished sequence went into the cache before its last event was pushed,
// not after (the server's /flush_cache test once found an entry there).
TEST(Engine, AFinishedRequestIsCachedBeforeItsLastEvent) {
  Engine e(shared_model(), EngineOptions());
  // Busy threads make the engine's thread lose its core when it wakes the
  // client, as on a loaded machine, where the race showed.
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int t = 0; t < 3; ++t)
    busy.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  int64_t left = 0, cached = 0;
  for (int32_t i = 0; i < 40; ++i) {
    drain(e.submit(std::to_string(i), prompt_of(24, i), sampled(uint64_t(i), 2)));
    cached += e.metrics().prefix_cache_entries;
    EXPECT_TRUE(e.flush_cache());
    left += e.metrics().prefix_cache_entries;
  }
  stop = true;
  for (auto& t : busy) t.join();
  EXPECT_EQ(cached, 40 * 2);  // the prompt's checkpoint and the conversation's
  EXPECT_EQ(left, 0);
}

TEST(Engine, CancelFreesTheSequence) {
  EngineOptions opt;
  Engine e(shared_model(), opt);
  auto h = e.submit("long", prompt_of(10, 4), sampled(1, 100000));
  std::vector<TokenEvent> ev;
  while (ev.empty()) h->wait(ev, 5.0);
  h->cancel();
  Outcome o = drain(h);
  EXPECT_EQ(o.reason, FinishReason::Abort);
  for (int i = 0; i < 100 && e.metrics().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(e.metrics().running, 0);
  EXPECT_EQ(e.metrics().aborted_total, 1);
  EXPECT_TRUE(e.abort("nonexistent") == false);
}

TEST(Engine, LimitsAreEnforced) {
  EngineOptions opt;
  opt.context_length = 64;
  opt.max_running_requests = 1;
  opt.max_queued_requests = 1;
  Engine e(shared_model(), opt);
  try {
    e.submit("too-long", prompt_of(64, 1), sampled(1, 4));
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(
        std::string(err.what()).find("The input (64 tokens) is longer than the model's context length (64 tokens)"),
        std::string::npos);
  }
  EXPECT_THROW(e.submit("bad-id", {0, 9999}, sampled(1, 4)), Error);
  // Output is capped by the context: 60 prompt tokens leave room for 4.
  Outcome capped = drain(e.submit("capped", prompt_of(60, 1), sampled(1, 1000)));
  EXPECT_EQ(capped.tokens.size(), 4u);
  EXPECT_EQ(capped.reason, FinishReason::Length);
  // One running, one waiting: the third is refused.
  auto a = e.submit("a", prompt_of(8, 1), sampled(1, 50));
  std::vector<TokenEvent> first;
  while (first.empty()) a->wait(first, 5.0);  // a is running now
  auto b = e.submit("b", prompt_of(8, 2), sampled(1, 50));
  bool refused = false;
  try {
    auto c = e.submit("c", prompt_of(8, 3), sampled(1, 50));
    drain(c);
  } catch (const QueueFullError&) {
    refused = true;
  }
  drain(a);
  drain(b);
  EXPECT_TRUE(refused);
}

TEST(Engine, GreedyStopsAtStopTokenAndCountsIt) {
  EngineOptions opt;
  Engine e(shared_model(), opt);
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = 20;
  p.ignore_eos = true;
  Outcome free_run = drain(e.submit("free", prompt_of(30, 9), p));
  ASSERT_EQ(free_run.tokens.size(), 20u);
  p.stop_token_ids = {free_run.tokens[5]};
  Outcome stopped = drain(e.submit("stop", prompt_of(30, 9), p));
  size_t first =
      std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[5]) - free_run.tokens.begin();
  EXPECT_EQ(stopped.tokens.size(), first + 1);
  EXPECT_EQ(stopped.reason, FinishReason::Stop);
}

// The executor's rows are the model's: a multi-token item wanting every row
// gives, batched with another sequence, the bits of feeding its tokens one at
// a time; an item wanting none advances its state and returns no rows.
TEST(Engine, ExecutorRowsMatchOneTokenAtATime) {
  const Model& m = *shared_model();
  const int64_t V = m.config().vocab_size;
  Executor ex(m);
  const std::vector<int32_t> p = prompt_of(40, 5);
  const std::vector<int32_t> head(p.begin(), p.begin() + 36), tail(p.begin() + 36, p.end());
  SequenceState ref = m.new_state();
  std::vector<ExecItem> items = {{&ref, head, LogitRows::None}};
  StepLogits none = ex.run(items);
  EXPECT_EQ(none.rows(0), 0);
  EXPECT_EQ(ref.n_tokens, 36);
  std::vector<std::vector<float>> want;
  for (int32_t t : tail) {
    items = {{&ref, {t}, LogitRows::Last}};
    StepLogits l = ex.run(items);
    ASSERT_EQ(l.rows(0), 1);
    want.emplace_back(l.row(0, 0), l.row(0, 0) + V);
  }
  SequenceState a = m.new_state(), b = m.new_state();
  items = {{&a, head, LogitRows::None}, {&b, prompt_of(17, 6), LogitRows::Last}};
  ex.run(items);
  items = {{&b, {3}, LogitRows::Last}, {&a, tail, LogitRows::All}};
  StepLogits all = ex.run(items);
  EXPECT_EQ(all.rows(0), 1);
  ASSERT_EQ(all.rows(1), int64_t(tail.size()));
  EXPECT_EQ(a.n_tokens, 40);
  for (size_t r = 0; r < tail.size(); ++r)
    EXPECT_EQ(std::vector<float>(all.row(1, int64_t(r)), all.row(1, int64_t(r)) + V), want[r]) << r;  // bitwise
  EXPECT_EQ(all.last_row(1), all.row(1, int64_t(tail.size()) - 1));
}

// A constraint that forces the tokens first, first+1, ..., first+length-1,
// then lets the sequence end, and during tokens 1 and 2 allows two choices.
class CountingConstraint : public TokenConstraint {
 public:
  CountingConstraint(int32_t first, int32_t length) : first_(first), length_(length) {}
  bool fill_mask(TokenMask& mask) override {
    if (count_ < length_) mask_set(mask, first_ + count_);
    if (count_ == 1 || count_ == 2) mask_set(mask, first_ + 100 + count_);
    return true;
  }
  bool can_finish() const override { return count_ >= length_; }
  bool accept(int32_t token) override {
    if (count_ >= length_) return false;
    ++count_;
    return token >= 0;
  }
  void rollback(int64_t n) override { count_ = std::max<int32_t>(0, count_ - int32_t(n)); }
  int64_t max_rollback() const override { return length_; }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<CountingConstraint>(*this); }

 private:
  int32_t first_, length_, count_ = 0;
};

class CountingFactory : public ConstraintFactory {
 public:
  std::unique_ptr<TokenConstraint> start() const override { return std::make_unique<CountingConstraint>(20, 6); }
};

TEST(Engine, ConstraintMasksTheDrawAndEndsTheSequence) {
  EngineOptions opt;
  opt.prefix_cache_bytes = 0;
  const int32_t eos = int32_t(shared_model()->config().eos_token_id);
  auto constrained = [](uint64_t seed) {
    SamplingParams p = sampled(seed, 40);
    p.ignore_eos = false;
    p.min_new_tokens = 10;  // the grammar outranks it: EOS once complete
    p.constraint = std::make_shared<CountingFactory>();
    return p;
  };
  Outcome alone;
  {
    Engine e(shared_model(), opt);
    alone = drain(e.submit("alone", prompt_of(40, 3), constrained(5)));
  }
  ASSERT_EQ(alone.tokens.size(), 7u);
  EXPECT_EQ(alone.reason, FinishReason::Stop);
  EXPECT_EQ(alone.tokens[0], 20);
  for (int i : {1, 2}) EXPECT_TRUE(alone.tokens[size_t(i)] == 20 + i || alone.tokens[size_t(i)] == 120 + i);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(alone.tokens[size_t(i)], 20 + i);
  EXPECT_EQ(alone.tokens[6], eos);
  // The same tokens in a batch with unconstrained and constrained neighbours.
  Engine e(shared_model(), opt);
  std::vector<std::shared_ptr<RequestHandle>> others;
  for (int i = 0; i < 6; ++i)
    others.push_back(
        e.submit("other" + std::to_string(i), prompt_of(30 + i, i), i % 2 ? constrained(i) : sampled(i, 12)));
  auto target = e.submit("target", prompt_of(40, 3), constrained(5));
  Outcome crowded = drain(target);
  for (auto& h : others) drain(h);
  EXPECT_EQ(crowded.tokens, alone.tokens);
  EXPECT_EQ(crowded.logprobs, alone.logprobs);
}

TEST(EngineValidate, OneCheckOfIdsAndLength) {
  const RequestLimits limits{512, 64};
  SamplingParams p;
  p.max_new_tokens = 1000;
  // 60 prompt tokens leave room for 4 in a context of 64.
  EXPECT_EQ(validate_request(limits, prompt_of(60, 1), p).params().max_new_tokens, 4);
  p.max_new_tokens = 3;
  EXPECT_EQ(validate_request(limits, prompt_of(60, 1), p).params().max_new_tokens, 3);
  EXPECT_EQ(validate_request(limits, {511}, p).params().max_new_tokens, 3);
  // A length the client asked for that does not fit: refused, or cut to
  // fit with clamp_max_tokens (but never past the context itself).
  p.max_new_tokens = 5;
  p.max_new_tokens_explicit = true;
  EXPECT_THROW(validate_request(limits, prompt_of(60, 1), p), Error);
  EXPECT_EQ(validate_request({512, 64, true}, prompt_of(60, 1), p).params().max_new_tokens, 4);
  p.max_new_tokens = 65;
  EXPECT_THROW(validate_request({512, 64, true}, prompt_of(60, 1), p), Error);
  p.max_new_tokens = 3;
  p.max_new_tokens_explicit = false;
  EXPECT_THROW(validate_request(limits, {}, p), Error);
  EXPECT_THROW(validate_request(limits, {0, 512}, p), Error);
  EXPECT_THROW(validate_request(limits, {-1}, p), Error);
  p.stop_token_ids = {7, 512};
  EXPECT_THROW(validate_request(limits, {0}, p), Error);
  p.stop_token_ids = {7, 511};
  EXPECT_NO_THROW(validate_request(limits, {0}, p));
  try {
    validate_request(limits, prompt_of(64, 1), p);
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(
        std::string(err.what()).find("The input (64 tokens) is longer than the model's context length (64 tokens)"),
        std::string::npos);
  }
}

}  // namespace
}  // namespace dsv4::test
