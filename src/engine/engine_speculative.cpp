// The engine's side of speculative decoding: proposing drafts before a step,
// verifying them after it (docs/speculative.md).
#include <algorithm>

#include "engine/engine.h"
#include "engine/sequence.h"

namespace dsv4 {

namespace {

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// The token of a mask that allows exactly one, else -1.
int32_t only_token(const TokenMask& mask) {
  int32_t found = -1;
  for (size_t w = 0; w < mask.size(); ++w) {
    if (mask[w] == 0) continue;
    if (found >= 0 || (mask[w] & (mask[w] - 1)) != 0) return -1;
    found = int32_t(w * 64) + __builtin_ctzll(mask[w]);
  }
  return found;
}

// The highest logit among the tokens a row allows (the lowest id on ties,
// as argmax), or -1 when it allows none.
int32_t masked_argmax(const float* row, const TokenMask& mask) {
  int32_t best = -1;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const int32_t token = int32_t(w * 64) + __builtin_ctzll(bits);
      if (best < 0 || row[token] > row[best]) best = token;
    }
  return best;
}

}  // namespace

bool Engine::Sequence::draw_in_grammar(const float* row, int64_t vocab, int32_t* token) {
  chain_rows.push_back(constraint_row(vocab));
  const ConstrainedRow& allowed = chain_rows.back();
  const int32_t pick = allowed.active ? masked_argmax(row, allowed.mask) : argmax(row, vocab);
  *token = pick < 0 ? argmax(row, vocab) : pick;
  // After a stop token nothing is verified; after a refused one the
  // grammar's state is unknown: the chain ends there.
  return pick >= 0 && !is_stop(pick) && constraint->accept(pick);
}

void Engine::propose_drafts(std::vector<std::unique_ptr<Sequence>>& running, std::vector<RunningSummary>& summaries) {
  const SpeculativeOptions& spec = options_.speculative;
  std::vector<Sequence*> mtp_sequences, constrained;
  std::vector<int64_t> mtp_limits, constrained_limits;
  for (size_t i = 0; i < running.size(); ++i) {
    Sequence& s = *running[i];
    const RunningSummary& r = summaries[i];
    // Only a sequence whose one unfed token is its last sampled one drafts.
    if (r.phase != Phase::Decoding || r.cancelled || r.known - r.fed != 1) continue;
    // Every token of a verify step may be emitted: drafts never run past
    // max_new_tokens (which validate_request fitted into the context).
    int64_t limit =
        std::min<int64_t>(spec.num_draft_tokens - 1, s.params.max_new_tokens - int64_t(s.output.size()) - 1);
    if (spec.algorithm == SpeculativeAlgorithm::Eagle) limit = std::min(limit, spec.num_steps);
    if (s.constraint) limit = std::min(limit, s.constraint->max_rollback());
    if (limit <= 0) continue;
    if (s.constraint) constrained.push_back(&s), constrained_limits.push_back(limit);
    if (spec.algorithm == SpeculativeAlgorithm::Ngram) {
      if (s.history.empty()) s.ngram = NgramIndex(spec.ngram_min_match, spec.ngram_max_match);
      if (s.history.empty()) s.history = s.prompt;
      s.history.insert(s.history.end(), s.output.begin() + (int64_t(s.history.size()) - int64_t(s.prompt.size())),
                       s.output.end());
      s.ngram.extend(s.history);
      s.drafts = s.ngram.propose(s.history, limit);
      // Simulated acceptance measures the cost of a full verify width.
      if (spec.simulate_accept_len > 0) s.drafts.resize(size_t(limit), s.history.back());
      if (!s.drafts.empty()) s.state.checkpoint();
    } else {
      mtp_sequences.push_back(&s);
      mtp_limits.push_back(limit);
    }
  }
  if (!mtp_sequences.empty()) {
    if (spec.algorithm == SpeculativeAlgorithm::Eagle) propose_mtp(mtp_sequences, mtp_limits);
    if (spec.algorithm == SpeculativeAlgorithm::Dspark) propose_dspark(mtp_sequences, mtp_limits);
  }
  // Each sequence walks its own grammar: independent, like sampling.
#pragma omp parallel for schedule(dynamic, 1) if (constrained.size() > 1)
  for (size_t i = 0; i < constrained.size(); ++i) fit_drafts(*constrained[i], constrained_limits[i]);
  for (size_t i = 0; i < running.size(); ++i) summaries[i].draft_tokens = int64_t(running[i]->drafts.size());
}

