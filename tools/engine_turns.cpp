#include "engine_turns.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/machine.h"
#include "core/threads.h"

namespace dsv4::tools {

namespace {

// Reads the handle's events until it has a token or has finished (`until_first`)
// or until it has finished, counting its tokens; throws on a request that failed.
void pump(RequestHandle& handle, bool until_first, int64_t& tokens, bool& finished) {
  std::vector<TokenEvent> events;
  while (!finished && !(until_first && tokens > 0)) {
    events.clear();
    handle.wait(events, 60.0);
    for (const TokenEvent& e : events) {
      if (e.reason == FinishReason::Error) throw Error("bench request failed: " + e.error);
      tokens += e.has_token;
      finished |= e.finished;
    }
  }
}

// Whose step runs: engine `turn`, unless the other has nothing to run.
class Turns {
 public:
  void begin(int side) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return turn_ == side || !active_[1 - side]; });
    turn_ = side;
  }
  void end(int side) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      turn_ = 1 - side;
    }
    cv_.notify_all();
  }
  void set_active(int side, bool active) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_[side] = active;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int turn_ = 0;
  bool active_[2] = {false, false};
};

// One engine's hook state. Only its scheduler thread writes it while the
// engine runs; the caller reads it after the engine has stopped.
struct Side {
  Engine* engine = nullptr;
  bool pin = false;
  bool in_step = false, counted_step = false;
  double began = 0, held = 0;
  int64_t counted_steps = 0;
  EngineMetrics base, last;  // at the Done of the last step before counting, and of the last counted step
};

}  // namespace

int64_t drain(const std::vector<std::shared_ptr<RequestHandle>>& handles,
              const std::function<void(int64_t tokens)>& at_first) {
  std::vector<int64_t> tokens(handles.size(), 0);
  std::vector<char> finished(handles.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    bool done = false;
    pump(*handles[i], true, tokens[i], done);
    finished[i] = done;
    total += tokens[i];
  }
  if (at_first) at_first(total);
  total = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    bool done = finished[i];
    pump(*handles[i], false, tokens[i], done);
    total += tokens[i];
  }
  return total;
}

TurnRun& TurnRun::operator+=(const TurnRun& other) {
  held_seconds += other.held_seconds;
  forward_seconds += other.forward_seconds;
  draft_seconds += other.draft_seconds;
  steps += other.steps;
  tokens += other.tokens;
  bypassed_steps += other.bypassed_steps;
  return *this;
}

void warm_up_engine(Engine& engine, int64_t batch, int64_t prompt_tokens, int64_t decode, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    SamplingParams warm;
    warm.temperature = 0;
    warm.max_new_tokens = decode + 1;
    warm.ignore_eos = true;
    std::vector<std::shared_ptr<RequestHandle>> running;
    for (int64_t b = 0; b < batch; ++b)
      running.push_back(engine.submit("warm" + std::to_string(round) + "-" + std::to_string(b),
                                      std::vector<int32_t>(size_t(prompt_tokens), int32_t(100 + b)), warm));
    drain(running);
  }
}

std::vector<std::shared_ptr<RequestHandle>> submit_bench_batch(Engine& engine, int64_t vocab_size, int64_t batch,
                                                               int64_t prompt_tokens, int64_t decode) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(1, int32_t(vocab_size) - 1);
  SamplingParams params;
  params.temperature = 0;
  params.max_new_tokens = decode + 1;
  params.ignore_eos = true;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
    for (auto& t : prompt) t = token(rng);
    handles.push_back(engine.submit("bench" + std::to_string(b), prompt, params));
  }
  return handles;
}

