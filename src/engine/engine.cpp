#include "engine/engine.h"

#include <malloc.h>

#include <algorithm>

#include "core/machine.h"
#include "core/scratch.h"
#include "core/threads.h"

namespace dsv4 {

struct Engine::Sequence {
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> prompt;
  SamplingParams params;
  Phase phase = Phase::Queued;
  SequenceState state;
  int64_t fed = 0;              // tokens of prompt+output already in `state`
  std::vector<int32_t> output;  // generated tokens
  PenaltyState penalties;
  std::vector<int32_t> stop_ids;     // stop_token_ids plus EOS unless ignore_eos
  std::vector<float> cached_logits;  // after the prompt, from a full prefix-cache hit
  // Constrained decoding state (null: unconstrained); only the thread that
  // draws this sequence's token touches it.
  std::unique_ptr<TokenConstraint> constraint;
  int64_t reserved_tokens = 0;

  int64_t known() const { return int64_t(prompt.size() + output.size()); }
  std::vector<int32_t> tokens(int64_t start, int64_t n) const {
    std::vector<int32_t> t;
    t.reserve(size_t(n));
    for (int64_t i = start; i < start + n; ++i)
      t.push_back(i < int64_t(prompt.size()) ? prompt[size_t(i)] : output[size_t(i) - prompt.size()]);
    return t;
  }
  RunningSummary summary() const {
    RunningSummary r;
    r.phase = phase;
    r.fed = fed;
    r.known = known();
    r.cached_logits = !cached_logits.empty();
    r.cancelled = handle->cancelled();
    return r;
  }
};

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions options)
    : model_(std::move(model)), options_(options), executor_(*model_), cache_(options.prefix_cache_bytes) {
  const int64_t model_max = model_->config().max_position_embeddings;
  if (options_.context_length <= 0 || options_.context_length > model_max) options_.context_length = model_max;
  if (options_.chunked_prefill_size <= 0) options_.chunked_prefill_size = options_.context_length;
  budgets_ = {options_.max_running_requests, options_.max_total_tokens, options_.chunked_prefill_size};
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestHandle> Engine::submit(const std::string& id, std::vector<int32_t> prompt,
                                              SamplingParams params) {
  std::vector<Submission> one;
  one.push_back({id, validate_request(limits(), std::move(prompt), std::move(params))});
  return submit_all(std::move(one))[0];
}

std::vector<std::shared_ptr<RequestHandle>> Engine::submit_all(std::vector<Submission> requests) {
  std::vector<std::unique_ptr<Sequence>> sequences;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Submission& r : requests) {
    for (const auto& h : handles)
      if (h->id() == r.id) throw DuplicateIdError(r.id);
    const int64_t n = int64_t(r.request.prompt().size());
    auto handle = std::make_shared<RequestHandle>();
    handle->id_ = r.id;
    handle->prompt_tokens_ = n;
    handle->times_.submitted = now_seconds();
    auto seq = std::make_unique<Sequence>();
    seq->handle = handle;
    seq->prompt = r.request.prompt();
    seq->params = r.request.params();
    seq->reserved_tokens = n + seq->params.max_new_tokens;
    seq->stop_ids = seq->params.stop_token_ids;
    if (seq->params.constraint) seq->constraint = seq->params.constraint->start();
    if (!seq->params.ignore_eos) seq->stop_ids.push_back(int32_t(model_->config().eos_token_id));
    handles.push_back(handle);
    sequences.push_back(std::move(seq));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (int64_t(waiting_.size() + sequences.size()) > options_.max_queued_requests) throw QueueFullError();
    for (const auto& h : handles) {
      auto it = live_.find(h->id());
      if (it != live_.end() && !it->second.expired()) throw DuplicateIdError(h->id());
    }
    for (size_t i = 0; i < sequences.size(); ++i) {
      live_[handles[i]->id()] = handles[i];
      waiting_.push_back(std::move(sequences[i]));
      ++totals_.requests_total;
    }
  }
  cv_.notify_all();
  return handles;
}

bool Engine::abort(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  auto h = it->second.lock();
  if (!h) return false;
  h->cancel();
  cv_.notify_all();
  return true;
}

int64_t Engine::abort_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (auto& [id, weak] : live_)
    if (auto h = weak.lock()) {
      h->cancel();
      ++n;
    }
  cv_.notify_all();
  return n;
}