// EAGLE with the checkpoint's MTP block, a top-1 chain. The block at
// position p reads the main model's final HC state of p and the token at
// p+1 and predicts p+2. First it catches up on the positions the main model
// ran since its last call (exact inputs; the last of them yields the first
// draft); then each further draft feeds the block's own HC output and the
// previous draft at the next position. Those chained positions are undone
// after verification, with the main model's rejected rows.
void Engine::propose_mtp(const std::vector<Sequence*>& sequences, const std::vector<int64_t>& limits) {
  const ModelConfig& c = model_->config();
  const int64_t width = c.hc_mult * c.dim, vocab = c.vocab_size;
  std::vector<Sequence*> active;
  std::vector<int64_t> active_limits;
  std::vector<std::vector<int32_t>> next;
  std::vector<MtpBatchItem> items;
  for (size_t i = 0; i < sequences.size(); ++i) {
    Sequence& s = *sequences[i];
    const int64_t fed = s.fed, have = int64_t(s.hc.size()) / width;
    // The HC state of position fed-1 is needed (absent after a full
    // prefix-cache hit, until one plain step has run).
    if (have == 0 || s.hc_start + have != fed) continue;
    // The block attends a window only, and a position's window row depends
    // on its own inputs alone: positions before fed - window cannot affect
    // the draft, so a long prompt costs the block one window of rows.
    const int64_t first = std::max({s.state.mtp_tokens, s.hc_start, fed - c.window});
    s.state.mtp_tokens = first;
    next.push_back(s.tokens(first + 1, fed - first));
    active.push_back(&s);
    active_limits.push_back(limits[i]);
  }
  if (active.empty()) return;
  std::vector<float> logits(active.size() * size_t(vocab)), last_hc(active.size() * size_t(width));
  for (size_t i = 0; i < active.size(); ++i) {
    Sequence& s = *active[i];
    const int64_t first = s.state.mtp_tokens;
    items.push_back({&s.state, s.hc.data() + (first - s.hc_start) * width, next[i].data(), int64_t(next[i].size()),
                     logits.data() + i * vocab, true, last_hc.data() + i * width});
  }
  model_->forward_mtp_batch(items);
  // A constrained sequence's chain draws inside its grammar, which it walks
  // as it goes (undone below): each draft then continues from a token the
  // grammar allows, where an unmasked chain's first refused draft would end
  // the drafts (fit_drafts). Only the drafts' quality depends on this;
  // verification decides as before.
  std::vector<int64_t> walked(active.size(), 0);
  auto draw = [&](const std::vector<size_t>& which) {
#pragma omp parallel for schedule(dynamic, 1) if (which.size() > 1)
    for (size_t k = 0; k < which.size(); ++k) {
      const size_t i = which[k];
      Sequence& s = *active[i];
      const float* row = logits.data() + i * vocab;
      if (!s.constraint) {
        s.drafts.push_back(argmax(row, vocab));
        continue;
      }
      int32_t token = 0;
      const bool goes_on = s.draw_in_grammar(row, vocab, &token);
      s.drafts.push_back(token);
      if (!goes_on) {
        active_limits[i] = int64_t(s.drafts.size());
        continue;
      }
      ++walked[i];
    }
  };
  std::vector<size_t> in_step(active.size());
  for (size_t i = 0; i < active.size(); ++i) in_step[i] = i, active[i]->drafts.clear(), active[i]->chain_rows.clear();
  draw(in_step);
  int64_t longest = 0;
  for (size_t i = 0; i < active.size(); ++i) {
    Sequence& s = *active[i];
    s.hc.clear();  // consumed: the block has run every position before `fed`
    s.hc_start = s.fed;
    s.state.checkpoint();
    s.mtp_checkpoint = s.state.mtp_tokens;
    longest = std::max(longest, active_limits[i]);
  }
  for (int64_t step = 1; step < longest; ++step) {
    items.clear();
    in_step.clear();
    for (size_t i = 0; i < active.size(); ++i) {
      if (active_limits[i] <= step) continue;
      Sequence& s = *active[i];
      float* hc = last_hc.data() + i * width;
      items.push_back({&s.state, hc, &s.drafts.back(), 1, logits.data() + i * vocab, true, hc});
      in_step.push_back(i);
    }
    if (items.empty()) break;  // every chain ended early
    model_->forward_mtp_batch(items);
    draw(in_step);
  }
  for (size_t i = 0; i < active.size(); ++i)
    if (walked[i] > 0) active[i]->constraint->rollback(walked[i]);
}

