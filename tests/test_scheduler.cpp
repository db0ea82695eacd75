// The scheduler as a pure function: admission (FCFS within the running and
// token budgets, cancelled requests dropped) and the batch of one step
// (prefill budget, decode items, drafts, cached logits, cancellation).
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/scheduler.h"

namespace dsv4 {
namespace {

SchedulerBudgets budgets(int64_t max_running, int64_t max_total, int64_t prefill) {
  SchedulerBudgets b;
  b.max_running_requests = max_running;
  b.max_total_tokens = max_total;
  b.chunked_prefill_size = prefill;
  return b;
}

std::vector<WaitingSummary> queue(std::initializer_list<int64_t> reserved) {
  std::vector<WaitingSummary> w;
  for (int64_t r : reserved) w.push_back({r, false});
  return w;
}

RunningSummary prefilling(int64_t fed, int64_t prompt) {
  RunningSummary r;
  r.phase = Phase::Prefilling;
  r.fed = fed;
  r.known = prompt;
  return r;
}

RunningSummary decoding(int64_t fed, int64_t drafts = 0) {
  RunningSummary r;
  r.phase = Phase::Decoding;
  r.fed = fed;
  r.known = fed + 1;  // the last sampled token is not fed yet
  r.draft_tokens = drafts;
  return r;
}

using Idx = std::vector<size_t>;

TEST(EngineScheduler, AdmitsFirstComeFirstServedUpToTheRunningLimit) {
  Admission a = schedule_admission(queue({10, 10, 10, 10, 10}), 2, 20, budgets(4, 0, 64));
  EXPECT_EQ(a.admitted, (Idx{0, 1}));
  EXPECT_TRUE(a.dropped.empty());
  EXPECT_EQ(a.used_tokens, 40);
  // A full engine admits nobody.
  a = schedule_admission(queue({10}), 4, 40, budgets(4, 0, 64));
  EXPECT_TRUE(a.admitted.empty());
  EXPECT_EQ(a.used_tokens, 40);
}

TEST(EngineScheduler, TokenBudgetStopsAdmissionWithoutLettingLaterRequestsPass) {
  // 100 fits; 300 would exceed 350, and 50, which would fit, must wait behind it.
  Admission a = schedule_admission(queue({100, 300, 50}), 0, 0, budgets(8, 350, 64));
  EXPECT_EQ(a.admitted, (Idx{0}));
  EXPECT_EQ(a.used_tokens, 100);
  // Exactly at the budget is allowed.
  a = schedule_admission(queue({100, 250}), 0, 0, budgets(8, 350, 64));
  EXPECT_EQ(a.admitted, (Idx{0, 1}));
  EXPECT_EQ(a.used_tokens, 350);
  // Running requests' reservations count.
  a = schedule_admission(queue({100}), 1, 300, budgets(8, 350, 64));
  EXPECT_TRUE(a.admitted.empty());
}

TEST(EngineScheduler, RequestsWaitingForAStoragePrefetchAreSkippedNotBlocking) {
  std::vector<WaitingSummary> w = {{10, false, false}, {10, false, true}, {10, false, true}};
  const Admission a = schedule_admission(w, 0, 0, budgets(8, 0, 64));
  EXPECT_EQ(a.admitted, (std::vector<size_t>{1, 2}));
  EXPECT_TRUE(a.dropped.empty());
}

TEST(EngineScheduler, PrefillChunksEndAtThePrefixCacheCheckpoints) {
  RunningSummary r = prefilling(100, 1000);
  r.checkpoint_at = 128;
  StepPlan plan = schedule_batch({r}, budgets(8, 0, 64));
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].n, 28);  // ends at 128, not at 164
  r.checkpoint_at = 200;           // beyond this chunk: no cut
  plan = schedule_batch({r}, budgets(8, 0, 64));
  EXPECT_EQ(plan.items[0].n, 64);
}

TEST(EngineScheduler, AnIdleEngineAdmitsARequestLargerThanTheTokenBudget) {
  Admission a = schedule_admission(queue({1000, 10}), 0, 0, budgets(8, 500, 64));
  EXPECT_EQ(a.admitted, (Idx{0}));
  EXPECT_EQ(a.used_tokens, 1000);
  // Not when something runs already.
  a = schedule_admission(queue({1000}), 1, 10, budgets(8, 500, 64));
  EXPECT_TRUE(a.admitted.empty());
}

