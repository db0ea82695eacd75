// `dsv4 bench --speculative`: plain against speculative decoding through the
// engine (drafts, one verify forward, sampling, rollback), with simulated
// acceptance (SGLANG_SIMULATE_ACC_LEN) since random weights accept almost
// nothing, each beside what the bytes and weight decoding of its draft and
// verify steps allow on this machine; then the same model for the 43-layer
// V4-Flash schedule at the measured bandwidth.
#include "bench_speculative.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "bench_costs.h"
#include "bench_products.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "engine_turns.h"
#include "kernels/timed_backend.h"

namespace dsv4::tools {

namespace {

struct EngineRun {
  double tokens_per_second = 0;
  double forward_ms_per_step = 0, draft_ms_per_step = 0;
  double accept_length = 0;
  int64_t steps = 0;
  // The machine's limits read just before the run's engine starts and just
  // after the run, the better of the two for each (bracketed_run).
  MachineLimits around;
};

// `batch` requests of `prompt_tokens` tokens each; the clock runs from the
// step after their first tokens (one prefill step) to the last token. `warm_up`
// batches run first on the same engine, unmeasured (warm_up_engine); plain
// and forced runs take one too, so that no run pays a fresh engine's first
// steps (its thread's first scratch buffers and team) that the others do not.
EngineRun engine_run(const std::shared_ptr<const Model>& model, const EngineOptions& options, int64_t batch,
                     int64_t prompt_tokens, int64_t decode, int warm_up = 0,
                     const std::function<void()>& at_start = {}) {
  Engine engine(model, options);
  warm_up_engine(engine, batch, prompt_tokens, decode, warm_up);
  const std::vector<std::shared_ptr<RequestHandle>> handles =
      submit_bench_batch(engine, model->config().vocab_size, batch, prompt_tokens, decode);
  EngineMetrics before;
  double t0 = 0;
  int64_t first = 0;
  const int64_t total = drain(handles, [&](int64_t tokens) {
    if (at_start) at_start();
    before = engine.metrics();
    t0 = now_seconds();
    first = tokens;
  });
  const double seconds = now_seconds() - t0;
  // A step's events reach the handles before the engine adds the step to
  // its totals: wait for the last step's (the engine is idle after it).
  EngineMetrics after = engine.metrics();
  for (double settled = now_seconds(), give_up = settled + 2.0; now_seconds() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const EngineMetrics again = engine.metrics();
    if (again.steps_total != after.steps_total) settled = now_seconds();
    after = again;
    if (now_seconds() - settled > 0.02) break;
  }
  EngineRun run;
  run.tokens_per_second = double(total - first) / seconds;
  // Decode steps only: the prompts' step may or may not be in `before` (its
  // totals land just after its first tokens), and it drafts nothing.
  run.steps = after.decode_steps_total - before.decode_steps_total;
  if (run.steps > 0) {
    run.forward_ms_per_step = 1e3 * (after.decode_forward_seconds - before.decode_forward_seconds) / double(run.steps);
    run.draft_ms_per_step = 1e3 * (after.draft_seconds - before.draft_seconds) / double(run.steps);
  }
  const int64_t verifies = after.spec_verify_total - before.spec_verify_total;
  if (verifies > 0)
    run.accept_length =
        double(after.spec_accepted_tokens_total - before.spec_accepted_tokens_total + verifies) / double(verifies);
  return run;
}

// Where a speculative step's time goes: the engine's phase hook switches the
// model's kernels to one TimedBackend while it drafts and to another for the
// forward pass (the verify step), once `recording` is set. Only the
// scheduler thread calls the hook and the kernels, and the accounts are read
// after the engine has stopped.
struct PhaseTimers {
  explicit PhaseTimers(Model& m) : model(m), inner(m.backend()), draft(inner), verify(inner) {}
  Model& model;
  const KernelBackend& inner;
  TimedBackend draft, verify;
  std::atomic<bool> recording{false};
  int64_t steps = 0;
  double draft_seconds = 0, verify_seconds = 0;
  double entered = 0;
  StepPhase phase = StepPhase::Sample;