// DSpark: one block per sequence after the last position its rings hold,
// which the engine keeps equal to the main model's (extended after every
// forward pass with the committed rows). The block is always the
// configured size (its attention is bidirectional, so a shorter block would
// draft differently); what does not fit before max_new_tokens is dropped.
void Engine::propose_dspark(const std::vector<Sequence*>& sequences, const std::vector<int64_t>& limits) {
  const int64_t block = options_.speculative.dspark_block;
  std::vector<DsparkDraftItem> items;
  std::vector<Sequence*> drafting;
  std::vector<int64_t> keep;
  std::vector<std::vector<int32_t>> ids;
  // First the rings learn the rows committed since the last draft.
  const ModelConfig& c = model_->config();
  const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  std::vector<Model::DsparkExtension> extensions;
  for (Sequence* sequence : sequences) {
    Sequence& s = *sequence;
    const int64_t have = int64_t(s.dspark_rows.size()) / width;
    if (have == 0 || s.dspark_start + have != s.fed) continue;
    const int64_t first = std::max({s.state.dspark_tokens, s.dspark_start, s.fed - c.window});
    if (first < s.fed)
      extensions.push_back({&s.state, s.dspark_rows.data() + (first - s.dspark_start) * width, first, s.fed - first});
  }
  if (!extensions.empty()) model_->dspark_extend_batch(extensions);
  for (Sequence* sequence : sequences) {
    Sequence& s = *sequence;
    if (s.state.dspark_tokens == s.fed) s.dspark_rows.clear(), s.dspark_start = s.fed;
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    Sequence& s = *sequences[i];
    if (s.state.dspark_tokens != s.fed || s.fed == 0) continue;
    drafting.push_back(&s);
    keep.push_back(std::min(block, limits[i]));
  }
  ids.resize(drafting.size(), std::vector<int32_t>(size_t(block + 1)));
  // A constrained sequence's Markov chain draws inside its grammar, as
  // EAGLE's chain does (propose_mtp): each kept draft is the highest logit
  // the grammar allows there, walked through the grammar (undone below), so
  // that the next position's Markov bias follows a token that can be
  // accepted. The block's own pass does not depend on the drafts (its
  // inputs are y and noise tokens), so only the chain changes.
  const int64_t vocab = model_->config().vocab_size;
  std::vector<int64_t> walked(drafting.size(), 0);
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& s = *drafting[i];
    DsparkDraftItem item;
    item.state = &s.state;
    item.first_token = s.output.back();
    item.block = block;
    item.ids = ids[i].data();
    items.push_back(std::move(item));
    s.chain_rows.clear();
    if (!s.constraint) continue;
    items.back().choose = [&, i](int64_t step, const float* row) {
      Sequence& seq = *drafting[i];
      // Past the drafts it keeps (or after its chain ended) the block only
      // needs some token to go on with.
      if (step >= keep[i]) return argmax(row, vocab);
      int32_t token = 0;
      if (seq.draw_in_grammar(row, vocab, &token))
        ++walked[i];
      else
        keep[i] = step + 1;  // the kept drafts end with this one
      return token;
    };
  }
  if (items.empty()) return;
  model_->dspark_draft(items);
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& s = *drafting[i];
    if (walked[i] > 0) s.constraint->rollback(walked[i]);
    s.drafts.assign(ids[i].begin() + 1, ids[i].begin() + 1 + keep[i]);
    s.state.checkpoint();
    s.mtp_checkpoint = -1;
  }
}

// A constrained sequence's drafts walked through its grammar (and undone
// after): a draft the grammar refuses is replaced by the one token it allows
// there if it allows only one, else the draft ends; where the drafter
// proposed fewer than `limit`, tokens the grammar forces extend it (a
// drafter-free jump forward over a schema's fixed keys and punctuation). A
// replaced draft leaves the ones after it, which remain only guesses. Every
// verify row's mask is kept: verification draws row j exactly as plain
// decoding would after drafts 0..j-1.
void Engine::fit_drafts(Sequence& s, int64_t limit) const {
  const int64_t vocab = model_->config().vocab_size;
  const bool had_drafts = !s.drafts.empty();
  std::vector<int32_t> fitted;
  s.draft_rows.clear();
  // The MTP chain's rows hold for as long as the fitted drafts are its own.
  std::vector<ConstrainedRow> known = std::move(s.chain_rows);
  s.chain_rows.clear();
  int64_t advanced = 0;
  while (true) {
    const size_t j = fitted.size();
    s.draft_rows.push_back(j < known.size() ? std::move(known[j]) : s.constraint_row(vocab));
    const ConstrainedRow& row = s.draft_rows.back();
    if (int64_t(j) >= limit) break;
    int32_t token = -1;
    if (j < s.drafts.size() && (!row.active || mask_has(row.mask, s.drafts[j])))
      token = s.drafts[j];
    else if (row.active)
      token = only_token(row.mask);
    if (token < 0) break;
    if (j >= s.drafts.size() || token != s.drafts[j]) known.clear();  // later rows followed another token
    fitted.push_back(token);
    if (s.is_stop(token)) break;  // the output would end: nothing after it is verified
    advanced += s.constraint->accept(token);
  }
  s.constraint->rollback(advanced);
  s.drafts = std::move(fitted);
  if (s.drafts.empty()) {
    s.draft_rows.clear();
    if (had_drafts) {  // the checkpoint (and the MTP block's chained positions) go
      s.state.rollback(s.fed, s.mtp_checkpoint);
      s.state.end_checkpoint();
      s.mtp_checkpoint = -1;
    }
  } else if (!had_drafts) {
    s.state.checkpoint();
  }
}

