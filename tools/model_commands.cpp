// Model subcommands: `dsv4 logits` (stable interface for test harnesses) and
// `dsv4 bench`.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "engram_setup.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/model.h"

namespace dsv4::tools {
namespace {

std::vector<int32_t> parse_token_list(const std::string& spec) {
  std::string text = spec;
  if (!spec.empty() && spec[0] == '@') {
    std::ifstream in(spec.substr(1));
    if (!in) throw Error("cannot read token file " + spec.substr(1));
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    size_t b = item.find_first_not_of(" \t\r");
    if (b == std::string::npos) {
      item.clear();
      return;
    }
    size_t e = item.find_last_not_of(" \t\r");
    std::string s = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used != s.size() || v < 0 || v > INT32_MAX) throw Error("invalid token id \"" + s + "\"");
    ids.push_back(int32_t(v));
    item.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == '\n')
      flush();
    else
      item.push_back(ch);
  }
  flush();
  if (ids.empty()) throw Error("no token ids given");
  return ids;
}

}  // namespace

// Progress bar of a long prefill on stderr (only on a terminal).
void prefill_progress(int64_t done, int64_t total) {
  if (!isatty(fileno(stderr)) || total < 256) return;
  int width = 30, filled = int(width * done / std::max<int64_t>(total, 1));
  std::fprintf(stderr, "\rprefill [%.*s%*s] %lld/%lld tokens", filled, "##############################", width - filled,
               "", (long long)done, (long long)total);
  if (done == total) std::fprintf(stderr, "\n");
}

// Progress bar on stderr while a model loads (only on a terminal).
void load_progress(int64_t done, int64_t total) {
  if (!isatty(fileno(stderr))) return;
  int width = 30, filled = int(width * done / std::max<int64_t>(total, 1));
  std::fprintf(stderr, "\rloading model [%.*s%*s] %lld/%lld layers", filled, "##############################",
               width - filled, "", (long long)done, (long long)total);
  if (done == total) std::fprintf(stderr, "\n");
}

