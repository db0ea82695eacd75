// `dsv4 bench-serve --multi-turn`: an agentic multi-turn trace in the style of
// SGLang's benchmark/hicache/bench_multiturn.py (same flag names where they
// exist), for measuring the prefix cache.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace dsv4::tools {

struct MultiTurnArgs {
  bool enabled = false;
  int64_t num_clients = 4, num_rounds = 8, max_parallel = 1;
  int64_t system_prompt_len = 2048, tool_schema_len = 1024, num_tools = 8;
  int64_t request_length = 256, sub_question_input_length = 0, output_length = 16;
  bool enable_round_barrier = false, thinking = false;
  std::string ready_queue_policy = "fifo";
  std::string label, compare_csv, compare_label, output_requests_csv, tag;

  // From bench-serve's common flags.
  std::string root, model, request_rate = "inf";
  uint64_t seed = 1;
  double temperature = 0, timeout_s = 3600;
  bool ignore_eos = true;
  int64_t warmup_requests = 1;
  std::string output_csv, output_svg, output_json;
};

// Adds the multi-turn flags to the bench-serve subcommand.
void add_multiturn_options(CLI::App* cmd, MultiTurnArgs& m);

// Runs the trace against the server at m.root; returns the exit status.
int run_multiturn(const MultiTurnArgs& m);

}  // namespace dsv4::tools