// Row j of a verified item decides draft j; the first rejected draft is
// replaced by the row's own token, and when every draft is accepted the last
// row adds one more. Each row samples as plain decoding would at that index
// (penalties and min_new_tokens included), so greedy output is unchanged.
Engine::Verification Engine::start_verification(const Sequence& s) const {
  Verification v;
  v.penalties = s.penalties;
  const double simulate = options_.speculative.simulate_accept_len;
  v.forced = simulate > 0 ? simulated_accepts(simulate, s.handle->spec_verify_ct()) : -1;
  return v;
}

void Engine::verify_rows(const Sequence& s, const StepLogits& logits, size_t item, int64_t available,
                         Verification& v) const {
  const int64_t vocab = model_->config().vocab_size;
  const int64_t drafted = int64_t(s.drafts.size());
  for (int64_t j = int64_t(v.tokens.size()); !v.done && j < available && j <= drafted; ++j) {
    const float* row = logits.row(item, j);
    const int64_t step = int64_t(s.output.size()) + j;
    std::vector<int32_t> blocked;
    if (step < s.params.min_new_tokens) blocked = s.stop_ids;
    const TokenMask* allowed = nullptr;  // as draw() would mask this row
    if (s.constraint && s.draft_rows[size_t(j)].active) {
      allowed = &s.draft_rows[size_t(j)].mask;
      if (!s.draft_rows[size_t(j)].keep_blocked) blocked.clear();
    }
    SampledToken token;
    bool ok = false;
    if (j < drafted && v.forced >= 0) {
      ok = j < v.forced;
      token = ok ? forced_token(row, vocab, s.params, s.drafts[size_t(j)])
                 : sample_token(row, vocab, s.params, v.penalties, s.prompt, step, blocked, nullptr, allowed);
    } else if (j < drafted) {
      VerifiedToken verified =
          verify_draft(row, vocab, s.params, v.penalties, s.prompt, step, blocked, s.drafts[size_t(j)], allowed);
      token = std::move(verified.token);
      ok = verified.accepted;
    } else {
      token = sample_token(row, vocab, s.params, v.penalties, s.prompt, step, blocked, nullptr, allowed);
    }
    v.penalties.add(token.token);
    v.accepted += ok;
    const bool stop = s.is_stop(token.token);
    v.tokens.push_back(std::move(token));
    v.done = !ok || stop || int64_t(s.output.size() + v.tokens.size()) >= s.params.max_new_tokens || j == drafted;
  }
}

// The sequence's accept length so far (tokens per verify), else the
// engine's over the current log interval; before any verify every row.
// Rounded: a sequence that accepts more than that pays a second pass of the
// head for its later rows, one that accepts less skipped rows it never
// needed.
int64_t Engine::first_head_rows(const Sequence& s, int64_t rows) const {
  if (!model_->head_from_final_hc()) return rows;
  double expected = 0;
  if (const int64_t verifies = s.handle->spec_verify_ct(); verifies > 0)
    expected = 1.0 + double(s.handle->spec_accepted_tokens()) / double(verifies);
  else if (spec_window_.verifies > 0)
    expected = 1.0 + double(spec_window_.accepted) / double(spec_window_.verifies);
  else
    return rows;
  return first_head_rows_for(expected, rows);
}