  void enter(StepPhase next) {
    const double t = now_seconds();
    if (steps > 0 && phase == StepPhase::Draft) draft_seconds += t - entered;
    if (steps > 0 && phase == StepPhase::Forward) verify_seconds += t - entered;
    if (next == StepPhase::Draft && recording.load()) ++steps;
    const bool timing = steps > 0 && (next == StepPhase::Draft || next == StepPhase::Forward);
    model.set_backend(!timing ? inner : next == StepPhase::Draft ? static_cast<const KernelBackend&>(draft) : verify);
    phase = next;
    entered = t;
  }
};

// One phase's time per step: the kernel operations by account, the model
// and engine code between them, then the weight products by kind, each
// against its own floor at `limits` (the model's: the best read in the run).
void print_phase(const TimedBackend& timed, const char* name, double seconds, int64_t steps, int64_t batch,
                 const std::string& csv_phase, std::ostream* csv, const MachineLimits& limits) {
  const double per_step = seconds / double(steps);
  std::printf("    %s, per step: %.1f ms; kernels:", name, 1e3 * per_step);
  const char* separator = " ";
  for (int i = 0; i < kOpAccounts; ++i) {
    const TimedBackend::Account& acc = timed.account(OpAccount(i));
    if (acc.calls == 0) continue;
    std::printf("%s%s %.2f ms", separator, op_account_name(OpAccount(i)), 1e3 * acc.seconds / double(steps));
    separator = ", ";
  }
  std::printf("; outside the kernels %.2f ms\n", 1e3 * (seconds - timed.total_seconds()) / double(steps));
  std::printf("  ");  // print_products' line, indented under this one
  print_products(timed, csv_phase.c_str(), batch, batch * steps, double(steps), "per step", csv, &limits);
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  return values.size() % 2 ? values[half] : 0.5 * (values[half - 1] + values[half]);
}

// The limits again, quicker than the calibration (1 GB read once), around
// a run, on a team placed as the calibration's was. The team is placed
// again first: an engine's constructor releases this thread's workers, and
// new ones inherit this thread's own placement (one CPU when the bench
// pinned its team), which halved the FMA chains and the bandwidth of every
// run after the first.
MachineLimits measure_limits_now() {
  pin_compute_threads();
  return read_machine_limits(1);
}

// engine_run with the limits read just before its engine starts and just
// after the run (EngineRun::around, read_limits_around), as `dsv4 bench`'s
// decode lines set each batch against the limits read around its run; both
// reads also raise `best`, the run-wide best that the model uses.
EngineRun bracketed_run(MachineLimits& best, const std::shared_ptr<const Model>& model, const EngineOptions& options,
                        int64_t batch, int64_t prompt_tokens, int64_t decode, int warm_up) {
  EngineRun run;
  const MachineLimits around = read_limits_around(
      best, measure_limits_now, [&] { run = engine_run(model, options, batch, prompt_tokens, decode, warm_up); });
  run.around = around;
  return run;
}

}  // namespace

void run_speculative_bench(const std::shared_ptr<Model>& model, const SpeculativeBenchArgs& a,
                           const MachineLimits& limits, std::ostream* csv) {
  const ModelConfig& c = model->config();
  const Model::TokenCost cost = model->token_cost();
  SpeculativeOptions spec;
  spec.algorithm = parse_speculative_algorithm(a.algorithm);
  if (spec.algorithm == SpeculativeAlgorithm::None) throw Error("--speculative: EAGLE, DSPARK or NGRAM");
  if (spec.algorithm == SpeculativeAlgorithm::Eagle && !model->has_mtp())
    throw Error("--speculative EAGLE: the model has no MTP block (make-model writes one)");
  if (spec.algorithm == SpeculativeAlgorithm::Dspark && !model->has_dspark())
    throw Error("--speculative DSPARK: the model has no DSpark head (make-model --preset flash-0731 writes one)");
  const bool eagle = spec.algorithm == SpeculativeAlgorithm::Eagle;
  const bool dspark = spec.algorithm == SpeculativeAlgorithm::Dspark;
  const int64_t drafts = dspark ? c.dspark_block_size : a.drafts;
  spec.num_steps = drafts;
  spec.dspark_block = c.dspark_block_size;
  spec.num_draft_tokens = drafts + 1;
  std::printf(
      "\nspeculative decoding (%s, %lld drafts per step, greedy, %lld-token prompts, %lld tokens per request), "
      "acceptance SIMULATED (SGLANG_SIMULATE_ACC_LEN): random weights accept almost nothing\n",
      speculative_algorithm_name(spec.algorithm), (long long)drafts, (long long)a.prompt, (long long)a.decode);
  if (eagle && !model->draft_vocab().empty())
    std::printf(
        "draft vocabulary: the MTP head scores %zu of %lld tokens (%.3f GB of the head's %.3f per draft step)\n",
        model->draft_vocab().size(), (long long)c.vocab_size, double(cost.mtp_head_bytes) / 1e9,
        double(cost.head_bytes) / 1e9);
  const int64_t position = a.prompt + a.decode / 2;
  // The model's limits: the best read so far, the calibration's and those
  // read around each run, so that a calibration that ran in a slow phase of
  // a shared machine does not lower what the model allows. Each run is also
  // set against the limits read around it (EngineRun::around).
  MachineLimits model_limits = limits;
  // A main-model step of `tokens` rows whose LM head runs on `head_rows`
  // of them: its products one after another, each weight format at the
  // longer of its bytes at the bandwidth and its decoding floor (never below
  // the step's bytes or its decoding floor).
  auto step_floor = [&](const MachineLimits& at, int64_t tokens, int64_t head_rows) {
    return verify_step_serial_seconds(c, cost, tokens, head_rows, position, at.bandwidth, at.one_token_rates,
                                      at.fma_macs_per_s);
  };
  // A verify step of `batch` sequences: batch * (drafts + 1) rows, the LM
  // head on each sequence's first rows only where the engine skips the rest
  // (first_head_rows_for, head_skip_pays); a fractional accept length adds
  // the second passes of the sequences that accept more.
  auto verify_head_rows = [&](int64_t batch, double accept_len) {
    const int64_t rows = drafts + 1;
    const int64_t first = first_head_rows_for(accept_len, rows);
    if (!model->head_from_final_hc() || !head_skip_pays(batch * (rows - first), spec)) return double(batch * rows);
    const double second = std::clamp(accept_len - double(first), 0.0, 1.0);
    return double(batch) * (double(first) + second * double(rows - first));
  };
  auto verify_floor = [&](const MachineLimits& at, int64_t batch, double accept_len) {
    return step_floor(at, batch * (drafts + 1), int64_t(std::llround(verify_head_rows(batch, accept_len))));
  };
  // Draft steps of the chain: the first runs the rows the last step accepted
  // (about the accept length per sequence; the head only on each sequence's
  // last), the others one row each.
  auto first_draft_rows = [&](int64_t batch, double accept_len) {
    return std::max<int64_t>(batch, int64_t(double(batch) * accept_len + 0.5));
  };
  auto draft_bytes = [&](const Model::TokenCost& token_cost, int64_t batch, double accept_len) {
    if (dspark) return dspark_step_bytes(c, token_cost, batch, drafts);
    if (!eagle) return 0.0;
    return mtp_step_bytes(c, token_cost, first_draft_rows(batch, accept_len)) +
           double(drafts - 1) * mtp_step_bytes(c, token_cost, batch);
  };
  // An MTP step of `rows` rows, the head on one row of each of `batch`
  // sequences: its products one after another, as for a verify step.
  auto mtp_step_seconds = [&](const MachineLimits& at, const Model::TokenCost& token_cost, int64_t rows,
                              int64_t batch) {
    return mtp_step_serial_seconds(c, token_cost, rows, batch, position, at.bandwidth, at.one_token_rates,
                                   at.fma_macs_per_s);
  };
  // The draft steps' time on this machine (DSpark's draft: its bytes only).
  auto draft_seconds = [&](const MachineLimits& at, const Model::TokenCost& token_cost, int64_t batch,
                           double accept_len) {
    if (!eagle) return draft_bytes(token_cost, batch, accept_len) / at.bandwidth;
    return mtp_step_seconds(at, token_cost, first_draft_rows(batch, accept_len), batch) +
           double(drafts - 1) * mtp_step_seconds(at, token_cost, batch, batch);
  };
  // A request's first draft runs the MTP block over its prompt's rows (the
  // block's own attention window needs them) where later drafts run the
  // accepted rows: measured steps include it once per request, so the model
  // spreads it over the request's steps (about decode / accept length).
  auto catch_up_seconds = [&](const MachineLimits& at, const Model::TokenCost& token_cost, int64_t batch,
                              double accept_len) {
    if (!eagle) return 0.0;
    const int64_t prompt_rows = batch * std::min(a.prompt, c.window);
    const double extra = mtp_step_seconds(at, token_cost, prompt_rows, batch) -
                         mtp_step_seconds(at, token_cost, first_draft_rows(batch, accept_len), batch);
    return std::max(0.0, extra) * accept_len / double(a.decode);
  };
  // What a speculative step allows at `at`: verify + draft + the catch-up's share.
  auto speculative_roof = [&](const MachineLimits& at, int64_t batch, double accept_len) {
    return double(batch) * accept_len /
           (verify_floor(at, batch, accept_len) + draft_seconds(at, cost, batch, accept_len) +
            catch_up_seconds(at, cost, batch, accept_len));
  };
  for (int64_t batch : a.batches) {
    EngineOptions plain_options;
    plain_options.prefix_cache_bytes = 0;
    plain_options.decode_log_interval = 0;
    plain_options.pin_threads = true;  // as dsv4 serve runs its engine
    auto options_for = [&](double accept_len, bool bypass) {
      EngineOptions options = plain_options;
      options.speculative = spec;
      options.speculative.simulate_accept_len = accept_len;
      options.speculative.auto_bypass = bypass;
      return options;
    };
    // Rounds: the plain run, then each accept length forced, then gated; every
    // second round runs them in the opposite order, so that a drift within
    // a round does not always favour the plain run. On a shared machine the
    // speed moves by up to a third within minutes, so every case is run once
    // per round, the rounds one after another, and each case's best round
    // counts. The gated engine runs its steps in turn with a plain engine's
    // (run_in_turns), and its ratio to that engine is the gate's figure: two
    // runs minutes apart put the machine's drift into the ratio.
    std::vector<EngineRun> plains;
    std::vector<std::vector<EngineRun>> forced_runs(a.accept_lens.size());
    std::vector<std::vector<std::array<TurnRun, 2>>> gated_runs(a.accept_lens.size());  // {plain, gated}
    auto run = [&](const EngineOptions& options, int warm_up) {
      return bracketed_run(model_limits, model, options, batch, a.prompt, a.decode, warm_up);
    };
    // Two plain engines in turn, once a round: what the gate's ratio reads
    // where the two sides run the same steps (the method's own spread).
    std::vector<std::array<TurnRun, 2>> plain_pairs;
    // The gated engine takes the second place in even rounds and the first
    // in odd ones; the result is {plain, gated} either way.
    auto run_gated = [&](double accept_len, bool gated_first) {
      const EngineOptions gated = options_for(accept_len, true);
      if (!gated_first)
        return run_in_turns(model, {plain_options, gated}, batch, a.prompt, a.decode, a.gate_decode, {1, 4});
      const std::array<TurnRun, 2> runs =
          run_in_turns(model, {gated, plain_options}, batch, a.prompt, a.decode, a.gate_decode, {4, 1});
      return std::array<TurnRun, 2>{runs[1], runs[0]};
    };
    for (int round = 0; round < a.repeat; ++round) {
      const bool reversed = round % 2 == 1;
      if (!reversed) plains.push_back(run(plain_options, 1));
      plain_pairs.push_back(
          run_in_turns(model, {plain_options, plain_options}, batch, a.prompt, a.decode, a.gate_decode, {1, 1}));
      for (size_t k = 0; k < a.accept_lens.size(); ++k) {
        const size_t i = reversed ? a.accept_lens.size() - 1 - k : k;
        if (reversed) gated_runs[i].push_back(run_gated(a.accept_lens[i], true));
        forced_runs[i].push_back(run(options_for(a.accept_lens[i], false), 1));
        if (!reversed) gated_runs[i].push_back(run_gated(a.accept_lens[i], false));
      }
      if (reversed) plains.push_back(run(plain_options, 1));
    }
    auto best = [](const std::vector<EngineRun>& runs) {
      return *std::max_element(runs.begin(), runs.end(), [](const EngineRun& x, const EngineRun& y) {
        return x.tokens_per_second < y.tokens_per_second;
      });
    };
    const EngineRun plain = best(plains);
    const double plain_roof = double(batch) / step_floor(model_limits, batch, batch);
    const double plain_roof_around = double(batch) / step_floor(plain.around, batch, batch);
    std::printf(
        "batch %3lld plain: %8.2f tokens/s (%.1f ms per step; the model allows %.2f tokens/s, %.0f%% of it; %.2f at "
        "the limits read around the run, %.0f%%)",
        (long long)batch, plain.tokens_per_second, plain.forward_ms_per_step, plain_roof,
        100 * plain.tokens_per_second / plain_roof, plain_roof_around,
        100 * plain.tokens_per_second / plain_roof_around);
    if (a.repeat > 1) {
      std::printf("; best of %d rounds:", a.repeat);
      for (const EngineRun& r : plains) std::printf(" %.2f", r.tokens_per_second);
    }
    std::printf(
        "\n  limits read around the counted runs (GB/s read; fp32 FMA GFLOP/s; G weights/s decoded, BF16/FP8/FP4): "
        "plain %s",
        plain.around.text().c_str());
    for (size_t i = 0; i < a.accept_lens.size(); ++i)
      std::printf("; accept %.1f %s", a.accept_lens[i], best(forced_runs[i]).around.text().c_str());
    std::printf("; the model takes the best read in this run, %s\n", model_limits.text().c_str());
    std::vector<double> same;
    for (const auto& [first, second] : plain_pairs)
      same.push_back(second.tokens_per_second() / first.tokens_per_second());
    std::printf("  two plain engines, their steps in turn (the gate's method against itself): %.3fx (median of %zu;",
                median_of(same), same.size());
    for (double r : same) std::printf(" %.3f", r);
    std::printf(")\n");
    if (csv)
      *csv << "speculative_plain," << batch << ",," << plain.forward_ms_per_step / 1e3 << "," << plain.tokens_per_second
           << ",,,,," << plain_roof << "\n";
    for (size_t i = 0; i < a.accept_lens.size(); ++i) {
      const double accept_len = a.accept_lens[i];
      const EngineRun forced = best(forced_runs[i]);
      const double verify_seconds = verify_floor(model_limits, batch, accept_len);
      const double draft_floor = draft_seconds(model_limits, cost, batch, accept_len);
      const double catch_up = catch_up_seconds(model_limits, cost, batch, accept_len);
      const double roof = speculative_roof(model_limits, batch, accept_len);
      const double roof_around = speculative_roof(forced.around, batch, accept_len);
      std::printf(
          "  accept %.1f: speculative %8.2f tokens/s = %.2fx plain, %.0f%% of the %.2f the model allows, %.0f%% of "
          "the %.2f at the limits read around the run (verify %.1f ms, draft %.1f ms per step)\n",
          accept_len, forced.tokens_per_second, forced.tokens_per_second / plain.tokens_per_second,
          100 * forced.tokens_per_second / roof, roof, 100 * forced.tokens_per_second / roof_around, roof_around,
          forced.forward_ms_per_step, forced.draft_ms_per_step);
      // The gate: each round's gated engine against the plain engine whose
      // steps alternated with its own.
      std::vector<double> ratios;
      TurnRun gated_total, plain_total;
      for (const auto& [p, g] : gated_runs[i]) {
        ratios.push_back(g.tokens_per_second() / p.tokens_per_second());
        plain_total += p;
        gated_total += g;
      }
      const double median = median_of(ratios);
      std::printf(
          "    with the bypass (after 4 warm-up batches; %lld tokens a request), its steps in turn with a plain "
          "engine's: %.3fx that engine's tokens/s (median of %zu; rounds:",
          (long long)a.gate_decode, median, ratios.size());
      for (size_t r = 0; r < ratios.size(); ++r)
        std::printf(" %.2f / %.2f = %.3f", gated_runs[i][r][1].tokens_per_second(),
                    gated_runs[i][r][0].tokens_per_second(), ratios[r]);
      std::printf(
          "); %lld of %lld steps plain; a step %.2f ms: forward pass %.2f, drafts %.2f, outside them %.2f; plain "
          "%.2f: %.2f, -, %.2f\n",
          (long long)gated_total.bypassed_steps, (long long)gated_total.steps,
          gated_total.per_step_ms(gated_total.held_seconds), gated_total.per_step_ms(gated_total.forward_seconds),
          gated_total.per_step_ms(gated_total.draft_seconds), gated_total.per_step_ms(gated_total.outside_seconds()),
          plain_total.per_step_ms(plain_total.held_seconds), plain_total.per_step_ms(plain_total.forward_seconds),
          plain_total.per_step_ms(plain_total.outside_seconds()));
      if (a.repeat > 1) {
        std::printf("    rounds, speculative: tokens/s and x that round's plain run:");
        for (int round = 0; round < a.repeat; ++round) {
          const double base = plains[size_t(round)].tokens_per_second;
          const double sp = forced_runs[i][size_t(round)].tokens_per_second;
          std::printf("%s %.2f %.2fx", round ? ";" : "", sp, sp / base);
        }
        std::printf("\n");
      }
      std::printf("    the model, per step: verify %.1f ms (the LM head on %.0f of its %lld rows), draft %.1f ms",
                  1e3 * verify_seconds, verify_head_rows(batch, accept_len), (long long)(batch * (drafts + 1)),
                  1e3 * draft_floor);
      if (eagle)
        std::printf(", the MTP block over the %lld-token prompts %.1f ms (once per request, spread over its steps)",
                    (long long)std::min(a.prompt, c.window), 1e3 * catch_up);
      std::printf("\n");
      if (csv)
        *csv << "speculative_" << accept_len << "," << batch << ",," << forced.forward_ms_per_step / 1e3 << ","
             << forced.tokens_per_second << ",,,,," << roof << "," << median << "\n";
      if (a.split) {
        // One more forced run, its kernel operations timed per phase.
        EngineOptions options = options_for(accept_len, false);
        PhaseTimers timers(*model);
        options.on_phase = [&timers](StepPhase phase) { timers.enter(phase); };
        engine_run(model, options, batch, a.prompt, a.decode, 1, [&timers] { timers.recording = true; });
        model->set_backend(timers.inner);
        if (timers.steps > 0) {
          char key[64];
          std::snprintf(key, sizeof key, "speculative_%g_", accept_len);
          print_phase(timers.draft, "draft", timers.draft_seconds, timers.steps, batch, std::string(key) + "draft", csv,
                      model_limits);
          print_phase(timers.verify, "verify", timers.verify_seconds, timers.steps, batch, std::string(key) + "verify",
                      csv, model_limits);
        }
      }
    }
  }
  if (auto flash = flash_schedule_cost(c, cost, 16)) {
    std::printf("extrapolated to the 43-layer V4-Flash schedule at the measured %.2f GB/s (bytes only):\n",
                model_limits.bandwidth / 1e9);
    for (int64_t batch : a.batches) {
      const double plain = double(batch) * model_limits.bandwidth / decode_step_bytes(c, flash->cost, batch);
      std::printf("  batch %3lld: plain %.2f tokens/s;", (long long)batch, plain);
      for (double accept_len : a.accept_lens) {
        const double bytes =
            decode_step_bytes(c, flash->cost, batch * (drafts + 1)) + draft_bytes(flash->cost, batch, accept_len);
        const double rate = double(batch) * accept_len * model_limits.bandwidth / bytes;
        std::printf(" accept %.1f: %.2f (%.2fx)", accept_len, rate, rate / plain);
      }
      std::printf("\n");
    }
  }
}

}  // namespace dsv4::tools
