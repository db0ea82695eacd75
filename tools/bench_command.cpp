// `dsv4 bench`: prefill and decode speed of a model directory, printed beside
// the bytes of weights read per decoded token and the machine's measured
// memory read bandwidth (the decode roofline).
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "core/machine.h"
#include "model/model.h"

namespace dsv4::tools {

void load_progress(int64_t done, int64_t total);
void prefill_progress(int64_t done, int64_t total);

namespace {

struct BenchArgs {
  std::string model, csv;
  int64_t prompt = 512, decode = 16;
  std::vector<int64_t> batches = {1};
  int threads = 0;
  uint32_t seed = 1;
};

int run_bench(const BenchArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  auto model = Model::load(a.model, {load_progress});
  const ModelConfig& c = model->config();
  std::printf("model: %s  (%lld layers, hidden %lld, %lld experts top-%lld, vocab %lld)\n",
              a.model.c_str(), (long long)c.n_layers, (long long)c.dim,
              (long long)c.n_routed_experts, (long long)c.n_activated_experts, (long long)c.vocab_size);
  std::printf("threads: %d   cpu: %s\n", omp_get_max_threads(), detect_cpu_features().describe().c_str());
  const double bandwidth = measure_read_bandwidth();
  std::printf("measured memory read bandwidth: %.2f GB/s\n", bandwidth / 1e9);

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
    csv << "phase,batch,tokens,seconds,tokens_per_second,weight_bytes_per_token,achieved_gb_per_s,bandwidth_gb_per_s\n";
  }

  // Prefill.
  {
    std::vector<int32_t> tokens = random_tokens(a.prompt);
    SequenceState s = model->new_state();
    std::vector<float> logits(size_t(c.vocab_size));
    double t0 = now_seconds();
    // Only the last row's logits are needed after a prefill.
    // In chunks of 512 (the same bits as one call) so a long prefill shows progress.
    for (int64_t b = 0; b < a.prompt - 1; b += 512) {
      model->forward(s, tokens.data() + b, std::min<int64_t>(512, a.prompt - 1 - b), nullptr);
      prefill_progress(std::min<int64_t>(b + 512, a.prompt - 1), a.prompt - 1);
    }
    model->forward(s, tokens.data() + a.prompt - 1, 1, logits.data());
    double dt = now_seconds() - t0;
    std::printf("prefill  %6lld tokens: %8.3f s  %10.2f tokens/s\n", (long long)a.prompt, dt, double(a.prompt) / dt);
    if (csv) csv << "prefill,1," << a.prompt << "," << dt << "," << a.prompt / dt << ",,,"
                 << bandwidth / 1e9 << "\n";
  }

  // Decode at each batch size: sequences with a short prompt, then steps.
  const int64_t bytes_per_token = model->decode_weight_bytes_per_token();
  std::printf("weights read per decoded token (batch 1): %.3f GB\n", double(bytes_per_token) / 1e9);
  double single_rate = 0;
  for (int64_t batch : a.batches) {
    std::vector<SequenceState> states;
    std::vector<std::vector<int32_t>> seqs;
    for (int64_t b = 0; b < batch; ++b) {
      states.push_back(model->new_state());
      seqs.push_back(random_tokens(16 + a.decode));
      model->forward(states.back(), seqs.back().data(), 16, nullptr);
    }
    std::vector<float> logits(size_t(batch * c.vocab_size));
    double t0 = now_seconds();
    for (int64_t step = 0; step < a.decode; ++step) {
      std::vector<BatchItem> items;
      for (int64_t b = 0; b < batch; ++b)
        items.push_back({&states[size_t(b)], seqs[size_t(b)].data() + 16 + step, 1,
                         logits.data() + b * c.vocab_size});
      model->forward_batch(items);
    }
    double dt = now_seconds() - t0;
    double rate = double(batch * a.decode) / dt;
    if (batch == 1) single_rate = rate;
    double achieved = double(bytes_per_token) * double(a.decode) / dt;
    std::printf("decode batch %3lld: %8.3f ms/step  %10.2f tokens/s", (long long)batch,
                1e3 * dt / double(a.decode), rate);
    if (batch == 1)
      std::printf("  %.2f GB/s of weights = %.1f%% of measured bandwidth", achieved / 1e9,
                  100 * achieved / bandwidth);
    else if (single_rate > 0)
      std::printf("  %.2fx batch 1", rate / single_rate);
    std::printf("\n");
    if (csv) {
      csv << "decode," << batch << "," << batch * a.decode << "," << dt << "," << rate << ",";
      if (batch == 1) csv << bytes_per_token << "," << achieved / 1e9;
      else csv << ",";
      csv << "," << bandwidth / 1e9 << "\n";
    }
  }
  return 0;
}

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
  cmd->add_option("--batch", *batches, "Comma-separated decode batch sizes (e.g. 1,4,16)");
  cmd->add_option("--threads", a->threads, "Worker threads")->check(CLI::PositiveNumber);
  cmd->add_option("--csv", a->csv, "Also write the results as CSV");
  cmd->callback([a, batches, &exit_code] {
    try {
      a->batches = parse_list(*batches);
      exit_code = run_bench(*a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsv4 bench: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
