#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

const char* speculative_algorithm_name(SpeculativeAlgorithm a) {
  switch (a) {
    case SpeculativeAlgorithm::None: return "none";
    case SpeculativeAlgorithm::Eagle: return "EAGLE";
    case SpeculativeAlgorithm::Ngram: return "NGRAM";
    case SpeculativeAlgorithm::Dspark: return "DSPARK";
  }
  return "";
}

SpeculativeAlgorithm parse_speculative_algorithm(const std::string& name) {
  std::string upper = name;
  for (char& ch : upper) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  if (upper.empty() || upper == "NONE") return SpeculativeAlgorithm::None;
  if (upper == "EAGLE" || upper == "NEXTN" || upper == "MTP") return SpeculativeAlgorithm::Eagle;
  if (upper == "NGRAM") return SpeculativeAlgorithm::Ngram;
  if (upper == "DSPARK") return SpeculativeAlgorithm::Dspark;
  throw Error("--speculative-algorithm " + name +
              ": expected EAGLE (the checkpoint's MTP head; NEXTN and MTP are aliases), NGRAM or DSPARK");
}

// ---- n-gram index ---------------------------------------------------------

uint64_t NgramIndex::key_at(const std::vector<int32_t>& tokens, int64_t end) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = end - min_match_; i < end; ++i) {
    h ^= uint32_t(tokens[size_t(i)]);
    h *= 0x100000001b3ull;
  }
  return h;
}

void NgramIndex::extend(const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size());
  // The n-gram ending at the history's last token is not indexed until a
  // token follows it: an occurrence is only useful with a continuation.
  for (int64_t end = std::max(indexed_, min_match_); end < n; ++end) {
    auto& slots = ends_.try_emplace(key_at(tokens, end)).first->second;
    if (slots[0] == 0) slots.fill(-1);
    std::move_backward(slots.begin(), slots.end() - 1, slots.end());
    slots[0] = end;
  }
  indexed_ = std::max(indexed_, n);
}

std::vector<int32_t> load_token_map(const std::string& path) {
  const std::string where = "--speculative-token-map " + path;
  if (path.ends_with(".pt") || path.ends_with(".pth"))
    throw Error(where +
                ": PyTorch files are not read here; convert the map to JSON with python3 -c \"import torch, json, "
                "sys; json.dump(torch.load(sys.argv[1]).tolist(), open(sys.argv[2], 'w'))\" MAP.pt MAP.json");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(where + ": cannot open the file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<int32_t> ids;
  auto add = [&](long long id) {
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw Error(where + ": token id " + std::to_string(id) + " is not a token id");
    ids.push_back(int32_t(id));
  };
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + ": not valid JSON (" + e.what() + ")");
    }
    for (const auto& v : j) {
      if (!v.is_number_integer()) throw Error(where + ": the JSON array holds " + v.dump() + ", not a token id");
      add(v.get<long long>());
    }
  } else {
    std::istringstream words(text);
    std::string word;
    while (words >> word) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size()) throw Error(where + ": \"" + word + "\" is not a token id");
      add(id);
    }
  }
  if (ids.empty()) throw Error(where + ": no token ids in the file");
  return ids;
}

std::vector<int32_t> NgramIndex::propose(const std::vector<int32_t>& tokens, int64_t max_drafts) const {
  const int64_t n = int64_t(tokens.size());
  if (max_drafts <= 0 || n < min_match_ + 1) return {};
  auto it = ends_.find(key_at(tokens, n));
  if (it == ends_.end()) return {};
  int64_t best_end = -1, best_len = 0;
  for (int64_t end : it->second) {
    if (end <= 0 || end >= n) continue;
    // Length of the common suffix of tokens[..end) and tokens[..n), capped.
    int64_t len = 0;
    while (len < max_match_ && end - len > 0 && tokens[size_t(end - 1 - len)] == tokens[size_t(n - 1 - len)]) ++len;
    if (len < min_match_) continue;                      // a hash collision
    if (len > best_len) best_len = len, best_end = end;  // most recent first: ties keep the latest
  }
  if (best_end < 0) return {};
  const int64_t take = std::min(max_drafts, n - best_end);
  return std::vector<int32_t>(tokens.begin() + best_end, tokens.begin() + best_end + take);
}

// ---- acceptance -------------------------------------------------------------

namespace {

// As sample_token's logprob: the same normalizer.
float raw_logprob(const float* logits, int64_t vocab, int32_t token) {
  return float(double(logits[token]) - log_partition(logits, vocab));
}

}  // namespace

SampledToken forced_token(const float* logits, int64_t vocab, const SamplingParams& params, int32_t token) {
  SampledToken out;
  out.token = token;
  out.logprob = raw_logprob(logits, vocab, token);
  if (params.top_logprobs > 0) {
    // The alternatives are a property of the row, not of the chosen token.
    SamplingParams greedy = params;
    greedy.temperature = 0;
    greedy.logit_bias.clear();
    out.top = sample_token(logits, vocab, greedy, {}, {}, 0, {}).top;
  }
  return out;
}

