// Speculative decoding: what proposes drafts, how a verified row accepts or
// rejects its draft, and when speculation is worth doing at all
// (docs/speculative.md).
//
// The engine verifies a sequence's drafts in the same forward pass as the
// rest of the batch: the last sampled token and the drafts are fed together,
// every row's logits come back, and row j decides draft j+1. Our kernels give
// a row the same bits whether it is fed alone or in a chunk, so the logits of
// an accepted position are exactly those plain decoding computes there; the
// rejected tail is undone with the decode state's checkpoint.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/sampler.h"

namespace dsv4 {

enum class SpeculativeAlgorithm { None, Eagle, Ngram, Dspark };
const char* speculative_algorithm_name(SpeculativeAlgorithm a);
// "EAGLE" (also "NEXTN" and "MTP", SGLang's aliases for a bundled MTP head),
// "NGRAM", "DSPARK"; throws dsv4::Error naming the accepted values.
SpeculativeAlgorithm parse_speculative_algorithm(const std::string& name);

// An EAGLE draft vocabulary file (SGLang's --speculative-token-map): a JSON
// array of token ids, or ids separated by white space. SGLang's own maps
// are PyTorch tensors (.pt), which are refused with the one-line conversion
// to JSON. Throws Error naming the file and what is wrong with it.
std::vector<int32_t> load_token_map(const std::string& path);

struct SpeculativeOptions {
  SpeculativeAlgorithm algorithm = SpeculativeAlgorithm::None;
  // Tokens verified per step, counting the last sampled token (SGLang's
  // --speculative-num-draft-tokens): at most this minus one drafts.
  int64_t num_draft_tokens = 4;
  int64_t num_steps = 3;     // EAGLE: MTP steps chained per draft
  int64_t dspark_block = 5;  // DSPARK: positions of a draft block (verify width block + 1)
  // N-gram lookup: the longest suffix of the sequence, between these
  // lengths, that occurred before proposes the tokens that followed it.
  int64_t ngram_min_match = 1, ngram_max_match = 12;
  // SGLANG_SIMULATE_ACC_LEN: > 0 makes verification accept so many tokens
  // per step (drafts forced through, mean exactly this) whatever the model
  // says. Benchmarks only: the output is not the model's.
  double simulate_accept_len = 0;
  // Turns speculation off for batch sizes where it measured slower than
  // plain decoding (SpeculationGate).
  bool auto_bypass = true;
  // The verify step's head runs on each sequence's first rows (about its
  // accept length so far) and on the others only for the sequences that
  // accepted them all, where that skips at least this many rows of the
  // batch; otherwise on every row with the forward pass. A second pass
  // reads the head's weights again (1 GB at V4's vocabulary), which a few
  // rows skipped do not pay for (docs/speculative.md, "The verify step's
  // head"). 0: always (tests); a huge value: never.
  int64_t head_rows_skipped_min = 8;
};

// Prompt-lookup drafting over one sequence's tokens (prompt and output).
// Keeps, for every n-gram of the minimum match length, the last few
// positions where it ended, so a lookup costs a handful of comparisons
// instead of a scan of the history.
class NgramIndex {
 public:
  NgramIndex() = default;
  NgramIndex(int64_t min_match, int64_t max_match) : min_match_(min_match), max_match_(max_match) {}
  // Indexes tokens [indexed, tokens.size()) of the history.
  void extend(const std::vector<int32_t>& tokens);
  // Up to `max_drafts` tokens that followed the most recent, longest earlier
  // occurrence of the history's suffix (nothing when no suffix of at least
  // min_match tokens occurred before).
  std::vector<int32_t> propose(const std::vector<int32_t>& tokens, int64_t max_drafts) const;

