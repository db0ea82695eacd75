#include "engine/engine.h"

#include "core/error.h"

#include <malloc.h>

#include <algorithm>

#include "core/machine.h"
#include "core/scratch.h"
#include "core/threads.h"
#include "engine/sequence.h"

namespace dsv4 {

namespace {
HiCacheOptions cache_options(const EngineOptions& o) {
  HiCacheOptions h = o.hicache;
  h.device_bytes = o.prefix_cache_bytes;
  return h;
}
}  // namespace

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions options)
    : model_(std::move(model)),
      options_(options),
      executor_(*model_),
      cache_(model_, cache_options(options), !options.bounded_replay),
      // The MTP block and DSpark's rings catch up on up to a window of the
      // positions a bypass skipped (propose_mtp, propose_dspark).
      gate_(options.speculative.auto_bypass, options.speculative.algorithm == SpeculativeAlgorithm::Eagle ||
                                                     options.speculative.algorithm == SpeculativeAlgorithm::Dspark
                                                 ? model_->config().window
                                                 : 0) {
  const int64_t model_max = model_->config().max_position_embeddings;
  if (options_.context_length <= 0 || options_.context_length > model_max) options_.context_length = model_max;
  if (options_.chunked_prefill_size <= 0) options_.chunked_prefill_size = options_.context_length;
  budgets_ = {options_.max_running_requests, options_.max_total_tokens, options_.chunked_prefill_size};
  if (options_.bounded_replay && model_->replay_layer() < 0)
    throw Error("--enable-decoder-swa-bounded-replay needs a DeepSeek-V4.1 checkpoint (a ratio-1 KV source whose "
                "compressed rows the late layers share); this model has none");
  // From here the engine's thread runs the model: the team of workers the
  // constructing thread used (loading the model, measuring) would only
  // count against the engine's and cut how long its workers spin.
  release_thread_team();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Storage jobs (prefetches) wake the engine's thread when done: none may
  // run once it is gone.
  cache_.drain_storage();
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
      // The prefix cache reads what storage holds of the prompt meanwhile.
      sequences[i]->prefetch = cache_.prefetch(sequences[i]->prompt, [this] { cv_.notify_all(); });
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
  cache_.flush();
  return true;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics m = totals_;
  m.running = running_count_;
  m.queued = int64_t(waiting_.size());
  m.used_tokens = used_tokens_;
  m.hicache = cache_.metrics();
  m.prefix_cache_entries = m.hicache.checkpoints;
  m.prefix_cache_bytes = m.hicache.device_bytes + m.hicache.host_bytes;
  double now = now_seconds(), window = 5.0;
  int64_t tokens = 0;
  for (auto& [t, n] : recent_tokens_)
    if (now - t <= window) tokens += n;
  m.gen_throughput = double(tokens) / window;
  if (m.spec_verify_total > 0) {
    m.spec_accept_length = double(m.spec_accepted_tokens_total + m.spec_verify_total) / double(m.spec_verify_total);
    m.spec_accept_rate =
        m.spec_draft_tokens_total > 0 ? double(m.spec_accepted_tokens_total) / double(m.spec_draft_tokens_total) : 0.0;
  }
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
  // The compute threads this thread's OpenMP regions create inherit the
  // name: /metrics tells the model's CPU from the server's by it.
  name_this_thread(kEngineThreadName);
  if (options_.pin_threads) pin_compute_threads();
  std::vector<std::unique_ptr<Sequence>> running;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Requests waiting for a storage prefetch are woken by it; the period
      // bounds a missed wake-up and serves the timeout policy's deadlines.
      while (!stop_ && running.empty() && !admissible_locked()) cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (stop_) break;
      admit(running);
    }
    const double step_start = now_seconds();
    last_step_decode_only_ = false;
    for (auto& s : running)
      if (s->phase == Phase::Queued) start(*s);
    try {
      step(running);
    } catch (const std::exception& e) {
      // A failure of the step fails the requests in it, never the server.
      for (auto& s : running)
        if (s->phase != Phase::Finished) finish(*s, FinishReason::Error, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      retire(running);
      const double step_seconds = now_seconds() - step_start;
      totals_.step_seconds += step_seconds;
      ++totals_.steps_total;
      if (last_step_decode_only_) {
        totals_.decode_step_seconds += step_seconds;
        totals_.decode_forward_seconds += last_step_forward_seconds_;
        ++totals_.decode_steps_total;
      }
      // Idle again: hand freed sequence memory back to the OS, so a server's
      // footprint returns to its baseline after a burst.
      if (running.empty() && waiting_.empty()) {
        release_thread_scratch();  // the kernels' buffers of this (the model's) thread
        // The step's reused logits and draft rows (RowBuffer) too: 33 MB at
        // batch 16 with 4-token verifies.
        step_logits_ = StepLogits{};
        std::vector<RowBuffer>().swap(step_hc_);
        std::vector<RowBuffer>().swap(step_dspark_);
        RowBuffer().swap(head_hc_);
        RowBuffer().swap(head_logits_);
        malloc_trim(0);
      }
    }
    if (options_.on_phase) options_.on_phase(StepPhase::Done);
  }
  for (auto& s : running) finish(*s, FinishReason::Abort, "server shutting down");
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& s : waiting_) finish(*s, FinishReason::Abort, "server shutting down");
}

