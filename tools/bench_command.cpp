// `dsv4 bench`: prefill and decode speed of a model directory, printed beside
// the machine's own limits measured in the same run: memory read bandwidth
// against the bytes read per decoded token (the decode roofline), and the
// best GEMM throughput against the FLOP/s of prefill (the prefill roofline).
// Both are also extrapolated to the full 43-layer V4-Flash layer schedule.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "bench_context.h"
#include "bench_costs.h"
#include "bench_products.h"
#include "bench_speculative.h"
#include "commands.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/threads.h"
#include "engine/speculative.h"
#include "engram_setup.h"
#include "gemm_peak.h"
#include "kernels/cpu/indexer_fp4.h"
#include "kernels/cpu/isa.h"
#include "kernels/timed_backend.h"
#include "load_mode_flags.h"
#include "machine_limits.h"
#include "model/model.h"
#include "svg_plot.h"

namespace dsv4::tools {

void load_progress(int64_t done, int64_t total);
void prefill_progress(int64_t done, int64_t total);

namespace {

struct BenchArgs {
  std::string model, csv, plot;
  int64_t prompt = 512, decode = 16, chunk = 2048;
  int repeat = 1;  // each measurement's best of this many runs
  std::vector<int64_t> batches = {1};
  int threads = 0;
  uint32_t seed = 1;
  std::string speculative;  // EAGLE or NGRAM: also bench speculative decoding
  std::string token_map;    // EAGLE's draft vocabulary (--speculative-token-map)
  int64_t speculative_prompt = 16;  // each --speculative request's prompt
  int64_t gate_decode = 0;          // tokens of each request the gate's engines count; 0: --decode
  std::vector<double> accept_lens = {2, 3, 4};
  LoadModeFlags load_mode;
  std::string numerics = "auto";  // auto (the model's default), exact or fast
  bool bounded_replay = false;    // V4.1: also time a prefill with bounded replay
  bool split = true;              // time one more prefill and decode run per operation (TimedBackend)
  std::vector<int64_t> contexts;  // decode from synthetic states of these many tokens
  std::vector<int64_t> context_batches = {1, 4};
};

// A prefill of `tokens` from a new state, in chunks of `chunk` (the same
// bits as one call; SGLang's chunked prefill), with the last token's logits
// alone; `progress`: shown on the terminal as it goes.
void prefill(Model& model, const std::vector<int32_t>& tokens, int64_t chunk, float* logits, bool progress) {
  SequenceState s = model.new_state();
  const int64_t n = int64_t(tokens.size());
  for (int64_t b = 0; b < n - 1; b += chunk) {
    model.forward(s, tokens.data() + b, std::min<int64_t>(chunk, n - 1 - b), nullptr);
    if (progress) prefill_progress(std::min<int64_t>(b + chunk, n - 1), n - 1);
  }
  model.forward(s, tokens.data() + n - 1, 1, logits);
}

// One more prefill of the same tokens through a TimedBackend: where its time
// goes, the weight products against everything else.
void print_prefill_split(Model& model, const std::vector<int32_t>& tokens, int64_t chunk, std::ofstream& csv) {
  TimedBackend timed(model.backend());
  std::vector<float> logits(size_t(model.config().vocab_size));
  const int64_t n = int64_t(tokens.size());
  const double total = run_with_timed_backend(model, timed, [&] { prefill(model, tokens, chunk, logits.data(), false); });
  std::printf("prefill split (one more %lld-token prefill, each backend operation timed; %.3f s):\n", (long long)n, total);
  double products = 0;
  for (int i = 0; i < kOpAccounts; ++i) {
    const OpAccount op = OpAccount(i);
    const TimedBackend::Account& acc = timed.account(op);
    if (acc.calls == 0) continue;
    if (op == OpAccount::Linear || op == OpAccount::Experts) products += acc.seconds;
    std::printf("  %-42s %8.3f s  %5.1f%%  (%lld calls)\n", op_account_name(op), acc.seconds,
                100 * acc.seconds / total, (long long)acc.calls);
    if (csv) csv << "prefill_split_" << op_account_key(op) << ",1," << n << "," << acc.seconds << ",,,,,,\n";
  }
  const double outside = total - timed.total_seconds();
  std::printf("  %-42s %8.3f s  %5.1f%%\n", "model code between operations", outside, 100 * outside / total);
  std::printf("  not weight products: %.1f%% of the prefill (target: at most 15%% at 4096 tokens)\n",
              100 * (total - products) / total);
  print_products(timed, "prefill", 1, n, 1.0, "the whole prefill", csv ? &csv : nullptr);
}

// One more decode run of `batch` sequences through a TimedBackend: each
// operation's time per step, the rate at which the weight products read
// the step's bytes (what batch 1's bandwidth target is about), and each
// kind of product against its own floor at the limits read around the
// batch's best run (`limits`).
void print_decode_split(const KernelBackend& backend, const std::function<double(TimedBackend*)>& decode_run,
                        int64_t batch, int64_t steps, double step_bytes, const MachineLimits& limits,
                        std::ofstream& csv) {
  const double bandwidth = limits.bandwidth;
  TimedBackend timed(backend);
  const double total = decode_run(&timed) / double(steps);
  const double products = (timed.account(OpAccount::Linear).seconds + timed.account(OpAccount::Experts).seconds) /
                          double(steps);
  std::printf("  split (one more run, each operation timed; %.2f ms/step): weight products + experts %.2f ms = %.1f "
              "GB/s of the step's bytes (%.0f%% of the bandwidth around the timed run)",
              1e3 * total, 1e3 * products, step_bytes / products / 1e9, 100 * step_bytes / products / bandwidth);
  for (int i = 0; i < kOpAccounts; ++i) {
    const OpAccount op = OpAccount(i);
    const TimedBackend::Account& acc = timed.account(op);
    if (acc.calls == 0 || op == OpAccount::Linear || op == OpAccount::Experts) continue;
    std::printf(", %s %.2f ms", op_account_name(op), 1e3 * acc.seconds / double(steps));
  }
  const double outside = total - timed.total_seconds() / double(steps);
  std::printf(", model code between operations %.2f ms\n", 1e3 * outside);
  print_products(timed, "decode", batch, batch * steps, double(steps), "per step", csv ? &csv : nullptr, &limits);
  if (csv)
    for (int i = 0; i < kOpAccounts; ++i)
      csv << "decode_split_" << op_account_key(OpAccount(i)) << "," << batch << "," << batch * steps << ","
          << timed.account(OpAccount(i)).seconds << ",,,,,,\n";
}

}  // namespace

int run_bench(const BenchArgs& a) {
  if (!a.token_map.empty() && parse_speculative_algorithm(a.speculative) != SpeculativeAlgorithm::Eagle)
    throw Error("--speculative-token-map narrows the MTP head's draft vocabulary: it needs --speculative EAGLE");
  set_compute_threads(a.threads);
  omp_set_num_threads(compute_threads());  // oneDNN's GEMM peak runs on this thread's OpenMP team
  const bool pinned = pin_compute_threads();
  LoadOptions load_options;
  load_options.progress = load_progress;
  load_options.load_mode = resolve_load_mode(a.load_mode);
  load_options.engram_token_map = engram_token_map_for(a.model);
  if (a.numerics != "auto")
    load_options.backend = a.numerics == "exact" ? &exact_backend() : &default_backend();
  std::shared_ptr<Model> model = Model::load(a.model, load_options);
  std::printf("numerics: %s (%s)\n", model->backend().exact() ? "exact (double sums)" : "fast (fp32 lanes)",
              model->backend().name().c_str());
  std::printf("kernels: %s\n", kernel_isa_reason().c_str());
  {
    // Page faults belong to loading, not to the first timed steps.
    const double t0 = now_seconds();
    model->prefault_weights();
    std::printf("weights paged in: %.1f s, %s\n", now_seconds() - t0, describe_residency(model->residency()).c_str());
  }
  const ModelConfig& c = model->config();
  std::printf("model: %s  (%lld layers, hidden %lld, %lld experts top-%lld, vocab %lld)\n", a.model.c_str(),
              (long long)c.n_layers, (long long)c.dim, (long long)c.n_routed_experts, (long long)c.n_activated_experts,
              (long long)c.vocab_size);
  std::printf("threads: %d (%s)   cpu: %s\n", compute_threads(),
              pinned                      ? "pinned, one CPU each"
              : pinning_refusal().empty() ? "not pinned"
                                          : pinning_refusal().c_str(),
              detect_cpu_features().describe().c_str());
  // The machine's limits, measured before and again after the prefill; the
  // best of the two counts. On a shared machine a short measurement can land
  // in a slow moment that a 40-second prefill averages out, which would
  // flatter the percentages.
  MachineLimits limits;         // bandwidth, one-token rates, fp32 FMA ceiling: the best read of each
  GemmPeak peak, int8_ceiling;  // the best GEMM of the machine; the int8 dot ceiling
  auto measure_limits = [&](const char* when) {
    const MachineLimits read = read_machine_limits(5);
    limits.keep_best(read);
    std::printf("measured memory read bandwidth%s: %.2f GB/s\n", when, read.bandwidth / 1e9);
    GemmPeak best;
    for (const GemmPeak& g : measure_onednn_gemm_peaks()) {
      std::printf("measured GEMM%s: %-60s %8.1f GFLOP/s\n", when, g.name.c_str(), g.flops / 1e9);
      if (g.flops > best.flops) best = g;
    }
    std::printf("measured%s: %-65s %8.1f GFLOP/s\n", when, read.fma_name.c_str(), read.fma_flops() / 1e9);
    const GemmPeak int8 = measure_int8_dot_peak();
    if (int8.flops > 0) std::printf("measured%s: %-65s %8.1f GOP/s\n", when, int8.name.c_str(), int8.flops / 1e9);
    if (int8.flops > int8_ceiling.flops) int8_ceiling = int8;
    if (best.flops == 0)
      best = GemmPeak{read.fma_name, read.fma_flops()};  // built without oneDNN: the FMA ceiling stands in
    if (best.flops > peak.flops) peak = best;
    const std::array<double, 4>& rates = read.one_token_rates;
    std::printf("measured%s: one-token products from cache, 4 MB a core (decoding + one FMA per weight), G weights/s:",
                when);
    std::printf(" BF16 %.1f, FP8 %.1f, FP4 %.1f\n", rates[size_t(WeightFormat::BF16)] / 1e9,
                rates[size_t(WeightFormat::FP8_BLOCK128)] / 1e9, rates[size_t(WeightFormat::FP4_BLOCK32)] / 1e9);
  };
  measure_limits("");
  if (peak.name == limits.fma_name)
    std::printf("(built without oneDNN: the fp32 FMA ceiling stands in for the peak GEMM)\n");
  const Model::TokenCost cost = model->token_cost();
  auto percent_of_peak = [&](double flops) { return 100 * flops / peak.flops; };

  std::mt19937 rng(a.seed);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& v : t) v = int32_t(rng() % uint32_t(c.vocab_size));
    if (!t.empty()) t[0] = int32_t(c.bos_token_id);
    return t;
  };
  std::ofstream csv;
  if (!a.csv.empty()) {
    csv.open(a.csv);
    if (!csv) throw Error("cannot write " + a.csv);
    csv << "phase,batch,tokens,seconds,tokens_per_second,weight_bytes_per_token,achieved_gb_per_s,"
           "bandwidth_gb_per_s,achieved_gflop_per_s,peak_gemm_gflop_per_s\n";
  }
  double prefill_flops_rate = 0, decode_bytes_rate = 0;
  BarGroup prefill_bars{"prefill: FLOP/s against the compute rooflines", {}};
  BarGroup decode_bars{"decode: tokens/s against the roofline (step bytes, FLOPs, weight decoding)", {}};
  auto num = [](const char* f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return std::string(b);
  };

  // The best of a.repeat runs, like the limits (the best of two): on a
  // shared machine a run can land in a slow phase (this project's VM swings
  // by up to 1.3x between runs of the same binary).
  auto best_of_runs = [&](const char* what, const std::function<double()>& run) {
    std::vector<double> times;
    for (int r = 0; r < a.repeat; ++r) times.push_back(run());
    if (a.repeat > 1) {
      std::printf("%s: %d runs,", what, a.repeat);
      for (double t : times) std::printf(" %.3f", t);
      std::printf(" s; the best counts\n");
    }
    return *std::min_element(times.begin(), times.end());
  };

  // Prefill.
  {
    std::vector<int32_t> tokens = random_tokens(a.prompt);
    std::vector<float> logits(size_t(c.vocab_size));
    const double dt = best_of_runs("prefill", [&] {
      const double t0 = now_seconds();
      prefill(*model, tokens, a.chunk, logits.data(), true);
      return now_seconds() - t0;
    });
    const double flops = 2.0 * double(prefill_macs(c, cost, a.prompt));
    prefill_flops_rate = flops / dt;
    if (a.split) print_prefill_split(*model, tokens, a.chunk, csv);
    if (a.bounded_replay) {
      // The same prompt with V4.1's bounded replay: the late layers on the
      // last window only (what --enable-decoder-swa-bounded-replay does).
      if (model->replay_layer() < 0) throw Error("--bounded-replay needs a V4.1 model (a ratio-1 KV source)");
      const double replay_dt = best_of_runs("prefill (bounded replay)", [&] {
        SequenceState s = model->new_state();
        const double t0 = now_seconds();
        for (int64_t b = 0; b < a.prompt; b += a.chunk) {
          const int64_t n = std::min<int64_t>(a.chunk, a.prompt - b);
          BatchItem item{&s, tokens.data() + b, n, b + n == a.prompt ? logits.data() : nullptr};
          item.last_logits_only = true;
          item.replay_from = a.prompt - c.window;
          model->forward_batch({item});
        }
        return now_seconds() - t0;
      });
      std::printf("prefill  %6lld tokens with bounded replay (layers %lld+ on the last %lld): %8.3f s  %10.2f "
                  "tokens/s = %.2fx the full prefill\n",
                  (long long)a.prompt, (long long)model->replay_layer(), (long long)c.window, replay_dt,
                  double(a.prompt) / replay_dt, dt / replay_dt);
      if (csv) csv << "prefill_bounded_replay,1," << a.prompt << "," << replay_dt << "," << a.prompt / replay_dt << ",,,,,\n";
    }
    measure_limits(" (again)");
    std::printf(
        "limits used: %.2f GB/s, peak GEMM %.1f GFLOP/s, fp32 FMA ceiling %.1f GFLOP/s (best of the two "
        "measurements)\n",
        limits.bandwidth / 1e9, peak.flops / 1e9, limits.fma_flops() / 1e9);
    std::printf(
        "prefill  %6lld tokens: %8.3f s  %10.2f tokens/s  %.1f GFLOP/s = %.1f%% of the peak GEMM, %.1f%% of the fp32 "
        "FMA ceiling\n",
        (long long)a.prompt, dt, double(a.prompt) / dt, flops / dt / 1e9, percent_of_peak(flops / dt),
        100 * flops / dt / limits.fma_flops());
    prefill_bars.bars.push_back({num("%.0f tokens vs ", double(a.prompt)) + "peak GEMM",
                                 num("%.1f GFLOP/s", flops / dt / 1e9) + num(" = %.1f%%", percent_of_peak(flops / dt)),
                                 flops / dt, peak.flops});
    prefill_bars.bars.push_back({num("%.0f tokens vs ", double(a.prompt)) + "fp32 FMA ceiling",
                                 num("%.1f%%", 100 * flops / dt / limits.fma_flops()), flops / dt, limits.fma_flops()});
    if (csv)
      csv << "prefill,1," << a.prompt << "," << dt << "," << a.prompt / dt << ",,," << limits.bandwidth / 1e9 << ","
          << flops / dt / 1e9 << "," << peak.flops / 1e9 << "\n";
  }

  // Decode at each batch size: sequences with a short prompt, then steps.
  const int64_t bytes_per_token = model->decode_weight_bytes_per_token();
  std::printf("weights read per decoded token (batch 1): %.3f GB\n", double(bytes_per_token) / 1e9);
  double single_rate = 0;
  for (int64_t batch : a.batches) {
    std::vector<std::vector<int32_t>> seqs;
    for (int64_t b = 0; b < batch; ++b) seqs.push_back(random_tokens(16 + a.decode));
    std::vector<float> logits(size_t(batch * c.vocab_size));
    // Sequences with a 16-token prompt, then a.decode timed steps (through
    // `timed` when given: the split below).
    auto decode_run = [&](TimedBackend* timed) {
      std::vector<SequenceState> states;
      for (int64_t b = 0; b < batch; ++b) {
        states.push_back(model->new_state());
        model->forward(states.back(), seqs[size_t(b)].data(), 16, nullptr);
      }
      auto steps = [&] {
        for (int64_t step = 0; step < a.decode; ++step) {
          std::vector<BatchItem> items;
          for (int64_t b = 0; b < batch; ++b)
            items.push_back(
                {&states[size_t(b)], seqs[size_t(b)].data() + 16 + step, 1, logits.data() + b * c.vocab_size});
          model->forward_batch(items);
        }
      };
      if (timed) return run_with_timed_backend(*model, *timed, steps);
      const double t0 = now_seconds();
      steps();
      return now_seconds() - t0;
    };
    // On a shared machine the bandwidth a run gets moves with its
    // neighbours' load (37-67 GB/s within minutes on the development VM),
    // and the cores' speed with it (the one-token decoding rates by up to
    // 1.8x): each decode run is bracketed by two reads of all the limits
    // (bandwidth, FMA ceiling, one-token rates), and the batch's roofline
    // uses the better of each around its best run (the run's own moment).
    // The roofline at the run-wide best limits is printed beside it.
    MachineLimits here;
    double best_dt = 0;
    const double dt = best_of_runs(num("decode batch %.0f", double(batch)).c_str(), [&] {
      double t = 0;
      const MachineLimits around = read_limits_around(
          limits, [] { return read_machine_limits(1); }, [&] { t = decode_run(nullptr); });
      if (best_dt == 0 || t < best_dt) {
        best_dt = t;
        here = around;
      }
      return t;
    });
    const double bandwidth_here = here.bandwidth;
    double rate = double(batch * a.decode) / dt;
    double achieved = double(bytes_per_token) * double(a.decode) / dt;
    if (batch == 1) single_rate = rate, decode_bytes_rate = achieved;
    // A step of b tokens reads the shared weights once and every routed
    // expert that at least one token picked: with uniform routing (random
    // weights) E * (1 - (1 - k/E)^b) experts per layer instead of k.
    // A batched step is also bounded by its FLOPs at the peak GEMM (on a CPU
    // the head and the dense matrices at batch 16 cost about as much time in
    // FMAs as in reading their bytes) and by decoding its weights plus its
    // FMAs (decode_step_floor_seconds).
    const double step_bytes = decode_step_bytes(c, cost, batch);
    const double memory_seconds = step_bytes / bandwidth_here;
    const int64_t position = 16 + a.decode / 2;
    const double step_flops = 2.0 * decode_step_macs(c, cost, batch, position);
    const double compute_seconds = step_flops / peak.flops;
    auto floor_at = [&](const MachineLimits& m) {
      return decode_step_floor_seconds(c, cost, batch, position, m.one_token_rates, m.fma_macs_per_s);
    };
    const double floor_seconds = floor_at(here);
    // The products run one after another: each weight format at the longer
    // of its bytes and its decoding (never below either total).
    auto serial_at = [&](const MachineLimits& m) {
      return decode_step_serial_seconds(c, cost, batch, position, m.bandwidth, m.one_token_rates, m.fma_macs_per_s);
    };
    const double serial_seconds = serial_at(here);
    const double roof = double(batch) / std::max({memory_seconds, compute_seconds, floor_seconds, serial_seconds});
    // The same roofline at the best limits read in the whole run: the
    // fastest this machine was seen to be, not the run's own moment.
    const double roof_best =
        double(batch) / std::max({step_bytes / limits.bandwidth, compute_seconds, floor_at(limits), serial_at(limits)});
    decode_bars.bars.push_back(
        {num("batch %.0f", double(batch)), num("%.2f tokens/s", rate) + num(" (roofline %.1f)", roof), rate, roof});
    std::printf("decode batch %3lld: %8.3f ms/step  %10.2f tokens/s", (long long)batch, 1e3 * dt / double(a.decode),
                rate);
    std::printf("  [limits around this run: %s; run-wide best: %s]", here.text().c_str(), limits.text().c_str());
    if (batch == 1) {
      // At batch 1 the bytes bound the step, or decoding the weights at the
      // one-token rates where that takes longer on this CPU (few cores per
      // GB/s), or, where some formats are bound by their bytes and others
      // by their decoding, the products one after another: that one caps
      // the share of the read bandwidth a step can reach.
      std::printf(
          "  %.2f GB/s of weights = %.1f%% of the bandwidth around this run (%.1f%% of the run-wide best); the "
          "bytes at that bandwidth: %.1f ms; decoding the weights at the one-token rates + the FMAs: %.1f ms; the "
          "products one after another, each weight format at the longer of the two: %.1f ms (%.0f%% of the step), "
          "so the roofline is %.1f tokens/s (%s; at most %.1f%% of the bandwidth, %.1f%% at the run-wide best "
          "limits) and the step is at %.0f%% of it (%.0f%% of the %.1f at the run-wide best limits)",
          achieved / 1e9, 100 * achieved / bandwidth_here, 100 * achieved / limits.bandwidth, 1e3 * memory_seconds,
          1e3 * floor_seconds, 1e3 * serial_seconds, 100 * serial_seconds * rate, roof,
          serial_seconds > 1.0001 * std::max(memory_seconds, floor_seconds) ? "bound by the products one after another"
          : floor_seconds > memory_seconds                                  ? "bound by decoding the weights"
                                                                            : "bound by the bytes",
          100 * memory_seconds / std::max(memory_seconds, serial_seconds),
          100 * step_bytes / limits.bandwidth / std::max(step_bytes / limits.bandwidth, serial_at(limits)),
          100 * rate / roof, 100 * rate / roof_best, roof_best);
    } else {
      if (single_rate > 0)
        std::printf("  %.2fx batch 1,", rate / single_rate);
      else
        std::printf(" ");
      std::printf(
          " %.0f%% of the roofline %.1f tokens/s (%.2f GB per step: %.0f ms at the bandwidth; "
          "%.1f GFLOP: %.0f ms at the peak GEMM; decoding the weights once + the FMAs: %.0f ms; the products one "
          "after another, each weight format at the longer of its bytes and its decoding: %.0f ms; at the run-wide "
          "best limits the roofline is %.1f, %.0f%% of it)",
          100 * rate / roof, roof, step_bytes / 1e9, 1e3 * memory_seconds, step_flops / 1e9, 1e3 * compute_seconds,
          1e3 * floor_seconds, 1e3 * serial_seconds, roof_best, 100 * rate / roof_best);
      if (single_rate > 0) std::printf("; the roofline allows %.2fx batch 1", roof / single_rate);
    }
    std::printf("\n");
    if (a.split) print_decode_split(model->backend(), decode_run, batch, a.decode, step_bytes, here, csv);
    if (csv) {
      csv << "decode," << batch << "," << batch * a.decode << "," << dt << "," << rate << ",";
      if (batch == 1)
        csv << bytes_per_token << "," << achieved / 1e9;
      else
        csv << ",";
      csv << "," << bandwidth_here / 1e9 << ",,\n";
    }
  }

  if (!a.contexts.empty())
    run_context_bench(
        *model, a.contexts, a.context_batches, a.decode,
        {&limits, cpu::fp4_scores_use_vnni(active_kernel_isa()) && int8_ceiling.flops > 0 ? int8_ceiling.flops : 0,
         a.repeat},
        csv);

  // The 43-layer V4-Flash model has the same layer kinds as a real-shaped
  // slice: scale the per-layer costs, keep the measured rates.
  if (const auto flash = flash_schedule_cost(c, cost, a.prompt)) {
    std::printf(
        "extrapolated to the %s schedule with these layer shapes (%.2f GB of weights read per decoded "
        "token):\n",
        flash->name.c_str(), double(flash->decode_bytes) / 1e9);
    if (decode_bytes_rate > 0) {
      const double rate = decode_bytes_rate / double(flash->decode_bytes);
      // A slice's bytes are mostly its BF16 head, the full model's mostly
      // FP8 and FP4 matrices, whose decoding can bound a token on a machine
      // with few cores: the line also gives that bound.
      const double floor_seconds = decode_step_floor_seconds(c, flash->cost, 1, 16 + a.decode / 2,
                                                             limits.one_token_rates, limits.fma_macs_per_s);
      const double serial_seconds = decode_step_serial_seconds(c, flash->cost, 1, 16 + a.decode / 2, limits.bandwidth,
                                                               limits.one_token_rates, limits.fma_macs_per_s);
      std::printf(
          "  decode batch 1: %.2f tokens/s at the measured %.2f GB/s; decoding its weights at the one-token "
          "rates takes %.0f ms per token here (at most %.2f tokens/s); its products one after another, each "
          "weight format at the longer of its bytes and its decoding, %.0f ms (at most %.2f tokens/s, %.0f%% of the "
          "read bandwidth)\n",
          rate, decode_bytes_rate / 1e9, 1e3 * floor_seconds, 1.0 / floor_seconds, 1e3 * serial_seconds,
          1.0 / serial_seconds, 100 * double(flash->decode_bytes) / limits.bandwidth / serial_seconds);
      if (csv)
        csv << "decode_43_layers_estimate,1,,," << rate << "," << flash->decode_bytes << "," << decode_bytes_rate / 1e9
            << "," << limits.bandwidth / 1e9 << ",,\n";
    }
    // A batch reads every routed expert that one of its tokens picked. In
    // the full model the experts are most of the bytes (in a slice, its
    // head), so there the memory roofline alone bounds what a batch can gain
    // over batch 1, on any machine.
    const double single_bytes = decode_step_bytes(c, flash->cost, 1);
    for (int64_t batch : a.batches) {
      if (batch == 1) continue;
      const double bytes = decode_step_bytes(c, flash->cost, batch);
      std::printf(
          "  decode batch %lld: %.2f GB per step (uniform routing): at most %.2f tokens/s at the measured "
          "bandwidth, %.2fx batch 1 by bytes alone\n",
          (long long)batch, bytes / 1e9, double(batch) * limits.bandwidth / bytes,
          double(batch) * single_bytes / bytes);
      if (csv)
        csv << "decode_43_layers_memory_bound," << batch << ",,," << double(batch) * limits.bandwidth / bytes << ","
            << bytes / double(batch) << ",," << limits.bandwidth / 1e9 << ",,\n";
    }
    const double rate = prefill_flops_rate / (2.0 * double(flash->prefill_macs) / double(a.prompt));
    std::printf("  prefill %lld tokens: %.2f tokens/s at the measured %.1f GFLOP/s\n", (long long)a.prompt, rate,
                prefill_flops_rate / 1e9);
    if (csv)
      csv << "prefill_43_layers_estimate,1," << a.prompt << ",," << rate << ",,," << limits.bandwidth / 1e9 << ","
          << prefill_flops_rate / 1e9 << "," << peak.flops / 1e9 << "\n";
  } else {
    std::printf(c.v41 ? "(no extrapolation to V4.1-Flash: the model lacks a ratio-2 or a ratio-1 KV source)\n"
                      : "(no extrapolation to V4-Flash: the model lacks a ratio-4 or a ratio-128 layer)\n");
  }
  if (!a.speculative.empty()) {
    SpeculativeBenchArgs spec;
    spec.algorithm = a.speculative;
    spec.accept_lens = a.accept_lens;
    spec.batches = a.batches;
    spec.decode = std::max<int64_t>(a.decode, 8);
    spec.split = a.split;
    spec.repeat = a.repeat;
    spec.prompt = a.speculative_prompt;
    spec.gate_decode = a.gate_decode > 0 ? a.gate_decode : spec.decode;
    if (!a.token_map.empty()) model->set_draft_vocab(load_token_map(a.token_map));
    run_speculative_bench(model, spec, limits, csv ? &csv : nullptr);
  }
  if (!a.plot.empty()) {
    std::ofstream out(a.plot);
    const std::string subtitle = a.model + num(": %.0f layers, ", double(c.n_layers)) +
                                 num("%.0f threads, ", double(compute_threads())) +
                                 num("read bandwidth %.1f GB/s, ", limits.bandwidth / 1e9) + "peak GEMM " + peak.name +
                                 num(" %.0f GFLOP/s", peak.flops / 1e9);
    out << roofline_bars_svg("dsv4 bench", subtitle, {prefill_bars, decode_bars});
    if (!out) throw Error("cannot write " + a.plot);
    std::printf("plot: %s\n", a.plot.c_str());
  }
  return 0;
}

