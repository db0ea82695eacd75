// The generation engine: a thread that batches many sequences through the
// model (continuous batching), interleaves chunked prefill with decode,
// samples, and streams tokens to request handles. Callers pass the full token
// prompt; the engine owns the decode states. Each step is planned by the
// scheduler, run by the executor, sampled, offered to the cache policy and
// turned into events (docs/engine.md).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/cache_policy.h"
#include "engine/executor.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/validate.h"
#include "model/model.h"

namespace dsv4 {

// The parts of a scheduler step, in order: drafting (speculative decoding),
// the model's forward pass over the batch (the verify step when drafts ran),
// then sampling and events; Done once the step's sequences are retired and
// its totals counted, with no lock of the engine held.
enum class StepPhase { Draft, Forward, Sample, Done };

struct EngineOptions {
  int64_t max_running_requests = 64;
  int64_t max_queued_requests = 1024;
  int64_t chunked_prefill_size = 2048;            // prefill tokens per step (all requests)
  int64_t context_length = 0;                     // 0 = model maximum
  int64_t max_total_tokens = 0;                   // admission budget over running requests; 0 = unlimited
  int64_t prefix_cache_bytes = int64_t(1) << 30;  // the prefix cache's L1 (device) tier; 0 disables the cache
  HiCacheOptions hicache;                         // its other tiers and policies (device_bytes: the line above)
  bool pin_threads = false;                       // pin the model thread's OpenMP team (pin_compute_threads)
  SpeculativeOptions speculative;                 // none by default (docs/speculative.md)
  // V4.1 bounded replay (--enable-decoder-swa-bounded-replay): prompt chunks
  // run the late layers on the prompt's last window only (Model::replay_layer).
  bool bounded_replay = false;
  // Every `decode_log_interval` decode steps, one line through `log` (SGLang's
  // "Decode batch" line, with the acceptance of speculation); 0 or no log: none.
  int64_t decode_log_interval = 40;
  std::function<void(const std::string&)> log;
  // Profiling: called on the scheduler thread as each step enters a phase
  // (every step, drafting or not). `dsv4 bench --speculative` times each
  // phase's kernel operations with it, and runs two engines' steps in turn
  // (Draft waits for the turn, Done hands it on). It must not touch the
  // engine, except that at Done it may read metrics().
  std::function<void(StepPhase)> on_phase;
};

// The scheduler thread's name; its compute threads inherit it.
inline constexpr char kEngineThreadName[] = "dsv4-engine";

struct EngineMetrics {
  int64_t running = 0, queued = 0, used_tokens = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0, cached_tokens_total = 0;
  int64_t requests_total = 0, aborted_total = 0;
  int64_t prefix_cache_entries = 0, prefix_cache_bytes = 0;  // checkpoints; bytes in L1 + L2
  HiCacheMetrics hicache;
  double gen_throughput = 0;  // tokens/s over the last few seconds
  // Where the scheduler thread's time goes, seconds since start: whole steps
  // (admission, cache starts and retirement included), the model's forward
  // passes, sampling, and emitting events (cache inserts, handles).
  double step_seconds = 0, forward_seconds = 0, sample_seconds = 0, emit_seconds = 0;
  int64_t steps_total = 0;
  // The same for steps that only decoded (no prompt chunk in them): the
  // engine's overhead per decode step without prefill time diluting it.
  double decode_step_seconds = 0, decode_forward_seconds = 0;
  int64_t decode_steps_total = 0;
  // Speculative decoding: verify steps (one per sequence and step that
  // verified drafts), drafted and accepted tokens, the time spent drafting,
  // and steps where the gate chose plain decoding although speculation is on.
  int64_t spec_verify_total = 0, spec_draft_tokens_total = 0, spec_accepted_tokens_total = 0;
  int64_t spec_bypassed_steps_total = 0;
  // The verify steps' LM head: rows it ran on, rows it skipped (after a
  // sequence's first rejected draft), and second passes (some sequence
  // accepted more than its first rows; Engine::first_head_rows).
  int64_t spec_head_rows_total = 0, spec_head_rows_skipped_total = 0, spec_head_second_passes_total = 0;
  double draft_seconds = 0;
  // Per draft position j (0 = first draft): how often a verify step drafted
  // that far, and how often position j was accepted.
  std::vector<int64_t> spec_position_drafted, spec_position_accepted;
  // Over the last decode-log interval: tokens per verify (accepted + 1) and
  // accepted per drafted; 0 before any verify.
  double spec_accept_length = 0, spec_accept_rate = 0;
};

// An id that a running or waiting request already has: two requests with
// one id would make the first unabortable.
class DuplicateIdError : public std::runtime_error {
 public:
  explicit DuplicateIdError(const std::string& id)
      : std::runtime_error("a request with rid '" + id + "' is already running or waiting") {}
};

class QueueFullError : public std::runtime_error {
 public:
  QueueFullError() : std::runtime_error("the server is at capacity: waiting queue is full") {}
};

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws QueueFullError when the waiting queue is full and
  // dsv4::Error for a request that can never run (too long, bad ids; see
  // validate_request).
  std::shared_ptr<RequestHandle> submit(const std::string& id, std::vector<int32_t> prompt, SamplingParams params);
  // Several requests, all or none: each is validated and the queue's room
  // and the ids are checked for all of them before any is queued, so that a
  // refused group (one prompt too long, a full queue, an id in use) leaves
  // nothing running.
  struct Submission {
    std::string id;
    ValidatedRequest request;
  };
  std::vector<std::shared_ptr<RequestHandle>> submit_all(std::vector<Submission> requests);
  bool abort(const std::string& id);
  int64_t abort_all();
  // Empties every tier of the prefix cache. Running requests finish
  // correctly (they hold what they use); true.
  bool flush_cache();
  // Waits for the prefix cache's queued storage writes (tests, benchmarks).
  void drain_cache_storage() { cache_.drain_storage(); }
  EngineMetrics metrics() const;
  const Model& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  int64_t context_length() const { return options_.context_length; }
  // What validate_request checks a request against, for callers that want to
  // check before submitting.
  RequestLimits limits() const { return {model_->config().vocab_size, options_.context_length, false}; }