// Under mutex_: the scheduler's admission applied to the queue.
void Engine::admit(std::vector<std::unique_ptr<Sequence>>& running) {
  std::vector<WaitingSummary> waiting;
  waiting.reserve(waiting_.size());
  const double now = now_seconds();
  for (auto& w : waiting_)
    waiting.push_back({w->reserved_tokens, w->handle->cancelled(), cache_.ready(w->prefetch.get(), now)});
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

// Under mutex_: a waiting request can be admitted or dropped now.
bool Engine::admissible_locked() const {
  const double now = now_seconds();
  for (auto& w : waiting_)
    if (w->handle->cancelled() || cache_.ready(w->prefetch.get(), now)) return true;
  return false;
}

// A newly admitted sequence starts from the deepest cached checkpoint in its
// prompt, or from an empty state.
void Engine::start(Sequence& s) {
  CacheHit hit;
  if (cache_.start(s.prompt, &hit)) {
    s.state = std::move(hit.state);
    s.fed = hit.matched;
    s.cached_logits = std::move(hit.last_logits);
    s.cache_lease = std::move(hit.lease);
    s.handle->cached_tokens_ = hit.matched;
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.cached_tokens_total += hit.matched;
  } else {
    s.state = model_->new_state();
  }
  s.prefetch.reset();  // what it read is locked by the lease now, or not needed
  s.phase = Phase::Prefilling;
}

// One forward pass over the running sequences, as the scheduler plans it,
// then sampling and events in running order (sequences sampling from cached
// logits last).
void Engine::step(std::vector<std::unique_ptr<Sequence>>& running) {
  const int64_t V = model_->config().vocab_size;
  const SpeculativeOptions& spec = options_.speculative;
  std::vector<RunningSummary> summaries;
  summaries.reserve(running.size());
  int64_t decoding = 0;
  for (auto& s : running) {
    summaries.push_back(s->summary());
    if (s->phase == Phase::Prefilling)
      summaries.back().checkpoint_at = cache_.next_checkpoint(s->fed, int64_t(s->prompt.size()));
    decoding += summaries.back().phase == Phase::Decoding && !summaries.back().cancelled;
  }
  // Drafts first: the scheduler widens a decoding item by its drafts.
  if (options_.on_phase) options_.on_phase(StepPhase::Draft);
  const double t_draft = now_seconds();
  bool speculating = false;
  if (spec.algorithm != SpeculativeAlgorithm::None && decoding > 0) {
    speculating = gate_.speculate(decoding);
    if (speculating) {
      propose_drafts(running, summaries);
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      ++totals_.spec_bypassed_steps_total;
    }
  }
  const StepPlan plan = schedule_batch(summaries, budgets_);

  // EAGLE keeps the main model's final HC rows that the MTP block will read:
  // a window's worth of every item, all rows of a verified one.
  const bool keep_hc_rows = spec.algorithm == SpeculativeAlgorithm::Eagle;
  // DSPARK feeds the target layers' states of every committed row to the
  // head's rings (a window's worth of a long chunk suffices).
  const bool keep_dspark = spec.algorithm == SpeculativeAlgorithm::Dspark;
  std::vector<RowBuffer>& hc = step_hc_;
  std::vector<RowBuffer>& dspark = step_dspark_;
  for (auto* buffers : {&hc, &dspark}) {
    if (buffers->size() < plan.items.size()) buffers->resize(plan.items.size());
    for (RowBuffer& b : *buffers) b.clear();
  }
  // A verified item's head may run on its first rows only, and later on the
  // rest for the sequences that accepted those (first_head_rows): where that
  // skips enough rows of the batch, the forward pass leaves all of a
  // verified item's logits to Executor::head_rows.
  std::vector<int64_t> head_first(plan.items.size(), 0);
  bool defer_head = false;
  if (spec.algorithm != SpeculativeAlgorithm::None && model_->head_from_final_hc()) {
    int64_t skipped = 0;
    for (size_t i = 0; i < plan.items.size(); ++i)
      if (plan.items[i].logits == LogitRows::All) {
        head_first[i] = first_head_rows(*running[plan.items[i].seq], plan.items[i].n);
        skipped += plan.items[i].n - head_first[i];
      }
    defer_head = head_skip_pays(skipped, spec);
  }
  std::vector<ExecItem> exec;
  exec.reserve(plan.items.size());
  bool has_prefill = false;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const PlanItem& item = plan.items[i];
    Sequence& s = *running[item.seq];
    const int64_t drafted = item.prefill ? 0 : int64_t(s.drafts.size());
    std::vector<int32_t> tokens = s.tokens(item.start, item.n - drafted);
    if (drafted > 0) tokens.insert(tokens.end(), s.drafts.begin(), s.drafts.end());
    exec.push_back({&s.state, std::move(tokens), item.logits});
    // Bounded replay: a prompt chunk runs the late layers on the prompt's
    // last window only.
    if (options_.bounded_replay && item.prefill)
      exec.back().replay_from = int64_t(s.prompt.size()) - model_->config().window;
    if (keep_hc_rows) {
      exec.back().final_hc = &hc[i];
      exec.back().final_hc_rows = drafted > 0 ? item.n : std::min(item.n, model_->config().window);
    }
    if (defer_head && item.logits == LogitRows::All) {
      exec.back().defer_head = true;
      exec.back().final_hc = &hc[i];
      exec.back().final_hc_rows = item.n;
    }
    if (keep_dspark) {
      exec.back().dspark_hidden = &dspark[i];
      exec.back().dspark_rows = drafted > 0 ? item.n : std::min(item.n, model_->config().window);
    }
    has_prefill |= item.prefill;
  }
  if (options_.on_phase) options_.on_phase(StepPhase::Forward);
  const double t_forward = now_seconds();
  executor_.run(exec, step_logits_);
  const int64_t hc_width = model_->config().hc_mult * model_->config().dim;
  // The verified items' logits rows [from, to(i)) from their final HC rows,
  // all in one product.
  auto run_head = [&](auto&& from, auto&& to) {
    std::vector<HeadRow> rows;
    for (size_t i = 0; i < plan.items.size(); ++i)
      if (exec[i].defer_head)
        for (int64_t j = from(i); j < to(i); ++j) rows.push_back({i, j, hc[i].data() + j * hc_width});
    executor_.head_rows(rows, head_hc_, head_logits_, step_logits_);
  };
  if (defer_head) run_head([](size_t) { return int64_t(0); }, [&](size_t i) { return head_first[i]; });
  const StepLogits& logits = step_logits_;
  const double t_sample = now_seconds();
  if (options_.on_phase) options_.on_phase(StepPhase::Sample);

  // Sampling is a pure function of (logits, params, history, step), so the
  // sequences sample in parallel; events are emitted in order afterwards.
  // Items wanting every row verify drafts.
  std::vector<SampledToken> drawn(plan.items.size());
  std::vector<Verification> verified(plan.items.size());
  int64_t n_sampled = 0;
  for (const PlanItem& item : plan.items) n_sampled += item.logits != LogitRows::None;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(n_sampled* V * 4))
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const Sequence& s = *running[plan.items[i].seq];
    if (plan.items[i].logits == LogitRows::Last) drawn[i] = draw(s, logits.last_row(i));
    if (plan.items[i].logits == LogitRows::All) {
      verified[i] = start_verification(s);
      verify_rows(s, logits, i, exec[i].defer_head ? head_first[i] : plan.items[i].n, verified[i]);
    }
  }
  // The rest of the rows, for the sequences that accepted every draft of
  // their first rows: a second pass of the head, counted as forward time.
  double late_head_seconds = 0;
  if (defer_head) {
    std::vector<size_t> open;
    for (size_t i = 0; i < plan.items.size(); ++i)
      if (exec[i].defer_head && !verified[i].done) open.push_back(i);
    if (!open.empty()) {
      if (options_.on_phase) options_.on_phase(StepPhase::Forward);
      const double t0 = now_seconds();
      run_head([&](size_t i) { return head_first[i]; },
               [&](size_t i) { return verified[i].done ? head_first[i] : plan.items[i].n; });
      late_head_seconds = now_seconds() - t0;
      if (options_.on_phase) options_.on_phase(StepPhase::Sample);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(int64_t(open.size()) * V * 4))
      for (size_t k = 0; k < open.size(); ++k) {
        const size_t i = open[k];
        verify_rows(*running[plan.items[i].seq], logits, i, plan.items[i].n, verified[i]);
      }
    }
  }
  const double t_emit = now_seconds();
  if (speculating) {
    int64_t head_rows = 0, rows = 0;
    for (size_t i = 0; i < plan.items.size(); ++i)
      if (plan.items[i].logits == LogitRows::All) {
        rows += plan.items[i].n;
        head_rows += !exec[i].defer_head                                 ? plan.items[i].n
                     : verified[i].tokens.size() > size_t(head_first[i]) ? plan.items[i].n
                                                                         : head_first[i];
      }
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.spec_head_rows_total += head_rows;
    totals_.spec_head_rows_skipped_total += rows - head_rows;
    totals_.spec_head_second_passes_total += late_head_seconds > 0;
  }
  int64_t emitted = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const PlanItem& item = plan.items[i];
    Sequence& s = *running[item.seq];
    if (item.logits == LogitRows::All) {
      emitted += int64_t(verified[i].tokens.size());
      accept(s, item.start, verified[i].tokens, verified[i].accepted, keep_hc_rows ? &hc[i] : nullptr,
             keep_dspark ? &dspark[i] : nullptr, logits, i);
      continue;
    }
    s.fed += item.n;
    if (item.prefill) cache_.on_prefilled(s.prompt, s.fed, s.state);
    const ModelConfig& c = model_->config();
    if (keep_hc_rows) {
      const int64_t width = c.hc_mult * c.dim, rows = int64_t(hc[i].size()) / width;
      keep_rows(s.hc, s.hc_start, width, item.start + item.n - rows, hc[i].data(), rows);
    }
    if (keep_dspark) {
      const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
      const int64_t rows = int64_t(dspark[i].size()) / width;
      keep_rows(s.dspark_rows, s.dspark_start, width, item.start + item.n - rows, dspark[i].data(), rows);
    }
    if (s.fed <= int64_t(s.prompt.size())) {
      std::lock_guard<std::mutex> lock(mutex_);
      totals_.prompt_tokens_total += item.n;
    }
    if (item.logits == LogitRows::Last) {
      emit(s, logits.last_row(i), drawn[i]);
      ++emitted;
    }
  }
  for (size_t k : plan.sample_cached) {
    Sequence& s = *running[k];
    const std::vector<float> row = std::move(s.cached_logits);
    s.cached_logits.clear();
    emit(s, row.data(), draw(s, row.data()));
  }
  const double t_end = now_seconds();
  // The gate compares pure decode steps only: a prefill chunk in the step
  // would charge its time to whichever mode ran.
  if (spec.algorithm != SpeculativeAlgorithm::None && decoding > 0 && !has_prefill && plan.sample_cached.empty())
    gate_.record(decoding, speculating, t_end - t_draft, emitted);
  if (decoding > 0 && options_.decode_log_interval > 0 && ++decode_steps_ % options_.decode_log_interval == 0)
    log_decode(decoding);
  last_step_decode_only_ = decoding > 0 && !has_prefill && plan.sample_cached.empty();
  last_step_forward_seconds_ = t_sample - t_forward + late_head_seconds;
  std::lock_guard<std::mutex> lock(mutex_);
  totals_.draft_seconds += t_forward - t_draft;
  totals_.forward_seconds += t_sample - t_forward + late_head_seconds;
  totals_.sample_seconds += t_emit - t_sample - late_head_seconds;
  totals_.emit_seconds += t_end - t_emit;
}