VerifiedToken verify_draft(const float* logits, int64_t vocab, const SamplingParams& params,
                           const PenaltyState& penalties, const std::vector<int32_t>& prompt, int64_t step,
                           const std::vector<int32_t>& blocked, int32_t draft, const TokenMask* allowed) {
  VerifiedToken out;
  out.token = sample_token(logits, vocab, params, penalties, prompt, step, blocked, nullptr, allowed);
  out.accepted = out.token.token == draft;
  return out;
}

int64_t first_head_rows_for(double accept_length, int64_t rows) {
  return std::clamp<int64_t>(std::llround(accept_length), 1, rows);
}

bool head_skip_pays(int64_t skipped, const SpeculativeOptions& options) {
  return skipped > 0 && skipped >= options.head_rows_skipped_min;
}

int64_t simulated_accepts(double accept_len, int64_t step) {
  // Tokens per step alternate between floor and ceil of accept_len so that
  // after k steps exactly floor(k * accept_len) tokens were produced.
  const double tokens = std::floor(double(step + 1) * accept_len) - std::floor(double(step) * accept_len);
  return std::max<int64_t>(0, int64_t(tokens) - 1);
}

// ---- the gate ---------------------------------------------------------------

size_t SpeculationGate::bucket_of(int64_t batch) {
  size_t b = 0;
  while (b + 1 < std::tuple_size<decltype(buckets_)>::value && (int64_t(1) << b) < batch) ++b;
  return b;
}

bool SpeculationGate::speculate(int64_t batch) {
  if (!enabled_) return true;
  Bucket& b = buckets_[bucket_of(batch)];
  if (b.spec_samples < 3) return true;
  if (b.plain_samples < 3) return false;
  const bool spec_wins = b.spec_rate >= b.plain_rate;
  if (++b.since_probe >= b.probe_interval) {
    b.since_probe = 0;
    return !spec_wins;  // measure the other mode again
  }
  return spec_wins;
}

void SpeculationGate::record(int64_t batch, bool speculative, double seconds, int64_t tokens) {
  if (seconds <= 0 || batch <= 0) return;
  Bucket& b = buckets_[bucket_of(batch)];
  const double rate = double(tokens) / seconds / double(batch);  // per sequence: buckets mix sizes
  constexpr double kWeight = 0.25;
  double& avg = speculative ? b.spec_rate : b.plain_rate;
  int64_t& samples = speculative ? b.spec_samples : b.plain_samples;
  int64_t& last = speculative ? b.spec_at : b.plain_at;
  const int64_t skipped = b.recorded - b.spec_at;  // plain steps since the last speculative one
  const bool stale = ++b.recorded - last > kStaleSteps;
  avg = samples == 0 || stale ? rate : avg + kWeight * (rate - avg);
  last = b.recorded;
  ++samples;
  if (speculative && b.plain_samples >= 3) {
    if (b.spec_rate >= b.plain_rate) {
      b.probe_interval = kFirstProbeInterval;
    } else {
      // A probe that lost waits twice as long for the next one, and at
      // least long enough that what it cost beyond plain decoding (its
      // time less what plain steps take for its tokens; after a bypass it
      // includes the drafter catching up on the window it skipped) is
      // kProbeBudget of the plain steps in between.
      double excess = seconds - double(tokens) / (b.plain_rate * double(batch));
      // After a bypass of fewer steps than the drafter's catch-up horizon,
      // the next probe (further apart) catches up on more: its excess is
      // taken as this one's times horizon / skipped. That also scales the
      // part that does not grow with the span (the verify step and the
      // drafts beyond plain), so it errs towards longer intervals. Only
      // for a real bypass (from kFirstProbeInterval steps): after one or
      // two plain steps the excess is not the catch-up's.
      if (catch_up_steps_ > 0 && skipped >= kFirstProbeInterval && skipped < catch_up_steps_)
        excess *= double(catch_up_steps_) / double(skipped);
      const double plain_step = 1.0 / b.plain_rate;
      const double paid_for = std::ceil(std::max(0.0, excess) / (kProbeBudget * plain_step));
      b.probe_interval = std::max(std::min<int64_t>(b.probe_interval * 2, kDoublingProbeInterval),
                                  int64_t(std::min(paid_for, double(kMaxProbeInterval))));
    }
  }
}

double SpeculationGate::gain(int64_t batch) const {
  const Bucket& b = buckets_[bucket_of(batch)];
  return b.plain_rate > 0 && b.spec_samples > 0 ? b.spec_rate / b.plain_rate : 0;
}

}  // namespace dsv4