std::array<TurnRun, 2> run_in_turns(const std::shared_ptr<const Model>& model, std::array<EngineOptions, 2> options,
                                    int64_t batch, int64_t prompt_tokens, int64_t warm_decode, int64_t decode,
                                    std::array<int, 2> warm_up) {
  Turns turns;
  std::atomic<bool> counting{false};
  std::array<Side, 2> sides;
  for (int i = 0; i < 2; ++i) {
    sides[size_t(i)].pin = options[size_t(i)].pin_threads;
    options[size_t(i)].on_phase = [&turns, &counting, &side = sides[size_t(i)], i](StepPhase phase) {
      if (phase == StepPhase::Draft) {
        turns.begin(i);
        // The team the last turn released, made again before the clock starts.
        if (!side.pin || !pin_compute_threads()) parallel_for(compute_threads(), [](int64_t) {});
        side.counted_step = counting.load();
        side.in_step = true;
        side.began = now_seconds();
      } else if (phase == StepPhase::Done && side.in_step) {
        if (side.counted_step) {
          side.held += now_seconds() - side.began;
          ++side.counted_steps;
        }
        side.in_step = false;
        release_thread_team();
        (side.counted_step ? side.last : side.base) = side.engine->metrics();
        turns.end(i);
      }
    };
  }
  // Each engine's thread is pinned (or not) by its own loop and by the hook.
  std::array<std::unique_ptr<Engine>, 2> engines;
  for (int i = 0; i < 2; ++i) {
    engines[size_t(i)] = std::make_unique<Engine>(model, options[size_t(i)]);
    sides[size_t(i)].engine = engines[size_t(i)].get();
  }
  for (int i = 0; i < 2; ++i)
    warm_up_engine(*engines[size_t(i)], batch, prompt_tokens, warm_decode, warm_up[size_t(i)]);

  const int64_t vocab = model->config().vocab_size;
  std::array<std::vector<std::shared_ptr<RequestHandle>>, 2> handles;
  for (int i = 0; i < 2; ++i) {
    turns.set_active(i, true);
    handles[size_t(i)] = submit_bench_batch(*engines[size_t(i)], vocab, batch, prompt_tokens, decode);
  }
  // Counting starts once every request of both engines has its first token
  // (the prompts' steps are not decode steps).
  std::mutex first_mutex;
  std::condition_variable first_cv;
  int waiting_first = 2;  // engines whose requests do not all have their first token yet
  auto first_done = [&] {
    std::lock_guard<std::mutex> lock(first_mutex);
    if (--waiting_first == 0) first_cv.notify_all();
  };
  std::array<std::exception_ptr, 2> failures;
  std::array<std::thread, 2> pumps;
  for (int i = 0; i < 2; ++i)
    pumps[size_t(i)] = std::thread([&, i] {
      bool counted_down = false;
      try {
        drain(handles[size_t(i)], [&](int64_t) {
          counted_down = true;
          first_done();
        });
      } catch (...) {
        failures[size_t(i)] = std::current_exception();
        engines[size_t(i)]->abort_all();
      }
      if (!counted_down) first_done();
      turns.set_active(i, false);
    });
  {
    std::unique_lock<std::mutex> lock(first_mutex);
    first_cv.wait(lock, [&] { return waiting_first == 0; });
  }
  counting = true;
  for (auto& pump : pumps) pump.join();
  // The last step's Done runs after its events reach the handles: stopping
  // the engines waits for it.
  for (auto& engine : engines) engine.reset();
  for (auto& failure : failures)
    if (failure) std::rethrow_exception(failure);

  std::array<TurnRun, 2> runs;
  for (size_t i = 0; i < 2; ++i) {
    const Side& side = sides[i];
    TurnRun& run = runs[i];
    if (side.counted_steps == 0) continue;
    run.tokens = side.last.generation_tokens_total - side.base.generation_tokens_total;
    run.steps = side.last.decode_steps_total - side.base.decode_steps_total;
    run.bypassed_steps = side.last.spec_bypassed_steps_total - side.base.spec_bypassed_steps_total;
    run.held_seconds = side.held;
    run.forward_seconds = side.last.decode_forward_seconds - side.base.decode_forward_seconds;
    run.draft_seconds = side.last.draft_seconds - side.base.draft_seconds;
  }
  return runs;
}

}  // namespace dsv4::tools