SampledToken Engine::draw(const Sequence& s, const float* logits) const {
  const int64_t step_index = int64_t(s.output.size());
  std::vector<int32_t> blocked;
  if (step_index < s.params.min_new_tokens) blocked = s.stop_ids;
  const int64_t vocab = model_->config().vocab_size;
  if (s.constraint) {
    const ConstrainedRow row = s.constraint_row(vocab);
    if (row.active) {
      if (!row.keep_blocked) blocked.clear();
      return sample_token(logits, vocab, s.params, s.penalties, s.prompt, step_index, blocked, nullptr, &row.mask);
    }
  }
  return sample_token(logits, vocab, s.params, s.penalties, s.prompt, step_index, blocked);
}

// Appends a sampled token, offers the state to the cache policy and pushes the
// token's event (which also ends the request when it is the last).
void Engine::emit(Sequence& s, const float* logits, const SampledToken& t) {
  cache_.on_sampled(s.prompt, s.output, s.fed, s.state, logits);
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
  // The cache and the counters take the token before its event is pushed: a
  // client that has its answer and then asks /flush_cache, /get_server_info
  // or /metrics sees them with it (the finished sequence cached, its tokens
  // counted), not a moment later.
  if (finished) cache_.on_finished(s.prompt, s.output, s.fed, s.state);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++totals_.generation_tokens_total;
    double now = now_seconds();
    recent_tokens_.push_back({now, 1});
    while (!recent_tokens_.empty() && now - recent_tokens_.front().first > 10) recent_tokens_.pop_front();
  }
  s.handle->push(std::move(e));
  if (finished) {
    s.phase = Phase::Finished;
    s.state = SequenceState();  // its memory goes back now rather than at retirement
    s.cache_lease.reset();
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