bool Engine::flush_cache() {
  // A request whose last token was just delivered may still await retirement
  // by the engine thread: give it a moment before calling the engine busy.
  for (int attempt = 0; attempt < 200; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (running_count_ == 0 && waiting_.empty()) {
        cache_.clear();
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics m = totals_;
  m.running = running_count_;
  m.queued = int64_t(waiting_.size());
  m.used_tokens = used_tokens_;
  m.prefix_cache_entries = cache_.entries();
  m.prefix_cache_bytes = cache_.bytes();
  double now = now_seconds(), window = 5.0;
  int64_t tokens = 0;
  for (auto& [t, n] : recent_tokens_)
    if (now - t <= window) tokens += n;
  m.gen_throughput = double(tokens) / window;
  return m;
}

void Engine::finish(Sequence& s, FinishReason reason, const std::string& error) {
  TokenEvent e;
  e.finished = true;
  e.reason = reason;
  e.error = error;
  s.handle->push(std::move(e));
  s.phase = Phase::Finished;
}

void Engine::loop() {
  if (options_.pin_threads) pin_compute_threads();
  std::vector<std::unique_ptr<Sequence>> running;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !running.empty(); });
      if (stop_) break;
      admit(running);
    }
    const double step_start = now_seconds();
    for (auto& s : running)
      if (s->phase == Phase::Queued) start(*s);
    try {
      step(running);
    } catch (const std::exception& e) {
      // A failure of the step fails the requests in it, never the server.
      for (auto& s : running)
        if (s->phase != Phase::Finished) finish(*s, FinishReason::Error, e.what());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    retire(running);
    totals_.step_seconds += now_seconds() - step_start;
    ++totals_.steps_total;
    // Idle again: hand freed sequence memory back to the OS, so a server's
    // footprint returns to its baseline after a burst.
    if (running.empty() && waiting_.empty()) {
      release_thread_scratch();  // the kernels' buffers of this (the model's) thread
      malloc_trim(0);
    }
  }
  for (auto& s : running) finish(*s, FinishReason::Abort, "server shutting down");
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& s : waiting_) finish(*s, FinishReason::Abort, "server shutting down");
}

// Under mutex_: the scheduler's admission applied to the queue.
void Engine::admit(std::vector<std::unique_ptr<Sequence>>& running) {
  std::vector<WaitingSummary> waiting;
  waiting.reserve(waiting_.size());
  for (auto& w : waiting_) waiting.push_back({w->reserved_tokens, w->handle->cancelled()});
  const Admission a = schedule_admission(waiting, int64_t(running.size()), used_tokens_, budgets_);
  for (size_t i : a.dropped) {
    Sequence& s = *waiting_[i];
    finish(s, FinishReason::Abort);
    ++totals_.aborted_total;
    live_.erase(s.handle->id());
    waiting_[i].reset();
  }
  for (size_t i : a.admitted) running.push_back(std::move(waiting_[i]));
  std::erase_if(waiting_, [](const auto& s) { return !s; });
  used_tokens_ = a.used_tokens;
  running_count_ = int64_t(running.size());
}

// A newly admitted sequence starts from the longest cached prefix of its
// prompt, or from an empty state.
void Engine::start(Sequence& s) {
  PrefixCache::Hit hit;
  if (cache_.start(s.prompt, &hit)) {
    s.state = std::move(hit.state);
    s.fed = hit.matched;
    s.cached_logits = std::move(hit.last_logits);
    s.handle->cached_tokens_ = hit.matched;
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.cached_tokens_total += hit.matched;
  } else {
    s.state = model_->new_state();
  }
  s.phase = Phase::Prefilling;
}

// One forward pass over the running sequences, as the scheduler plans it,
// then sampling and events in running order (sequences sampling from cached
// logits last).
void Engine::step(std::vector<std::unique_ptr<Sequence>>& running) {
  const int64_t V = model_->config().vocab_size;
  std::vector<RunningSummary> summaries;
  summaries.reserve(running.size());
  for (auto& s : running) summaries.push_back(s->summary());
  const StepPlan plan = schedule_batch(summaries, budgets_);

  std::vector<ExecItem> exec;
  exec.reserve(plan.items.size());
  for (const PlanItem& item : plan.items) {
    Sequence& s = *running[item.seq];
    exec.push_back({&s.state, s.tokens(item.start, item.n), item.logits});
  }
  const double t_forward = now_seconds();
  const StepLogits logits = executor_.run(exec);
  const double t_sample = now_seconds();

  // Sampling is a pure function of (logits, params, history, step), so the
  // sequences sample in parallel; events are emitted in order afterwards.
  // Items wanting every row carry drafts to verify, which this engine does
  // not propose yet: only last-row items sample.
  auto samples = [&](size_t i) { return plan.items[i].logits == LogitRows::Last; };
  std::vector<SampledToken> drawn(plan.items.size());
  int64_t n_sampled = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) n_sampled += samples(i);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(n_sampled* V * 4))
  for (size_t i = 0; i < plan.items.size(); ++i)
    if (samples(i)) drawn[i] = draw(*running[plan.items[i].seq], logits.last_row(i));
  const double t_emit = now_seconds();
  for (size_t i = 0; i < plan.items.size(); ++i) {
    Sequence& s = *running[plan.items[i].seq];
    s.fed += plan.items[i].n;
    if (s.fed <= int64_t(s.prompt.size())) {
      std::lock_guard<std::mutex> lock(mutex_);
      totals_.prompt_tokens_total += plan.items[i].n;
    }
    if (samples(i)) emit(s, logits.last_row(i), drawn[i]);
  }
  for (size_t k : plan.sample_cached) {
    Sequence& s = *running[k];
    const std::vector<float> row = std::move(s.cached_logits);
    s.cached_logits.clear();
    emit(s, row.data(), draw(s, row.data()));
  }
  const double t_end = now_seconds();
  std::lock_guard<std::mutex> lock(mutex_);
  totals_.forward_seconds += t_sample - t_forward;
  totals_.sample_seconds += t_emit - t_sample;
  totals_.emit_seconds += t_end - t_emit;
}