namespace {

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      out.push_back(std::stoll(item));
    } catch (...) {
      throw Error("invalid batch list \"" + s + "\"");
    }
    if (out.back() <= 0) throw Error("batch sizes must be positive");
  }
  return out;
}

}  // namespace

void register_bench_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<BenchArgs>();
  auto batches = std::make_shared<std::string>("1");
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed against the memory roofline");
  cmd->add_option("--model", a->model, "Checkpoint directory")->required();
  cmd->add_option("--prompt", a->prompt, "Prefill length in tokens")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--decode", a->decode, "Decode steps per batch size")->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", a->repeat,
                  "Runs of each prefill and decode measurement (with --speculative: rounds of the plain and "
                  "speculative runs, one after another); the best counts (default 1)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--chunk", a->chunk, "Prefill chunk in tokens (like --chunked-prefill-size)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--batch", *batches, "Comma-separated decode batch sizes (e.g. 1,4,16)");
  cmd->add_option("--threads", a->threads,
                  "Compute threads (default: the CPUs this process may use, cgroup quota included)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--csv", a->csv, "Also write the results as CSV");
  add_load_mode_flags(cmd, &a->load_mode);
  cmd->add_flag("!--no-split", a->split, "Skip the extra prefill and decode runs that time each operation (the splits)");
  cmd->add_flag("--bounded-replay", a->bounded_replay,
                "V4.1: also time the prompt with bounded replay (--enable-decoder-swa-bounded-replay)");
  cmd->add_option("--numerics", a->numerics,
                  "auto (the model's: exact for V4.1), exact (double sums) or fast (fp32 lanes)")
      ->check(CLI::IsMember({"auto", "exact", "fast"}));
  cmd->add_option("--plot", a->plot, "Also write an SVG chart of the results against the rooflines");
  cmd->add_option("--speculative", a->speculative,
                  "Also compare plain and speculative decoding through the engine: EAGLE (the MTP head) or NGRAM");
  auto contexts = std::make_shared<std::string>(), context_batches = std::make_shared<std::string>("1,4");
  cmd->add_option("--context", *contexts,
                  "Also decode from synthetic states of these many tokens of context (e.g. 4096,65536,262144,1048576; "
                  "random cached rows, no prefill)");
  cmd->add_option("--context-batch", *context_batches, "Batch sizes for --context (default 1,4)");
  auto accept = std::make_shared<std::string>("2,3,4");
  cmd->add_option("--accept-len", *accept, "Simulated accept lengths for --speculative (default 2,3,4)");
  cmd->add_option("--speculative-token-map", a->token_map,
                  "With --speculative EAGLE: the draft vocabulary (a JSON array or a list of token ids), as dsv4 serve "
                  "takes it");
  cmd->add_option("--speculative-prompt", a->speculative_prompt,
                  "Prompt tokens of each --speculative request (default 16); past the model's window (128) the runs "
                  "also pay the window's attention and the draft rows kept beyond it")
      ->check(CLI::Range(2, 1 << 16));
  cmd->add_option("--gate-decode", a->gate_decode,
                  "Tokens of each request that the gate's engines count, in turn with a plain engine's (default: "
                  "--decode); long enough to hold the gate's probes (up to 256 steps apart or more where speculation "
                  "loses), it gives the gate's steady state")
      ->check(CLI::Range(8, 1 << 16));
  cmd->callback([a, batches, accept, contexts, context_batches, &exit_code] {
    try {
      a->batches = parse_list(*batches);
      if (!contexts->empty()) a->contexts = parse_list(*contexts);
      a->context_batches = parse_list(*context_batches);
      a->accept_lens.clear();
      std::stringstream list(*accept);
      for (std::string item; std::getline(list, item, ',');) {
        char* end = nullptr;
        const double v = std::strtod(item.c_str(), &end);
        if (item.empty() || *end != '\0' || !(v >= 1.0)) throw Error("--accept-len: numbers >= 1, comma-separated");
        a->accept_lens.push_back(v);
      }
      exit_code = run_bench(*a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsv4 bench: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