TEST(EngineScheduler, UnlimitedTokenBudget) {
  Admission a = schedule_admission(queue({1 << 20, 1 << 20, 1 << 20}), 0, 0, budgets(8, 0, 64));
  EXPECT_EQ(a.admitted, (Idx{0, 1, 2}));
  EXPECT_EQ(a.used_tokens, 3 << 20);
}

TEST(EngineScheduler, CancelledRequestsLeaveTheQueueAndTakeNoSlot) {
  std::vector<WaitingSummary> w = queue({10, 10, 10, 10, 10, 10});
  w[0].cancelled = w[2].cancelled = w[5].cancelled = true;
  // Two slots: the first two live requests; every cancelled one is dropped,
  // also the one behind the point where admission stopped.
  Admission a = schedule_admission(w, 0, 0, budgets(2, 0, 64));
  EXPECT_EQ(a.admitted, (Idx{1, 3}));
  EXPECT_EQ(a.dropped, (Idx{0, 2, 5}));
  EXPECT_EQ(a.used_tokens, 20);
}

TEST(EngineScheduler, EmptyInputsGiveEmptyPlans) {
  Admission a = schedule_admission({}, 3, 30, budgets(4, 100, 64));
  EXPECT_TRUE(a.admitted.empty() && a.dropped.empty());
  EXPECT_EQ(a.used_tokens, 30);
  StepPlan p = schedule_batch({}, budgets(4, 0, 64));
  EXPECT_TRUE(p.items.empty() && p.sample_cached.empty());
}

TEST(EngineScheduler, PrefillBudgetIsSharedInRunningOrder) {
  // Budget 120: the first prompt takes 100 of its 100 (and samples), the
  // second 20 of its 50, the third nothing this step.
  StepPlan p = schedule_batch({prefilling(0, 100), prefilling(10, 60), prefilling(0, 30)}, budgets(8, 0, 120));
  ASSERT_EQ(p.items.size(), 2u);
  EXPECT_EQ(p.items[0].seq, 0u);
  EXPECT_EQ(p.items[0].start, 0);
  EXPECT_EQ(p.items[0].n, 100);
  EXPECT_TRUE(p.items[0].prefill);
  EXPECT_EQ(p.items[0].logits, LogitRows::Last);
  EXPECT_EQ(p.items[1].seq, 1u);
  EXPECT_EQ(p.items[1].start, 10);
  EXPECT_EQ(p.items[1].n, 20);
  EXPECT_EQ(p.items[1].logits, LogitRows::None);  // the chunk does not end the prompt
}

TEST(EngineScheduler, DecodesAreNotChargedToThePrefillBudget) {
  StepPlan p = schedule_batch({decoding(40), prefilling(0, 64), decoding(7), prefilling(0, 10)}, budgets(8, 0, 64));
  ASSERT_EQ(p.items.size(), 3u);
  EXPECT_EQ(p.items[0].seq, 0u);
  EXPECT_EQ(p.items[0].start, 40);
  EXPECT_EQ(p.items[0].n, 1);
  EXPECT_FALSE(p.items[0].prefill);
  EXPECT_EQ(p.items[0].logits, LogitRows::Last);
  EXPECT_EQ(p.items[1].seq, 1u);
  EXPECT_EQ(p.items[1].n, 64);
  EXPECT_EQ(p.items[2].seq, 2u);
  EXPECT_EQ(p.items[2].n, 1);
}

TEST(EngineScheduler, ALoneLastPromptTokenIsNeitherHeldBackNorCharged) {
  // The budget is spent by the first prompt; the second has one token left
  // and still runs (like a decode); the third, with two left, waits.
  StepPlan p = schedule_batch({prefilling(0, 32), prefilling(31, 32), prefilling(30, 32)}, budgets(8, 0, 32));
  ASSERT_EQ(p.items.size(), 2u);
  EXPECT_EQ(p.items[1].seq, 1u);
  EXPECT_EQ(p.items[1].n, 1);
  EXPECT_TRUE(p.items[1].prefill);
  EXPECT_EQ(p.items[1].logits, LogitRows::Last);
  // The lone token leaves the budget for the next prompt.
  p = schedule_batch({prefilling(31, 32), prefilling(0, 50)}, budgets(8, 0, 32));
  ASSERT_EQ(p.items.size(), 2u);
  EXPECT_EQ(p.items[1].n, 32);
}

