#include "engine/engine.h"

#include <malloc.h>

#include <algorithm>

#include "core/error.h"
#include "core/machine.h"
#include "core/scratch.h"
#include "core/threads.h"

namespace dsv4 {

struct Engine::Sequence {
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> prompt;
  SamplingParams params;
  SequenceState state;
  int64_t fed = 0;                 // tokens of prompt+output already in `state`
  std::vector<int32_t> output;     // generated tokens
  PenaltyState penalties;
  std::vector<int32_t> stop_ids;      // stop_token_ids plus EOS unless ignore_eos
  std::vector<float> pending_logits;  // from a full prefix-cache hit
  int64_t reserved_tokens = 0;
};

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions options)
    : model_(std::move(model)), options_(options), cache_(options.prefix_cache_bytes) {
  const int64_t model_max = model_->config().max_position_embeddings;
  if (options_.context_length <= 0 || options_.context_length > model_max) options_.context_length = model_max;
  if (options_.chunked_prefill_size <= 0) options_.chunked_prefill_size = options_.context_length;
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
  params = validate_request(limits(), prompt, std::move(params));
  const int64_t n = int64_t(prompt.size());
  auto handle = std::make_shared<RequestHandle>();
  handle->id_ = id;
  handle->prompt_tokens_ = n;
  handle->times_.submitted = now_seconds();
  auto seq = std::make_unique<Sequence>();
  seq->handle = handle;
  seq->prompt = std::move(prompt);
  seq->params = std::move(params);
  seq->reserved_tokens = n + seq->params.max_new_tokens;
  seq->stop_ids = seq->params.stop_token_ids;
  if (!seq->params.ignore_eos) seq->stop_ids.push_back(int32_t(model_->config().eos_token_id));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (int64_t(waiting_.size()) >= options_.max_queued_requests) throw QueueFullError();
    live_[id] = handle;
    waiting_.push_back(std::move(seq));
    ++totals_.requests_total;
  }
  cv_.notify_all();
  return handle;
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
  // by the scheduler: give it a moment before calling the engine busy.
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
}

void Engine::loop() {
  if (options_.pin_threads) pin_compute_threads();
  std::vector<std::unique_ptr<Sequence>> running;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !running.empty(); });
      if (stop_) break;
      // Cancelled requests leave the queue at once.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->handle->cancelled()) {
          finish(**it, FinishReason::Abort);
          ++totals_.aborted_total;
          live_.erase((*it)->handle->id());
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      // Admission (FCFS) within the running-request and token budgets.
      while (!waiting_.empty() && int64_t(running.size()) < options_.max_running_requests) {
        Sequence& next = *waiting_.front();
        if (options_.max_total_tokens > 0 && !running.empty() &&
            used_tokens_ + next.reserved_tokens > options_.max_total_tokens)
          break;
        used_tokens_ += next.reserved_tokens;
        running.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      running_count_ = int64_t(running.size());
    }
    // New sequences: start from the longest cached prefix.
    for (auto& s : running) {
      if (s->fed > 0 || !s->state.layers.empty()) continue;
      PrefixCache::Hit hit;
      if (cache_.lookup(s->prompt, &hit)) {
        s->state = std::move(hit.state);
        s->fed = hit.matched;
        s->pending_logits = std::move(hit.last_logits);
        s->handle->cached_tokens_ = hit.matched;
        std::lock_guard<std::mutex> lock(mutex_);
        totals_.cached_tokens_total += hit.matched;
      } else {
        s->state = model_->new_state();
      }
    }
    try {
      step(running);
    } catch (const std::exception& e) {
      // A failure of the step fails the requests in it, never the server.
      for (auto& s : running) finish(*s, FinishReason::Error, e.what());
      running.clear();
    }
    // Retire finished or cancelled sequences.
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = running.begin(); it != running.end();) {
      Sequence& s = **it;
      bool done = s.handle->cancelled() || s.state.layers.empty();
      if (!done) {
        ++it;
        continue;
      }
      if (s.handle->cancelled() && !s.state.layers.empty()) {
        finish(s, FinishReason::Abort);
        ++totals_.aborted_total;
      }
      used_tokens_ -= s.reserved_tokens;
      live_.erase(s.handle->id());
      it = running.erase(it);
    }
    running_count_ = int64_t(running.size());
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