SampledToken Engine::draw(const Sequence& s, const float* logits) const {
  const int64_t step_index = int64_t(s.output.size());
  std::vector<int32_t> blocked;
  if (step_index < s.params.min_new_tokens) blocked = s.stop_ids;
  const int64_t vocab = model_->config().vocab_size;
  if (s.constraint) {
    TokenMask mask(size_t(vocab + 63) / 64, 0);
    if (s.constraint->fill_mask(mask)) {
      // A complete output may end; an output the grammar cannot continue
      // (never for a well-formed grammar) ends rather than drawing at random.
      bool any = false;
      for (uint64_t word : mask) any = any || word != 0;
      if (s.constraint->can_finish() || !any) {
        for (int32_t t : s.stop_ids) mask_set(mask, t);
        blocked.clear();  // min_new_tokens cannot outrank the grammar
      }
      return sample_token(logits, vocab, s.params, s.penalties, s.prompt, step_index, blocked, nullptr, &mask);
    }
  }
  return sample_token(logits, vocab, s.params, s.penalties, s.prompt, step_index, blocked);
}

// Appends a sampled token, offers the state to the cache policy and pushes the
// token's event (which also ends the request when it is the last).
void Engine::emit(Sequence& s, const float* logits, const SampledToken& t) {
  cache_.on_sampled(s.prompt, s.output, s.fed, s.state, logits, model_->config().vocab_size);
  s.output.push_back(t.token);
  s.penalties.add(t.token);
  if (s.constraint) s.constraint->accept(t.token);  // stop tokens end the sequence; a refusal changes nothing
  s.phase = Phase::Decoding;
  TokenEvent e;
  e.sampled = t;
  e.has_token = true;
  e.is_stop_token = std::find(s.stop_ids.begin(), s.stop_ids.end(), t.token) != s.stop_ids.end();
  // validate_request lowered max_new_tokens to what the context holds after
  // the prompt, so the length limit also stops a sequence at the context's end.
  if (e.is_stop_token)
    e.finished = true, e.reason = FinishReason::Stop;
  else if (int64_t(s.output.size()) >= s.params.max_new_tokens)
    e.finished = true, e.reason = FinishReason::Length;
  const bool finished = e.finished;
  s.handle->push(std::move(e));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++totals_.generation_tokens_total;
    double now = now_seconds();
    recent_tokens_.push_back({now, 1});
    while (!recent_tokens_.empty() && now - recent_tokens_.front().first > 10) recent_tokens_.pop_front();
  }
  if (finished) {
    cache_.on_finished(s.prompt, s.output, s.fed, s.state);
    s.phase = Phase::Finished;
    s.state = SequenceState();  // its memory goes back now rather than at retirement
  }
}

// Under mutex_: cancelled sequences end as aborted; finished ones leave,
// returning their slot and token reservation.
void Engine::retire(std::vector<std::unique_ptr<Sequence>>& running) {
  for (auto it = running.begin(); it != running.end();) {
    Sequence& s = **it;
    if (s.handle->cancelled() && s.phase != Phase::Finished) {
      finish(s, FinishReason::Abort);
      ++totals_.aborted_total;
    }
    if (s.phase != Phase::Finished) {
      ++it;
      continue;
    }
    used_tokens_ -= s.reserved_tokens;
    live_.erase(s.handle->id());
    it = running.erase(it);
  }
  running_count_ = int64_t(running.size());
}

}  // namespace dsv4
