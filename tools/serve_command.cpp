// `dsv4 serve`: the OpenAI-compatible server, launched with SGLang's flags.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "engram_setup.h"
#include "load_mode_flags.h"
#include "kernels/backend.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "kernels/cpu/linear.h"
#include "model/fingerprint.h"
#include "model/synthetic.h"
#include "server/server.h"
#include "text/chat_encoder.h"
#include "text/tokenizer.h"

namespace dsv4::tools {
namespace fs = std::filesystem;

void load_progress(int64_t done, int64_t total);
std::string default_tokenizer_dir();
std::string default_model_dir();

namespace {

// The signal handler only sets a flag; a watcher thread does the shutdown
// (abort in-flight requests, stop the listener), which is not signal-safe.
std::atomic<bool> g_stop_requested{false};
void on_signal(int) { g_stop_requested = true; }

struct ServeArgs {
  std::string model_path, tokenizer_path, host = "127.0.0.1", api_key, served_model_name;
  int port = 30000;
  int64_t context_length = 0, max_running_requests = 64, max_total_tokens = 0, chunked_prefill_size = 2048;
  int64_t max_prefill_tokens = 0, max_queued_requests = 1024;
  std::string reasoning_parser, tool_call_parser, log_level = "info", schedule_policy = "fcfs";
  bool deterministic = false, disable_radix_cache = false, hierarchical_cache = false;
  LoadModeFlags load_mode;
  bool enable_cache_report = false, clamp_max_tokens = false, bounded_replay = false;
  std::string numerics = "auto";
  int64_t grammar_max_string_chars = 0;
  bool allow_special_tokens_in_content = false;
  std::vector<std::string> allowed_origins;
  int64_t max_request_bytes = 32 << 20;
  int64_t responses_store_size = 1024, responses_store_mb = 256;
  HttpLimits http;
  double hicache_size_gb = 0, hicache_ratio = 0;
  std::string hicache_write_policy = "write_through", hicache_prefetch_policy = "best_effort";
  std::string hicache_storage_dir, hicache_extra_config, hicache_io_backend, hicache_mem_layout;
  int64_t page_size = 256, hicache_checkpoint_interval = 2048;
  uint64_t random_seed = 0;
  int threads = 0;
  double prefix_cache_gb = 1.0;
  std::string speculative_algorithm, hicache_storage_backend, speculative_token_map;
  // Speculative decoding (SGLang's flags); -1: not given.
  int64_t speculative_num_steps = -1, speculative_eagle_topk = -1, speculative_num_draft_tokens = -1;
  int64_t speculative_dspark_block_size = -1;
  int64_t ngram_min_match = 1, ngram_max_match = 12, ngram_min_bfs = 1, ngram_max_bfs = 10;
  std::string ngram_match_type = "BFS";
  bool disable_speculative_bypass = false;
  std::vector<std::string> argv;
};

// The embedded smoke-test model: generated once, deterministically.
std::string ensure_default_model() {
  std::string dir = default_model_dir();
  if (fs::exists(fs::path(dir) / "config.json") && fs::exists(fs::path(dir) / "model.safetensors")) return dir;
  std::fprintf(stderr, "creating the embedded smoke-test model in %s (random weights, real tokenizer)\n", dir.c_str());
  std::string tmp = dir + ".partial";
  fs::remove_all(tmp);
  SyntheticSpec spec;  // preset "smoke"
  write_synthetic_checkpoint(spec, tmp, default_tokenizer_dir(), load_progress);
  fs::remove_all(dir);
  fs::create_directories(fs::path(dir).parent_path());
  fs::rename(tmp, dir);
  return dir;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return buf;
}

// The official checkpoints by shape; anything else (the synthetic test
// models, a sliced checkpoint) is named by its architecture.
std::string model_variant(const ModelConfig& c) {
  const bool dspark = c.dspark_stages > 0;
  if (c.dim == 4096 && c.n_routed_experts == 256)
    return dspark ? "DeepSeek-V4-Flash-0731-shaped" : "DeepSeek-V4-Flash-shaped";
  if (c.dim == 7168 && c.n_routed_experts == 384)
    return dspark ? "DeepSeek-V4-Pro-0813-shaped" : "DeepSeek-V4-Pro-shaped";
  if (c.v41 && c.dim == 5120 && c.n_routed_experts == 384) return "DeepSeek-V4.1-Flash-shaped";
  return c.architecture + " (custom shape)";
}

// Main layers by attention kind: window-only (ratio 0), CSA (ratio 4), HCA
// (ratio 128), as counts.
std::string layer_kinds(const ModelConfig& c) {
  std::map<int64_t, int64_t> by_ratio;
  for (int64_t l = 0; l < c.n_layers; ++l) ++by_ratio[c.ratio(l)];
  std::string out;
  for (auto& [ratio, count] : by_ratio) {
    if (!out.empty()) out += ", ";
    out += std::to_string(count) + (ratio == 0 ? " window-only" : " ratio-" + std::to_string(ratio));
  }
  return out;
}

// The only place the server names the kernel path, so that a move of the
// dispatch API touches one line. "why" tells a CPU-chosen path from one
// forced (or asked for and refused) through DSV4_KERNELS.
std::string kernel_path_line() {
  const std::string active = kernel_isa_name(active_kernel_isa());
  const std::string cpu = detect_cpu_features().describe();
  const char* env = std::getenv("DSV4_KERNELS");
  std::string why;
  if (!env || !*env)
    why = "the best this CPU supports; DSV4_KERNELS unset";
  else if (active == env)
    why = std::string("forced by DSV4_KERNELS=") + env;
  else
    why = std::string("DSV4_KERNELS=") + env +
          " not applied (not scalar, avx2 or avx512, or beyond this CPU); the best this CPU supports";
  std::string line = "kernels: " + active + " (" + why + "; CPU: " + cpu + ")";
  if (active_kernel_isa() == KernelIsa::Avx512 && bf16_dot_supported())
    line += bf16_dot_enabled() ? "; prefill products with AVX512-BF16 (same bits)" : "; AVX512-BF16 not used";
  return line;
}

// What the engine decided, one topic a line, before the "serving" line:
// enough to tell from a log which model shape, memory and limits a server
// ran with.
void print_startup_summary(const Model& model, const Engine& engine, const ServeArgs& a) {
  const ModelConfig& c = model.config();
  const std::string draft_head = c.dspark_stages > 0 ? std::to_string(c.dspark_stages) + " DSpark stages"
                                                    : std::to_string(c.n_mtp_layers) + " MTP";
  std::fprintf(stderr,
               "model: %s, %lld layers (%s) + %s, dim %lld, %lld heads x %lld, "
               "%lld routed experts (%lld active) + %lld shared, vocab %lld, context up to %lld tokens\n",
               model_variant(c).c_str(), (long long)c.n_layers, layer_kinds(c).c_str(), draft_head.c_str(),
               (long long)c.dim, (long long)c.n_heads, (long long)c.head_dim, (long long)c.n_routed_experts,
               (long long)c.n_activated_experts, (long long)c.n_shared_experts, (long long)c.vocab_size,
               (long long)c.max_position_embeddings);
  const std::string formats =
      c.fp8_weights ? std::string("fp8 linears, ") + (c.expert_dtype.empty() ? "fp8" : c.expert_dtype) + " experts"
                    : std::string("bf16");
  std::fprintf(stderr, "weights: %s (%s), %s\n", gib(model.weights().total_bytes).c_str(), formats.c_str(),
               describe_residency(model.residency()).c_str());
  if (model.weights().converted_bytes > 0)
    std::fprintf(stderr,
                 "weights: %s of 32x32-block FP8 matrices expanded to BF16 in memory (exact; the FP8 kernels read "
                 "128x128 blocks)\n",
                 gib(model.weights().converted_bytes).c_str());
  std::fprintf(stderr, "%s\n", kernel_path_line().c_str());
  if (model.backend().exact())
    std::fprintf(stderr,
                 "numerics: exact (products exact, sums in double: the V4.1 reference's roundings are reproduced; "
                 "slower than the fp32-lane kernels; --numerics fast trades that for speed)\n");
  else if (c.v41)
    std::fprintf(stderr, "numerics: fast (fp32 lanes, --numerics fast): logits may differ from the V4.1 reference "
                         "where it rounds a value near a midpoint\n");
  if (c.v41) {
    std::string roles = "kv sources";
    for (int64_t l : c.kv_source_layer_ids) roles += " " + std::to_string(l);
    roles += ", index sources";
    for (int64_t l : c.index_source_layer_ids) roles += " " + std::to_string(l);
    if (c.candidate_source_layer_id >= 0)
      roles += ", candidate source " + std::to_string(c.candidate_source_layer_id) + " (top " +
               std::to_string(c.candidate_topk_blocks) + " blocks of " + std::to_string(c.candidate_block_size) + ")";
    std::string engram = "Engram before layers";
    for (int64_t l : c.engram_layer_ids) engram += " " + std::to_string(l);
    std::fprintf(stderr, "V4.1 layout: %s; %s\n", roles.c_str(), c.has_engram() ? engram.c_str() : "no Engram");
  }
  if (model.weights().skipped_vision_tensors > 0 || c.has_vision) {
    std::fprintf(stderr, "vision: %lld vision-tower tensors (%s) skipped; serving text only\n",
                 (long long)model.weights().skipped_vision_tensors, gib(model.weights().skipped_vision_bytes).c_str());
  }
  const EngineOptions& eo = engine.options();
  const std::string budget = eo.max_total_tokens > 0 ? std::to_string(eo.max_total_tokens) + " tokens" : "unlimited";
  std::fprintf(stderr, "memory: running-request token budget (max_total_tokens) %s\n", budget.c_str());
  const HiCacheOptions& h = eo.hicache;
  if (eo.prefix_cache_bytes <= 0) {
    std::fprintf(stderr, "prefix cache: off (--disable-radix-cache or --prefix-cache-gb 0)\n");
  } else {
    std::string tiers = "L1 " + gib(eo.prefix_cache_bytes);
    if (h.host_bytes > 0) tiers += ", L2 (host) " + gib(h.host_bytes) + ", " + a.hicache_write_policy;
    const HiCacheMetrics m = engine.metrics().hicache;
    if (m.storage_configured)
      tiers += ", L3 file " + h.storage_dir + (m.storage.enabled ? " (" + std::to_string(m.storage.records) +
                                                                      " records, prefetch " + a.hicache_prefetch_policy + ")"
                                                                : " (off: see the warning above)");
    std::fprintf(stderr, "prefix cache: radix pages of %lld tokens, checkpoints every %lld prompt tokens; %s\n",
                 (long long)h.page_tokens, (long long)h.checkpoint_interval, tiers.c_str());
  }
  const std::string chunk = eo.chunked_prefill_size > 0 ? std::to_string(eo.chunked_prefill_size) + " tokens" : "off";
  std::fprintf(stderr, "limits: context %lld tokens, %lld running requests, %lld queued, chunked prefill %s per step\n",
               (long long)engine.context_length(), (long long)eo.max_running_requests,
               (long long)eo.max_queued_requests, chunk.c_str());
}

// SGLang's speculative flags resolved into the engine's options, with the
// refusals a user needs to hear at startup rather than as slow decoding.
SpeculativeOptions speculative_options(const ServeArgs& a, const Model& model) {
  SpeculativeOptions o;
  o.algorithm = parse_speculative_algorithm(a.speculative_algorithm);
  o.auto_bypass = !a.disable_speculative_bypass;
  if (const char* simulate = std::getenv("SGLANG_SIMULATE_ACC_LEN"); simulate && *simulate) {
    char* end = nullptr;
    o.simulate_accept_len = std::strtod(simulate, &end);
    if (*end != '\0' || !(o.simulate_accept_len >= 1.0))
      throw Error(std::string("SGLANG_SIMULATE_ACC_LEN=") + simulate + ": expected a number >= 1");
  }
  if (o.algorithm == SpeculativeAlgorithm::None) {
    if (o.simulate_accept_len > 0)
      std::fprintf(stderr, "note: SGLANG_SIMULATE_ACC_LEN has no effect without --speculative-algorithm\n");
    o.simulate_accept_len = 0;
    return o;
  }
  if (a.speculative_eagle_topk > 1)
    throw Error("--speculative-eagle-topk " + std::to_string(a.speculative_eagle_topk) +
                ": only 1 (a chain of drafts) is supported; tree drafting is not implemented");
  const bool dspark = model.weights().dspark.has_value();
  if (o.algorithm == SpeculativeAlgorithm::Dspark) {
    if (!dspark)
      throw Error(model.has_mtp()
                      ? "--speculative-algorithm DSPARK: this checkpoint has no DSpark draft head (no dspark_* config "
                        "fields); its MTP head drafts with --speculative-algorithm EAGLE"
                      : "--speculative-algorithm DSPARK: this checkpoint has no DSpark draft head; use NGRAM");
    o.dspark_block =
        a.speculative_dspark_block_size > 0 ? a.speculative_dspark_block_size : model.config().dspark_block_size;
    if (o.dspark_block > 16) throw Error("--speculative-dspark-block-size must be at most 16");
    o.num_draft_tokens = o.dspark_block + 1;  // SGLang's verify window
    if (a.speculative_num_steps > 0 || a.speculative_eagle_topk > 0)
      std::fprintf(stderr, "note: --speculative-num-steps / --speculative-eagle-topk have no effect with DSPARK\n");
    if (a.speculative_num_draft_tokens > 0 && a.speculative_num_draft_tokens != o.num_draft_tokens)
      std::fprintf(stderr, "note: DSPARK verifies block + 1 = %lld tokens; --speculative-num-draft-tokens ignored\n",
                   (long long)o.num_draft_tokens);
    return o;
  }
  if (o.algorithm == SpeculativeAlgorithm::Eagle) {
    // SGLang accepts EAGLE here and then accepts nothing: say what to use.
    if (dspark)
      throw Error(
          "--speculative-algorithm EAGLE: this checkpoint bundles a DSpark draft head, not an MTP head "
          "(its mtp.* tensors are DSpark stages): draft with --speculative-algorithm DSPARK");
    if (!model.has_mtp())
      throw Error(
          "--speculative-algorithm EAGLE drafts with the checkpoint's MTP head, and this checkpoint has none "
          "(num_nextn_predict_layers = 0); use --speculative-algorithm NGRAM");
    o.num_steps = a.speculative_num_steps > 0 ? a.speculative_num_steps : 3;
    // SGLang's chain: num_draft_tokens = num_steps + 1 with top-k 1.
    o.num_draft_tokens = a.speculative_num_draft_tokens > 0 ? std::min(a.speculative_num_draft_tokens, o.num_steps + 1)
                                                            : o.num_steps + 1;
    if (a.speculative_num_steps > 16) throw Error("--speculative-num-steps must be at most 16");
  } else {
    if (a.ngram_min_match < 1 || a.ngram_max_match < a.ngram_min_match)
      throw Error("--speculative-ngram-min/max-match-window-size: need 1 <= min <= max");
    o.ngram_min_match = a.ngram_min_match;
    o.ngram_max_match = a.ngram_max_match;
    // SGLang's default: as many drafts as the longest match window.
    o.num_draft_tokens = a.speculative_num_draft_tokens > 0 ? a.speculative_num_draft_tokens : a.ngram_max_match;
    if (a.ngram_match_type != "BFS" && a.ngram_match_type != "PROB")
      throw Error("--speculative-ngram-match-type must be BFS or PROB");
    if (a.ngram_max_bfs > 1 || a.ngram_match_type != "BFS")
      std::fprintf(stderr,
                   "note: NGRAM drafts one chain (the most recent longest match); --speculative-ngram-max-bfs-breadth "
                   "and --speculative-ngram-match-type PROB have no effect\n");
  }
  if (o.num_draft_tokens < 2 || o.num_draft_tokens > 64)
    throw Error("--speculative-num-draft-tokens must be in [2, 64] (the last sampled token plus its drafts)");
  return o;
}

void print_speculative_summary(const Model& model, const SpeculativeOptions& o) {
  const ModelConfig& c = model.config();
  std::string bundled = model.has_mtp() ? "an MTP head (EAGLE)" : "no draft head";
  if (model.weights().dspark) {
    std::string targets;
    for (int64_t id : c.dspark_target_layer_ids) targets += (targets.empty() ? "" : ",") + std::to_string(id);
    bundled = "a DSpark head (" + std::to_string(c.dspark_stages) + " stages, block " +
              std::to_string(c.dspark_block_size) + ", reading layers " + targets + "; --speculative-algorithm DSPARK)";
  }
  if (o.algorithm == SpeculativeAlgorithm::None) {
    std::fprintf(stderr, "speculative decoding: off (the checkpoint bundles %s)\n", bundled.c_str());
    return;
  }
  std::fprintf(stderr, "speculative decoding: %s, up to %lld drafts per step%s; the checkpoint bundles %s; %s\n",
               speculative_algorithm_name(o.algorithm), (long long)(o.num_draft_tokens - 1),
               o.algorithm == SpeculativeAlgorithm::Eagle    ? " (MTP top-1 chain)"
               : o.algorithm == SpeculativeAlgorithm::Dspark ? " (one DSpark block)"
                                                             : " (prompt lookup)",
               bundled.c_str(),
               o.auto_bypass ? "bypassed at batch sizes where it measures slower than plain decoding"
                             : "never bypassed (--disable-speculative-bypass)");
  if (!model.draft_vocab().empty())
    std::fprintf(stderr,
                 "draft vocabulary: the MTP head scores %zu of %lld tokens (--speculative-token-map): %.1f%% of the LM "
                 "head per draft step; drafts outside it are never proposed, the output is unchanged\n",
                 model.draft_vocab().size(), (long long)c.vocab_size,
                 100.0 * double(model.draft_vocab().size()) / double(c.vocab_size));
  if (o.simulate_accept_len > 0)
    std::fprintf(stderr,
                 "WARNING: SGLANG_SIMULATE_ACC_LEN=%.2f: verification accepts %.2f tokens per step whatever the model "
                 "says. For benchmarks only: THE OUTPUT IS NOT THE MODEL'S.\n",
                 o.simulate_accept_len, o.simulate_accept_len);
}

// SGLang's HiCache flags resolved (docs/hicache.md): L1 is --prefix-cache-gb,
// L2 --hicache-size GB or --hicache-ratio times L1, L3 the file backend.
HiCacheOptions hicache_options(const ServeArgs& a, const std::string& model_dir, int64_t device_bytes) {
  HiCacheOptions h;
  h.page_tokens = a.page_size;
  h.checkpoint_interval = a.hicache_checkpoint_interval;
  if (h.page_tokens <= 0) throw Error("--page-size must be positive");
  if (h.checkpoint_interval % h.page_tokens)
    throw Error("--hicache-checkpoint-interval must be a multiple of --page-size (" + std::to_string(h.page_tokens) +
                ")");
  h.write_policy = parse_write_policy(a.hicache_write_policy);
  h.prefetch_policy = parse_prefetch_policy(a.hicache_prefetch_policy);
  h.warn = [](const std::string& line) { std::fprintf(stderr, "warning: %s\n", line.c_str()); };
  if (!a.hicache_extra_config.empty()) {
    nlohmann::json extra;
    try {
      extra = nlohmann::json::parse(a.hicache_extra_config);
    } catch (const std::exception& e) {
      throw Error(std::string("--hicache-storage-backend-extra-config: not JSON: ") + e.what());
    }
    if (!extra.is_object()) throw Error("--hicache-storage-backend-extra-config must be a JSON object");
    for (auto& [key, value] : extra.items()) {
      if (!value.is_number()) {
        std::fprintf(stderr, "note: --hicache-storage-backend-extra-config: %s has no effect here\n", key.c_str());
        continue;
      }
      if (key == "prefetch_threshold")
        h.prefetch_threshold = value.get<int64_t>();
      else if (key == "prefetch_timeout_base")
        h.prefetch_timeout_base = value.get<double>();
      else if (key == "prefetch_timeout_per_ki_token")
        h.prefetch_timeout_per_ki_token = value.get<double>();
      else
        std::fprintf(stderr, "note: --hicache-storage-backend-extra-config: %s has no effect here\n", key.c_str());
    }
  }
  if (!a.hierarchical_cache || device_bytes <= 0) {
    if (!a.hicache_storage_backend.empty())
      throw Error("--hicache-storage-backend needs --enable-hierarchical-cache (and the radix cache on)");
    return h;
  }
  if (a.hicache_size_gb > 0) {
    h.host_bytes = int64_t(a.hicache_size_gb * double(int64_t(1) << 30));
  } else {
    const double ratio = a.hicache_ratio > 0 ? a.hicache_ratio : 2.0;  // SGLang's default
    if (ratio <= 1.0) throw Error("--hicache-ratio must be greater than 1 (the host tier is larger than L1)");
    h.host_bytes = int64_t(ratio * double(device_bytes));
  }
  if (a.hicache_storage_backend.empty()) return h;
  if (a.hicache_storage_backend != "file")
    throw Error("--hicache-storage-backend " + a.hicache_storage_backend +
                ": only the file backend is supported (mooncake, hf3fs, nixl, aibrix and dynamic need their "
                "services)");
  h.storage_dir = a.hicache_storage_dir;
  if (h.storage_dir.empty()) {
    const char* env = std::getenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR");
    h.storage_dir = env && *env ? env : "/tmp/hicache";
  }
  h.model_identity = model_fingerprint(model_dir);
  return h;
}

int run_serve(ServeArgs& a) {
  if (a.schedule_policy != "fcfs")
    throw Error("--schedule-policy " + a.schedule_policy + " is not supported (fcfs only)");
  set_compute_threads(a.threads);
  const std::string refusal = pinning_refusal();
  std::fprintf(stderr, "compute threads: %d (CPUs usable by this process: %d), %s\n", compute_threads(),
               usable_cpu_count(), refusal.empty() ? "pinned one CPU each" : refusal.c_str());
  const bool embedded = a.model_path.empty();
  std::string model_dir = embedded ? ensure_default_model() : a.model_path;
  if (embedded)
    std::fprintf(stderr,
                 "serving the embedded SMOKE-TEST model: random weights, output is gibberish; "
                 "pass --model-path for a real checkpoint\n");
  // The caches' memory counts beside the weights when --load-mode auto
  // decides whether to copy them.
  const int64_t prefix_cache_bytes =
      a.disable_radix_cache ? 0 : int64_t(a.prefix_cache_gb * double(int64_t(1) << 30));
  HiCacheOptions hicache = hicache_options(a, model_dir, prefix_cache_bytes);
  LoadOptions load_options;
  load_options.progress = load_progress;
  load_options.load_mode = resolve_load_mode(a.load_mode);
  load_options.reserved_bytes = prefix_cache_bytes + hicache.host_bytes;
  load_options.engram_token_map = engram_token_map_for(model_dir, a.tokenizer_path);
  if (a.numerics != "auto") load_options.backend = a.numerics == "exact" ? &exact_backend() : &default_backend();
  auto model = std::shared_ptr<Model>(Model::load(model_dir, load_options));
  std::string tok_path = a.tokenizer_path.empty() ? (fs::path(model_dir) / "tokenizer.json").string()
                                                  : (fs::is_directory(a.tokenizer_path)
                                                         ? (fs::path(a.tokenizer_path) / "tokenizer.json").string()
                                                         : a.tokenizer_path);
  if (!fs::exists(tok_path)) throw Error("no tokenizer.json in " + model_dir + " (use --tokenizer-path)");
  auto tokenizer = text::Tokenizer::from_file(tok_path);
  nlohmann::ordered_json config;
  {
    std::ifstream in(fs::path(model_dir) / "config.json");
    config = nlohmann::ordered_json::parse(in);
  }
  auto profile = text::select_profile(config, a.tool_call_parser, model_dir);

  EngineOptions eo;
  eo.max_running_requests = a.max_running_requests;
  eo.max_queued_requests = a.max_queued_requests;
  eo.chunked_prefill_size = a.chunked_prefill_size;
  if (a.max_prefill_tokens > 0 && (eo.chunked_prefill_size <= 0 || a.max_prefill_tokens < eo.chunked_prefill_size))
    eo.chunked_prefill_size = a.max_prefill_tokens;
  eo.context_length = a.context_length;
  eo.max_total_tokens = a.max_total_tokens;
  eo.prefix_cache_bytes = prefix_cache_bytes;
  eo.hicache = std::move(hicache);
  eo.pin_threads = true;
  eo.speculative = speculative_options(a, *model);
  if (!a.speculative_token_map.empty()) {
    if (eo.speculative.algorithm != SpeculativeAlgorithm::Eagle)
      throw Error(
          "--speculative-token-map narrows the MTP head's draft vocabulary: it needs --speculative-algorithm "
          "EAGLE");
    model->set_draft_vocab(load_token_map(a.speculative_token_map));
  }
  eo.bounded_replay = a.bounded_replay;
  // SGLang's periodic "Decode batch" line, at --log-level info or debug.
  if (a.log_level == "info" || a.log_level == "debug")
    eo.log = [](const std::string& line) { std::fprintf(stderr, "[dsv4 info] %s\n", line.c_str()); };
  auto engine = std::make_shared<Engine>(model, eo);
  print_startup_summary(*model, *engine, a);
  print_speculative_summary(*model, eo.speculative);
  if (a.bounded_replay)
    std::fprintf(stderr,
                 "bounded replay: on: prompts run layers %lld-%lld on their last %lld tokens only (not the logits of "
                 "a full prefill; prompt logprobs refused)\n",
                 (long long)model->replay_layer(), (long long)model->config().n_layers - 1,
                 (long long)model->config().window);

  ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.bounded_replay = a.bounded_replay;
  so.served_model_name = a.served_model_name.empty()
                             ? (embedded ? "dsv4-smoke" : fs::path(model_dir).filename().string())
                             : a.served_model_name;
  so.model_path = model_dir;
  so.reasoning_parser = a.reasoning_parser;
  so.tool_call_parser = a.tool_call_parser;
  so.random_seed = a.random_seed;
  so.deterministic = a.deterministic;
  so.allow_special_tokens_in_content = a.allow_special_tokens_in_content;
  so.log_level = a.log_level;
  so.enable_cache_report = a.enable_cache_report;
  so.clamp_max_tokens = a.clamp_max_tokens;
  so.grammar_max_string_chars = a.grammar_max_string_chars;
  so.responses_store_size = a.responses_store_size;
  so.responses_store_bytes = a.responses_store_mb << 20;
  so.server_args = a.argv;
  so.allowed_origins = a.allowed_origins;
  so.max_request_bytes = a.max_request_bytes;
  so.http = a.http;
  Server server(engine, tokenizer, profile, so);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    while (!finished) {
      if (g_stop_requested) {
        std::fprintf(stderr, "shutting down: aborting %lld request(s)\n", (long long)engine->abort_all());
        server.stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  bool ok = server.run();
  finished = true;
  watcher.join();
  if (!ok && !g_stop_requested)
    throw Error("cannot listen on " + a.host + ":" + std::to_string(a.port) + " (port in use?)");
  return 0;
}

}  // namespace

void register_serve_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible server (SGLang-style flags)");
  cmd->add_option("--model-path,--model", a->model_path,
                  "Checkpoint directory (default: the embedded smoke-test model)");
  cmd->add_option("--tokenizer-path", a->tokenizer_path,
                  "tokenizer.json or its directory (default: in the model directory)");
  cmd->add_option("--host", a->host, "Address to listen on");
  cmd->add_option("--port", a->port, "Port (0 picks a free one)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->api_key, "Require Authorization: Bearer KEY");
  cmd->add_option("--served-model-name", a->served_model_name, "Model name reported by the API");
  cmd->add_option("--context-length", a->context_length, "Maximum prompt + output tokens per request")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-running-requests", a->max_running_requests, "Requests decoded concurrently")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-queued-requests", a->max_queued_requests, "Waiting requests before 503 + Retry-After")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-total-tokens", a->max_total_tokens,
                  "Token budget (prompt + max output) of the running requests")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--chunked-prefill-size", a->chunked_prefill_size,
                  "Prefill tokens per scheduler step (-1: no chunking)");
  cmd->add_option("--max-prefill-tokens", a->max_prefill_tokens, "Upper bound of prefill tokens per step")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--reasoning-parser", a->reasoning_parser, "deepseek-v4 | deepseek-v41 | none")
      ->check(CLI::IsMember({"deepseek-v4", "deepseek-v41", "none", "auto"}));
  cmd->add_option("--tool-call-parser", a->tool_call_parser, "deepseekv4 | deepseekv41 | none")
      ->check(CLI::IsMember({"deepseekv4", "deepseekv41", "none", "auto"}));
  cmd->add_flag("--enable-deterministic-inference", a->deterministic,
                "Requests without a seed use seed 42 (outputs are batch-invariant in any case)");
  cmd->add_option("--random-seed", a->random_seed, "Base of the per-request seeds");
  cmd->add_flag("--allow-special-tokens-in-content", a->allow_special_tokens_in_content,
                "Tokenize special-token text (<｜end▁of▁sentence｜>, <｜User｜>, <think>, ｜DSML｜...) inside user, "
                "tool and assistant-history content as control tokens, as SGLang does. Default: such text is "
                "encoded as plain text, so message content cannot forge turns or tool calls "
                "(docs/security-special-tokens.md)");
  cmd->add_option("--log-level", a->log_level, "debug | info | warning | error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
  cmd->add_flag("--enable-cache-report", a->enable_cache_report,
                "Report usage.prompt_tokens_details.cached_tokens (and /generate's cached_tokens); off by default, "
                "as the count tells a client whether others recently sent the same prompt prefix");
  cmd->add_flag("--clamp-max-tokens", a->clamp_max_tokens,
                "Restore the old clamping: a max_tokens that does not fit in the context after the prompt is cut "
                "to fit instead of answering 400 (as SGLang and vLLM do)");
  cmd->add_option("--grammar-max-string-chars", a->grammar_max_string_chars,
                  "Constrained JSON (response_format, forced tool calls): strings without a maxLength hold at most "
                  "this many characters; 0 (default): unlimited. Bounds generation by a model that never closes a "
                  "string")
      ->check(CLI::Range(int64_t(0), int64_t(10000)));
  cmd->add_option("--responses-store-size", a->responses_store_size,
                  "Finished /v1/responses responses kept for GET and previous_response_id (least recently used "
                  "evicted first; 0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--responses-store-mb", a->responses_store_mb,
                  "Memory budget of that store in MiB (its responses' and conversations' JSON text)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  cmd->add_option("--schedule-policy", a->schedule_policy, "fcfs");
  cmd->add_flag("--disable-radix-cache", a->disable_radix_cache, "Disable prefix reuse");
  cmd->add_option("--numerics", a->numerics,
                  "auto (exact for DeepSeek-V4.1, whose reference roundings need it; fast otherwise), exact (sums in "
                  "double: slower) or fast (fp32 lanes: V4.1 may then round a value near a midpoint the other way "
                  "than the reference, docs/v41.md)")
      ->check(CLI::IsMember({"auto", "exact", "fast"}));
  cmd->add_flag("--enable-decoder-swa-bounded-replay", a->bounded_replay,
                "DeepSeek-V4.1: prefill runs the late layers (from the ratio-1 KV source on) on each prompt's last "
                "128 tokens only, sharing that source's compressed rows: faster prefill, logits not identical to a "
                "full prefill, no prompt logprobs (docs/v41.md)");
  add_load_mode_flags(cmd, &a->load_mode);
  // The prefix cache (docs/hicache.md).
  cmd->add_option("--prefix-cache-gb", a->prefix_cache_gb,
                  "The prefix cache's L1 tier in GB (the engine's working memory; default 1; 0: no cache)");
  cmd->add_flag("--enable-hierarchical-cache", a->hierarchical_cache,
                "HiCache: a host-memory tier (L2) under L1, and the storage tier with --hicache-storage-backend");
  cmd->add_option("--hicache-ratio", a->hicache_ratio, "L2 size as a multiple of L1 (> 1; default 2)");
  cmd->add_option("--hicache-size", a->hicache_size_gb, "L2 size in GB (overrides --hicache-ratio)");
  cmd->add_option("--hicache-write-policy", a->hicache_write_policy,
                  "write_through (copy down at insert) | write_through_selective (at a part's second hit) | "
                  "write_back (when evicted from the tier above)")
      ->check(CLI::IsMember({"write_through", "write_through_selective", "write_back"}));
  cmd->add_option("--hicache-storage-backend", a->hicache_storage_backend,
                  "file: the L3 tier, files in --hicache-storage-dir (or $SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, "
                  "or /tmp/hicache) reused after a restart");
  cmd->add_option("--hicache-storage-dir", a->hicache_storage_dir,
                  "Directory of the file backend (overrides $SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR)");
  cmd->add_option("--hicache-storage-prefetch-policy", a->hicache_prefetch_policy,
                  "best_effort (a request never waits for L3) | wait_complete (waits for its prefix to be read) | "
                  "timeout (waits up to prefetch_timeout_base + prefetch_timeout_per_ki_token per 1024 tokens)")
      ->check(CLI::IsMember({"best_effort", "wait_complete", "timeout"}));
  cmd->add_option("--hicache-storage-backend-extra-config", a->hicache_extra_config,
                  "JSON: prefetch_threshold (tokens, 256), prefetch_timeout_base (s, 1), "
                  "prefetch_timeout_per_ki_token (s, 0.25)");
  cmd->add_option("--hicache-io-backend", a->hicache_io_backend, "Accepted: no effect here (see the startup note)");
  cmd->add_option("--hicache-mem-layout", a->hicache_mem_layout, "Accepted: no effect here (see the startup note)");
  cmd->add_option("--page-size", a->page_size, "Tokens per radix-cache page (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--hicache-checkpoint-interval", a->hicache_checkpoint_interval,
                  "Checkpoints inside prompts every this many tokens, a multiple of --page-size (default 2048; 0: "
                  "only where prompts and requests end)")
      ->check(CLI::NonNegativeNumber);
  // Speculative decoding (docs/speculative.md).
  cmd->add_option("--speculative-algorithm", a->speculative_algorithm,
                  "EAGLE (the checkpoint's MTP head; NEXTN/MTP are aliases) or NGRAM (prompt lookup); DSPARK is "
                  "refused on checkpoints without a DSpark head");
  cmd->add_option("--speculative-num-steps", a->speculative_num_steps, "EAGLE: MTP steps chained per draft (3)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--speculative-eagle-topk", a->speculative_eagle_topk, "EAGLE: 1 (a chain; trees are refused)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--speculative-num-draft-tokens", a->speculative_num_draft_tokens,
                  "Tokens verified per step, the last sampled one included (EAGLE: num-steps + 1; NGRAM: "
                  "max-match-window-size)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--speculative-dspark-block-size", a->speculative_dspark_block_size, "DSPARK: drafted positions")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--speculative-token-map", a->speculative_token_map,
                  "EAGLE: the draft vocabulary (FR-Spec), a JSON array or a list of token ids: the MTP head scores "
                  "only these tokens (.pt maps: convert to JSON)");
  cmd->add_option("--speculative-ngram-min-match-window-size", a->ngram_min_match,
                  "NGRAM: shortest suffix matched (1)");
  cmd->add_option("--speculative-ngram-max-match-window-size", a->ngram_max_match,
                  "NGRAM: longest suffix matched (12)");
  cmd->add_option("--speculative-ngram-min-bfs-breadth", a->ngram_min_bfs, "NGRAM: accepted (one chain is drafted)");
  cmd->add_option("--speculative-ngram-max-bfs-breadth", a->ngram_max_bfs, "NGRAM: accepted (one chain is drafted)");
  cmd->add_option("--speculative-ngram-match-type", a->ngram_match_type, "NGRAM: BFS (PROB is accepted, no effect)");
  cmd->add_flag("--disable-speculative-bypass", a->disable_speculative_bypass,
                "Speculate at every batch size, even where it measures slower than plain decoding");
  // HTTP limits (docs: README, Security).
  cmd->add_option("--allowed-origins", a->allowed_origins,
                  "Origins whose web pages may call the API (CORS), or '*'; default: none without --api-key, "
                  "any with it")
      ->delimiter(',');
  cmd->add_option("--max-request-bytes", a->max_request_bytes, "Largest request body (413 past it)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-header-bytes", a->http.max_header_bytes, "Largest request header block (431 past it)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 30));
  cmd->add_option("--max-inflight-body-bytes", a->http.max_inflight_body_bytes,
                  "Request bodies being received at once, all clients (503 past it)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--http-header-timeout", a->http.header_timeout,
                  "Seconds for a request's header block, and for an idle kept-alive connection")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--http-body-timeout", a->http.body_timeout, "Seconds for a request body")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--max-connections", a->http.max_connections,
                  "Open connections; at the limit the oldest idle one is closed")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-connections-per-client", a->http.max_connections_per_client,
                  "Open connections per client address; at the limit its oldest idle one is closed")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-active-http-requests", a->http.max_active_requests,
                  "Requests being handled at once (503 past it)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", a->threads,
                  "Compute threads (default: the CPUs this process may use, cgroup quota included)")
      ->check(CLI::PositiveNumber);

  // GPU-only flags of the seed recipes: accepted with a warning, no effect.
  auto gpu_flags = std::make_shared<std::vector<std::string>>();
  auto ignored_values = std::make_shared<std::deque<std::string>>();  // stable addresses for CLI11
  for (const char* name : {"--tp",
                           "--tp-size",
                           "--tensor-parallel-size",
                           "--dp",
                           "--dp-size",
                           "--ep",
                           "--ep-size",
                           "--mem-fraction-static",
                           "--cuda-graph-max-bs",
                           "--cuda-graph-bs",
                           "--moe-runner-backend",
                           "--attention-backend",
                           "--kv-cache-dtype",
                           "--swa-full-tokens-ratio",
                           "--moe-a2a-backend",
                           "--deepep-mode",
                           "--disaggregation-transfer-backend",
                           "--speculative-ngram-branch-length",
                           "--speculative-ngram-capacity",
                           "--nnodes",
                           "--node-rank",
                           "--dist-init-addr"}) {
    std::string& value = ignored_values->emplace_back();
    cmd->add_option(name, value, "GPU-only: accepted and ignored")
        ->group("GPU-only (no effect)")
        ->each([gpu_flags, n = std::string(name)](const std::string&) { gpu_flags->push_back(n); });
  }
  for (const char* name :
       {"--disable-cuda-graph", "--enable-dp-attention", "--enable-dp-lm-head", "--trust-remote-code",
        "--enable-metrics", "--enable-prefill-delayer", "--enable-mixed-chunk", "--disable-overlap-schedule"}) {
    cmd->add_flag_callback(
           name, [gpu_flags, n = std::string(name)] { gpu_flags->push_back(n); }, "accepted; no effect here")
        ->group("Accepted (no effect)");
  }
  cmd->callback([a, gpu_flags, ignored_values, &exit_code, cmd] {
    for (auto& f : *gpu_flags)
      std::fprintf(stderr, "warning: %s has no effect on the dsv4.cpp CPU backend\n", f.c_str());
    if (!a->hicache_io_backend.empty())
      std::fprintf(stderr,
                   "note: --hicache-io-backend %s has no effect: L1 and L2 are both host memory on the CPU backend, "
                   "copied with memcpy\n",
                   a->hicache_io_backend.c_str());
    if (!a->hicache_mem_layout.empty())
      std::fprintf(stderr,
                   "note: --hicache-mem-layout %s has no effect: a radix page is stored as one object holding every "
                   "layer's rows (page-first), in every tier\n",
                   a->hicache_mem_layout.c_str());
    a->argv.clear();
    for (auto* o : cmd->get_options())
      if (o->count() > 0) a->argv.push_back(o->get_name(false, true) + "=" + o->as<std::string>());
    try {
      exit_code = run_serve(*a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsv4 serve: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