// One forward pass over every running sequence: one token for each decoding
// sequence, and prompt chunks within the prefill budget.
void Engine::step(std::vector<std::unique_ptr<Sequence>>& running) {
  const ModelConfig& c = model_->config();
  const int64_t V = c.vocab_size;
  struct Planned {
    Sequence* seq;
    std::vector<int32_t> tokens;
    bool samples;  // the chunk ends the known tokens: sample the next one
  };
  std::vector<Planned> plan;
  std::vector<Sequence*> from_cache;
  int64_t prefill_budget = options_.chunked_prefill_size;
  for (auto& sp : running) {
    Sequence& s = *sp;
    if (s.handle->cancelled()) continue;
    if (!s.pending_logits.empty()) {
      from_cache.push_back(&s);
      continue;
    }
    const int64_t known = int64_t(s.prompt.size() + s.output.size());
    const int64_t todo = known - s.fed;
    if (todo <= 0) continue;
    int64_t take = todo;
    if (todo > 1) {  // a prefill: bounded by the step's prefill budget
      take = std::min(todo, prefill_budget);
      if (take <= 0) continue;
      prefill_budget -= take;
    }
    Planned p{&s, {}, take == todo};
    for (int64_t i = s.fed; i < s.fed + take; ++i)
      p.tokens.push_back(i < int64_t(s.prompt.size()) ? s.prompt[size_t(i)] : s.output[size_t(i) - s.prompt.size()]);
    plan.push_back(std::move(p));
  }
  std::vector<float> logits(plan.size() * size_t(V));
  std::vector<BatchItem> items;
  for (size_t i = 0; i < plan.size(); ++i)
    items.push_back({&plan[i].seq->state, plan[i].tokens.data(), int64_t(plan[i].tokens.size()),
                     plan[i].samples ? logits.data() + int64_t(i) * V : nullptr, nullptr, true});
  if (!items.empty()) model_->forward_batch(items);

  // Sampling is a pure function of (logits, params, history, step), so the
  // sequences sample in parallel; events are emitted in order afterwards.
  auto draw = [&](Sequence& s, const float* row) {
    const int64_t step_index = int64_t(s.output.size());
    std::vector<int32_t> blocked;
    if (step_index < s.params.min_new_tokens) blocked = s.stop_ids;
    return sample_token(row, V, s.params, s.penalties, s.prompt, step_index, blocked);
  };
  auto sample_and_emit = [&](Sequence& s, const float* row, const SampledToken& t) {
    if (s.output.empty() && int64_t(s.prompt.size()) == s.fed) {
      // The prompt is complete: keep its state for later requests.
      cache_.insert(s.prompt, s.state, std::vector<float>(row, row + V));
    }
    s.output.push_back(t.token);
    s.penalties.add(t.token);
    TokenEvent e;
    e.sampled = t;
    e.has_token = true;
    e.is_stop_token = std::find(s.stop_ids.begin(), s.stop_ids.end(), t.token) != s.stop_ids.end();
    // validate_request lowered max_new_tokens to what the context holds after
    // the prompt, so the length limit also stops a sequence at the context's end.
    if (e.is_stop_token) e.finished = true, e.reason = FinishReason::Stop;
    else if (int64_t(s.output.size()) >= s.params.max_new_tokens) e.finished = true, e.reason = FinishReason::Length;
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
      // Keep the conversation's state for a follow-up turn, then free it.
      std::vector<int32_t> fed_tokens(s.prompt);
      fed_tokens.insert(fed_tokens.end(), s.output.begin(), s.output.end() - 1);
      if (int64_t(fed_tokens.size()) == s.fed && s.fed > int64_t(s.prompt.size())) cache_.insert(fed_tokens, s.state);
      s.state = SequenceState();  // marks the sequence done
    }
  };
  std::vector<SampledToken> drawn(plan.size());
  const int64_t n_sampled = std::count_if(plan.begin(), plan.end(), [](const auto& p) { return p.samples; });
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(n_sampled * V * 4))
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].samples) drawn[i] = draw(*plan[i].seq, logits.data() + int64_t(i) * V);
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    s.fed += int64_t(plan[i].tokens.size());
    if (s.fed <= int64_t(s.prompt.size())) {
      std::lock_guard<std::mutex> lock(mutex_);
      totals_.prompt_tokens_total += int64_t(plan[i].tokens.size());
    }
    if (plan[i].samples) sample_and_emit(s, logits.data() + int64_t(i) * V, drawn[i]);
  }
  for (Sequence* s : from_cache) {
    std::vector<float> row = std::move(s->pending_logits);
    s->pending_logits.clear();
    sample_and_emit(*s, row.data(), draw(*s, row.data()));
  }
}

}  // namespace dsv4