TEST(EngineScheduler, MultiTokenDecodeItemsWantEveryRow) {
  StepPlan p = schedule_batch({decoding(100, 3), decoding(50), prefilling(0, 16)}, budgets(8, 0, 16));
  ASSERT_EQ(p.items.size(), 3u);
  EXPECT_EQ(p.items[0].start, 100);
  EXPECT_EQ(p.items[0].n, 4);  // the last sampled token and three drafts
  EXPECT_FALSE(p.items[0].prefill);
  EXPECT_EQ(p.items[0].logits, LogitRows::All);
  EXPECT_EQ(p.items[1].logits, LogitRows::Last);
  EXPECT_EQ(p.items[2].n, 16);  // drafts do not eat into the prefill budget
}

TEST(EngineScheduler, CachedLogitsAreSampledWithoutAForwardPass) {
  RunningSummary hit = prefilling(200, 200);
  hit.cached_logits = true;
  StepPlan p = schedule_batch({hit, prefilling(0, 40)}, budgets(8, 0, 40));
  EXPECT_EQ(p.sample_cached, (Idx{0}));
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.items[0].seq, 1u);
  EXPECT_EQ(p.items[0].n, 40);
}

TEST(EngineScheduler, CancelledQueuedAndFinishedSequencesGetNothing) {
  RunningSummary cancelled_prefill = prefilling(0, 100);
  cancelled_prefill.cancelled = true;
  RunningSummary cancelled_decode = decoding(10);
  cancelled_decode.cancelled = true;
  RunningSummary cancelled_hit = prefilling(20, 20);
  cancelled_hit.cached_logits = cancelled_hit.cancelled = true;
  RunningSummary queued = prefilling(0, 10);
  queued.phase = Phase::Queued;
  RunningSummary finished = decoding(30);
  finished.phase = Phase::Finished;
  StepPlan p = schedule_batch({cancelled_prefill, cancelled_decode, cancelled_hit, queued, finished, prefilling(0, 64)},
                              budgets(8, 0, 64));
  EXPECT_TRUE(p.sample_cached.empty());
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.items[0].seq, 5u);
  EXPECT_EQ(p.items[0].n, 64);  // the cancelled prompt used none of the budget
}

// Steps a handful of prompts to completion: every step stays within the
// prefill budget (lone last tokens aside), chunks are contiguous, and each
// prompt asks for logits exactly once, with its last chunk.
TEST(EngineScheduler, ChunkedPrefillCoversEveryPromptExactlyOnce) {
  const int64_t budget = 37;
  std::vector<RunningSummary> seqs = {prefilling(0, 100), decoding(5), prefilling(0, 38), prefilling(0, 1),
                                      prefilling(0, 74)};
  std::vector<int> sampled(seqs.size(), 0);
  for (int step = 0; step < 100; ++step) {
    StepPlan p = schedule_batch(seqs, budgets(8, 0, budget));
    if (std::none_of(seqs.begin(), seqs.end(), [](auto& s) { return s.phase == Phase::Prefilling; })) break;
    int64_t charged = 0;
    for (const PlanItem& it : p.items) {
      RunningSummary& s = seqs[it.seq];
      EXPECT_EQ(it.start, s.fed);
      if (it.prefill && s.known - s.fed > 1) charged += it.n;
      s.fed += it.n;
      EXPECT_LE(s.fed, s.known);
      if (it.logits == LogitRows::Last) {
        ++sampled[it.seq];
        EXPECT_EQ(s.fed, s.known);  // logits come with the chunk that ends the prompt
        if (s.phase == Phase::Prefilling) s.phase = Phase::Decoding;
        s.known += 1;
      }
    }
    EXPECT_LE(charged, budget);
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(seqs[i].phase, Phase::Decoding) << i;
    EXPECT_EQ(seqs[i].known - seqs[i].fed, 1) << i;
    EXPECT_GE(sampled[i], 1) << i;
  }
}

TEST(EngineScheduler, PhaseNames) {
  EXPECT_STREQ(phase_name(Phase::Queued), "queued");
  EXPECT_STREQ(phase_name(Phase::Prefilling), "prefilling");
  EXPECT_STREQ(phase_name(Phase::Decoding), "decoding");
  EXPECT_STREQ(phase_name(Phase::Finished), "finished");
}

}  // namespace
}  // namespace dsv4