 private:
  struct Sequence;
  void loop();
  void admit(std::vector<std::unique_ptr<Sequence>>& running);
  bool admissible_locked() const;
  void start(Sequence& s);
  void step(std::vector<std::unique_ptr<Sequence>>& running);
  // Speculative decoding (engine_speculative.cpp): drafts for the decoding
  // sequences (their decode states checkpointed), and the acceptance of a
  // verified item, which rolls the state back to what it accepted.
  void propose_drafts(std::vector<std::unique_ptr<Sequence>>& running, std::vector<RunningSummary>& summaries);
  void propose_mtp(const std::vector<Sequence*>& sequences, const std::vector<int64_t>& limits);
  void propose_dspark(const std::vector<Sequence*>& sequences, const std::vector<int64_t>& limits);
  void fit_drafts(Sequence& s, int64_t limit) const;
  // A verified item's decisions so far: verify_rows continues them as its
  // logits rows arrive, row j deciding draft j, until a draft is rejected,
  // a stop token or the token limit comes, or the last row adds one more.
  struct Verification {
    PenaltyState penalties;
    std::vector<SampledToken> tokens;
    int64_t accepted = 0;
    int64_t forced = -1;  // SGLANG_SIMULATE_ACC_LEN: drafts accepted this step
    bool done = false;
  };
  Verification start_verification(const Sequence& s) const;
  void verify_rows(const Sequence& s, const StepLogits& logits, size_t item, int64_t available, Verification& v) const;
  // How many of a verified item's first rows get logits before any is
  // decided (docs/speculative.md, "The verify step's head"); all of them
  // where the head does not run apart from the forward pass.
  int64_t first_head_rows(const Sequence& s, int64_t rows) const;
  void accept(Sequence& s, int64_t start, const std::vector<SampledToken>& tokens, int64_t accepted,
              const RowBuffer* hc, const RowBuffer* dspark_hidden, const StepLogits& logits, size_t item);
  // Rows of positions first_position.. appended to a per-sequence buffer of
  // positions [start, start + rows) (restarted when not contiguous), which
  // keeps at least the last window of them and at most a window and a half.
  void keep_rows(RowBuffer& buffer, int64_t& start, int64_t width, int64_t first_position, const float* rows,
                 int64_t n) const;
  void log_decode(int64_t batch);
  SampledToken draw(const Sequence& s, const float* logits) const;
  void emit(Sequence& s, const float* logits, const SampledToken& t);
  void retire(std::vector<std::unique_ptr<Sequence>>& running);
  void finish(Sequence& s, FinishReason reason, const std::string& error = "");

  std::shared_ptr<const Model> model_;
  EngineOptions options_;
  SchedulerBudgets budgets_;
  Executor executor_;
  // A step's logits and the rows it keeps for the drafts (one buffer per
  // item), reused from step to step (RowBuffer); engine thread only.
  StepLogits step_logits_;
  std::vector<RowBuffer> step_hc_, step_dspark_;
  RowBuffer head_hc_, head_logits_;  // Executor::head_rows's scratch
  CachePolicy cache_;
  SpeculationGate gate_;
  int64_t decode_steps_ = 0;  // engine thread only
  // The last step: whether it only decoded (no prompt chunk, no cached
  // logits), and its forward time; engine thread only.
  bool last_step_decode_only_ = false;
  double last_step_forward_seconds_ = 0;
  struct SpecWindow {
    int64_t verifies = 0, drafted = 0, accepted = 0;
  } spec_window_;  // since the last decode log line (engine thread only)
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::map<std::string, std::weak_ptr<RequestHandle>> live_;
  int64_t running_count_ = 0, used_tokens_ = 0;
  bool stop_ = false;
  std::thread thread_;
  // Counters (under mutex_).
  EngineMetrics totals_;
  std::deque<std::pair<double, int64_t>> recent_tokens_;
};

}  // namespace dsv4