// The state goes back to what the emitted tokens need (the last one is
// never fed), the rows the MTP block will need are kept, and the tokens are
// emitted in order.
void Engine::accept(Sequence& s, int64_t start, const std::vector<SampledToken>& tokens, int64_t accepted,
                    const RowBuffer* hc, const RowBuffer* dspark_hidden, const StepLogits& logits, size_t item) {
  const int64_t emitted = int64_t(tokens.size()), drafted = int64_t(s.drafts.size());
  s.state.rollback(start + emitted, s.mtp_checkpoint);
  s.state.end_checkpoint();
  s.fed = start + emitted;
  const ModelConfig& c = model_->config();
  if (hc) keep_rows(s.hc, s.hc_start, c.hc_mult * c.dim, start, hc->data(), emitted);
  if (dspark_hidden)
    keep_rows(s.dspark_rows, s.dspark_start, int64_t(c.dspark_target_layer_ids.size()) * c.dim, start,
              dspark_hidden->data(), emitted);
  s.drafts.clear();
  s.draft_rows.clear();
  s.mtp_checkpoint = -1;
  ++s.handle->spec_verify_ct_;
  s.handle->spec_draft_tokens_ += drafted;
  s.handle->spec_accepted_tokens_ += accepted;
  ++spec_window_.verifies;
  spec_window_.drafted += drafted;
  spec_window_.accepted += accepted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++totals_.spec_verify_total;
    totals_.spec_draft_tokens_total += drafted;
    totals_.spec_accepted_tokens_total += accepted;
    if (int64_t(totals_.spec_position_drafted.size()) < drafted) {
      totals_.spec_position_drafted.resize(size_t(drafted), 0);
      totals_.spec_position_accepted.resize(size_t(drafted), 0);
    }
    for (int64_t j = 0; j < drafted; ++j) ++totals_.spec_position_drafted[size_t(j)];
    for (int64_t j = 0; j < accepted; ++j) ++totals_.spec_position_accepted[size_t(j)];
  }
  for (int64_t j = 0; j < emitted && s.phase != Phase::Finished; ++j) emit(s, logits.row(item, j), tokens[size_t(j)]);
}

void Engine::keep_rows(RowBuffer& buffer, int64_t& start, int64_t width, int64_t first_position, const float* rows,
                       int64_t n) const {
  const int64_t window = model_->config().window;
  if (n <= 0) return;
  if (buffer.empty() || start + int64_t(buffer.size()) / width != first_position) {
    buffer.clear();
    start = first_position;
  }
  // Room for what the trim below keeps (a window and a half) plus a window
  // more, reserved once: growing by doubling copied the rows (8 MB a
  // sequence at V4-Flash's width) into fresh pages on a bypassed step.
  const int64_t needed = int64_t(buffer.size()) / width + n;
  if (needed * width > int64_t(buffer.capacity()))
    buffer.reserve(size_t(std::max(needed, 2 * window + window / 2) * width));
  buffer.insert(buffer.end(), rows, rows + n * width);
  // Trimmed back to the last window only once half a window more has come:
  // trimming at every step moved the whole window (8 MB a sequence at
  // V4-Flash's width) on each bypassed step, a cost plain decoding does not
  // pay. The readers take the last window from the end.
  const int64_t have = int64_t(buffer.size()) / width;
  if (have > window + window / 2) {
    buffer.erase(buffer.begin(), buffer.begin() + (have - window) * width);
    start += have - window;
  }
}

void Engine::log_decode(int64_t batch) {
  if (!options_.log) return;
  const SpecWindow w = spec_window_;
  spec_window_ = {};
  const EngineMetrics m = metrics();
  char line[320];
  if (options_.speculative.algorithm == SpeculativeAlgorithm::None) {
    std::snprintf(line, sizeof line,
                  "Decode batch. #running-req: %lld, #queue-req: %lld, gen throughput (token/s): %.2f",
                  (long long)m.running, (long long)m.queued, m.gen_throughput);
  } else {
    const double length = w.verifies > 0 ? double(w.accepted + w.verifies) / double(w.verifies) : 0;
    const double rate = w.drafted > 0 ? double(w.accepted) / double(w.drafted) : 0;
    const double gain = gate_.gain(batch);
    std::snprintf(line, sizeof line,
                  "Decode batch. #running-req: %lld, #queue-req: %lld, gen throughput (token/s): %.2f, accept len: "
                  "%.2f, accept rate: %.2f, %s speculation gain at batch %lld: %.2f",
                  (long long)m.running, (long long)m.queued, m.gen_throughput, length, rate,
                  speculative_algorithm_name(options_.speculative.algorithm), (long long)batch, gain);
  }
  options_.log(line);
}

}  // namespace dsv4