namespace {

// The DSpark drafts of `dsv4 logits --dspark`: for each position p, the
// block drafted after the model consumed tokens 0..p, with token p+1 as its
// first input. The rings of a draft after p hold the window of rows up to
// p, rebuilt from the target layers' states of those positions, so a draft
// depends on the tokens only, not on how they were chunked.
void write_dspark_drafts(const Model& model, const std::vector<int32_t>& tokens, const std::vector<float>& hidden,
                         const std::vector<int32_t>& positions, std::vector<OutputTensor>& outputs,
                         std::vector<float>& logits, std::vector<int32_t>& ids, std::vector<float>& confidence) {
  const ModelConfig& c = model.config();
  const int64_t P = int64_t(positions.size()), block = c.dspark_block_size, V = c.vocab_size;
  const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  logits.assign(size_t(P * block * V), 0.0f);
  ids.assign(size_t(P * (block + 1)), 0);
  confidence.assign(size_t(P * block), 0.0f);
  for (int64_t i = 0; i < P; ++i) {
    const int64_t p = positions[size_t(i)];
    if (p + 1 >= int64_t(tokens.size()))
      throw Error("--dspark position " + std::to_string(p) + " needs token " + std::to_string(p + 1) +
                  ", past the end of --tokens");
    SequenceState state = model.new_state();
    const int64_t first = std::max<int64_t>(0, p + 1 - c.window);
    model.dspark_extend(state, hidden.data() + first * width, first, p + 1 - first);
    DsparkDraftItem item{&state, tokens[size_t(p + 1)], block, ids.data() + i * (block + 1),
                         logits.data() + i * block * V, confidence.data() + i * block, {}};
    model.dspark_draft({item});
  }
  outputs.push_back({"dspark_logits", DType::F32, {P, block, V}, logits.data()});
  outputs.push_back({"dspark_ids", DType::I32, {P, block + 1}, ids.data()});
  outputs.push_back({"dspark_confidence", DType::F32, {P, block}, confidence.data()});
}

int run_logits(const std::string& model_dir, const std::string& tokens_spec, const std::string& out, int64_t prefill,
               int64_t chunk, int threads, bool mtp, const std::string& dspark_spec) {
  set_compute_threads(threads);
  std::vector<int32_t> tokens = parse_token_list(tokens_spec);
  const int64_t n = int64_t(tokens.size());
  if (prefill < 0 || prefill > n) prefill = n;
  if (chunk <= 0) chunk = std::max<int64_t>(prefill, 1);
  std::vector<int32_t> dspark_positions;
  if (!dspark_spec.empty()) dspark_positions = parse_token_list(dspark_spec);
  LoadOptions options;
  options.progress = load_progress;
  options.engram_token_map = engram_token_map_for(model_dir);
  auto model = Model::load(model_dir, options);
  const ModelConfig& c = model->config();
  if (mtp && !model->has_mtp()) throw Error("--mtp given but the checkpoint has no MTP block");
  const bool dspark = !dspark_positions.empty();
  if (dspark && !model->has_dspark()) throw Error("--dspark given but the checkpoint has no DSpark head");
  const int64_t V = c.vocab_size, W = c.hc_mult * c.dim;
  const int64_t hidden_width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  std::vector<float> logits(static_cast<size_t>(n * V)), hc(mtp ? size_t(n * W) : 0), mtp_logits;
  std::vector<float> hidden(dspark ? size_t(n * hidden_width) : 0);
  SequenceState state = model->new_state();
  auto run = [&](int64_t begin, int64_t len) {
    BatchItem item{&state, tokens.data() + begin, len, logits.data() + begin * V, mtp ? hc.data() + begin * W : nullptr};
    if (dspark) item.dspark_hidden = hidden.data() + begin * hidden_width;
    model->forward_batch({item});
  };
  for (int64_t b = 0; b < prefill; b += chunk) {
    run(b, std::min(chunk, prefill - b));
    prefill_progress(std::min(b + chunk, prefill), prefill);
  }
  for (int64_t b = prefill; b < n; ++b) run(b, 1);
  std::vector<OutputTensor> outputs = {{"logits", DType::F32, {n, V}, logits.data()}};
  if (mtp) {
    // Row i: MTP of position i's final state with token i+1, fed in the same
    // chunks as the main model; the last row has no next token and stays 0.
    mtp_logits.assign(size_t(n * V), 0.0f);
    auto run_mtp = [&](int64_t begin, int64_t len) {
      len = std::min(len, n - 1 - begin);
      if (len > 0)
        model->forward_mtp(state, hc.data() + begin * W, tokens.data() + begin + 1, len, mtp_logits.data() + begin * V);
    };
    for (int64_t b = 0; b < prefill; b += chunk) run_mtp(b, std::min(chunk, prefill - b));
    for (int64_t b = prefill; b < n; ++b) run_mtp(b, 1);
    outputs.push_back({"mtp_logits", DType::F32, {n, V}, mtp_logits.data()});
  }
  std::vector<float> draft_logits, draft_confidence;
  std::vector<int32_t> draft_ids;
  if (dspark)
    write_dspark_drafts(*model, tokens, hidden, dspark_positions, outputs, draft_logits, draft_ids, draft_confidence);
  write_safetensors(out, outputs);
  return 0;
}

}  // namespace

void register_model_commands(CLI::App& app, int& exit_code) {
  struct LogitsArgs {
    std::string model, tokens, out;
    int64_t prefill = -1, chunk = 0;
    int threads = 0;
    bool mtp = false;
    std::string dspark;
  };
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* logits =
      app.add_subcommand("logits", "Compute logits for a token sequence and write them to a safetensors file");
  logits->add_option("--model", args->model, "Checkpoint directory")->required();
  logits->add_option("--tokens", args->tokens, "Comma-separated token ids, or @FILE")->required();
  logits->add_option("--out", args->out, "Output safetensors file")->required();
  logits->add_option("--prefill", args->prefill, "Tokens prefilled before one-token decode (default: all)")
      ->check(CLI::NonNegativeNumber);
  logits->add_option("--chunk-size", args->chunk, "Prefill chunk size (default: all at once)")
      ->check(CLI::PositiveNumber);
  logits
      ->add_option("--threads", args->threads,
                   "Compute threads (default: the CPUs this process may use, cgroup quota included)")
      ->check(CLI::PositiveNumber);
  logits->add_flag("--mtp", args->mtp, "Also write mtp_logits from the MTP block");
  logits->add_option("--dspark", args->dspark,
                     "Comma-separated positions p, or @FILE: also write the DSpark draft after each p (token p+1 as "
                     "its first input): dspark_logits [P, block, vocab], dspark_ids [P, block+1], "
                     "dspark_confidence [P, block]");
  logits->callback([args, &exit_code] {
    try {
      exit_code =
          run_logits(args->model, args->tokens, args->out, args->prefill, args->chunk, args->threads, args->mtp,
                     args->dspark);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsv4 logits: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