 private:
  static constexpr int kCandidates = 8;  // most recent end positions kept per n-gram
  uint64_t key_at(const std::vector<int32_t>& tokens, int64_t end) const;
  int64_t min_match_ = 1, max_match_ = 12;
  int64_t indexed_ = 0;
  // n-gram hash -> end positions (exclusive), most recent first.
  std::unordered_map<uint64_t, std::array<int64_t, kCandidates>> ends_;
};

// How a row of verification logits decides its draft token: the row draws
// its token exactly as plain decoding draws at that index (same seed and
// counter, penalties and blocked tokens), and the draft is accepted when it
// is that token. Our drafts are deterministic (a point mass q at the draft),
// and for such drafts this is the standard speculative rejection rule with
// its randomness coupled to the plain draw: the draft is accepted with
// probability p(draft) = min(1, p/q), and a rejected row yields a token
// distributed as p without the draft, renormalized (the residual
// max(0, p - q)). The coupling makes more than the distribution exact: the
// emitted tokens are the very tokens a run without speculation draws, seeded
// or greedy, whatever the drafts, the batch or the bypass decided.
struct VerifiedToken {
  SampledToken token;
  bool accepted = false;  // token is the draft
};
// `allowed`: the grammar's mask at that row, as sample_token takes it.
VerifiedToken verify_draft(const float* logits, int64_t vocab, const SamplingParams& params,
                           const PenaltyState& penalties, const std::vector<int32_t>& prompt, int64_t step,
                           const std::vector<int32_t>& blocked, int32_t draft, const TokenMask* allowed = nullptr);
// The draft forced through (simulated acceptance), with its raw logprob.
SampledToken forced_token(const float* logits, int64_t vocab, const SamplingParams& params, int32_t token);

// SGLANG_SIMULATE_ACC_LEN: how many drafts step `step` accepts so that the
// mean tokens per step (accepted + 1) is exactly `accept_len`.
int64_t simulated_accepts(double accept_len, int64_t step);

// The verify step's head (SpeculativeOptions::head_rows_skipped_min): how
// many of a verified item's `rows` rows its first pass covers for an
// expected accept length (rounded, at least one), and whether skipping
// `skipped` rows of the batch pays for a possible second pass. The engine
// decides with these, and `dsv4 bench --speculative`'s model counts with
// them.
int64_t first_head_rows_for(double accept_length, int64_t rows);
bool head_skip_pays(int64_t skipped, const SpeculativeOptions& options);

// Decides per batch whether speculation pays: it compares the measured
// tokens per second of speculative and plain steps for batches of about the
// same size (buckets 1, 2, 3-4, 5-8, ...), uses the faster, and now and then
// runs the other to keep both measurements fresh. A bucket where speculation
// lost is probed less and less often (doubling up to 1 in 256 steps, and
// rarer where one probe costs more than 2% of the plain steps between two:
// after a bypass the drafter first catches up on the skipped window), so a
// losing draft costs about 2% of plain decoding. A drafter that catches up
// on what it skipped (`catch_up_steps`: the positions it catches up on at
// most, a window for the MTP block and DSpark's rings) pays a probe's cost
// in proportion to the steps it skipped, up to that horizon, so a probe lost
// after a short bypass predicts the next one's cost from it (scaled to the
// horizon) instead of finding it probe by probe. A mode's average
// older than kStaleSteps of the bucket's steps is replaced by the next
// sample instead of moved a quarter of the way: on a shared machine whose
// speed moves by half within a minute, an average kept from a slow phase
// lost probe after probe against the other mode's fresh one.
class SpeculationGate {
 public:
  explicit SpeculationGate(bool enabled = true, int64_t catch_up_steps = 0)
      : enabled_(enabled), catch_up_steps_(catch_up_steps) {}
  bool speculate(int64_t batch);
  // A step of `batch` decoding sequences took `seconds` and produced `tokens`.
  void record(int64_t batch, bool speculative, double seconds, int64_t tokens);
  // Measured speed of speculative over plain steps for the bucket; 0 unknown.
  double gain(int64_t batch) const;

 private:
  struct Bucket {
    double plain_rate = 0, spec_rate = 0;  // tokens/s, moving averages
    int64_t plain_samples = 0, spec_samples = 0;
    int64_t since_probe = 0, probe_interval = kFirstProbeInterval;
    int64_t recorded = 0, plain_at = 0, spec_at = 0;  // steps recorded; the last of each mode
  };
  static constexpr int64_t kStaleSteps = 8;
  // Steps between probes of a losing mode: 16 at first, doubling per lost
  // probe up to 256, and more (up to 4096) where a probe costs more than
  // kProbeBudget of the plain steps between two probes.
  static constexpr int64_t kFirstProbeInterval = 16, kDoublingProbeInterval = 256, kMaxProbeInterval = 4096;
  static constexpr double kProbeBudget = 0.02;
  static size_t bucket_of(int64_t batch);
  bool enabled_;
  int64_t catch_up_steps_;
  std::array<Bucket, 12> buckets_{};
};

}  // namespace dsv4
