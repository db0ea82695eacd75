// Subcommand registration for the `dsv4` executable. Each area of the project
// (model, text, server, bench) registers its own subcommands so that the
// executable stays a thin dispatcher.
#pragma once
#include <CLI/CLI.hpp>

namespace dsv4::tools {

// Each register function adds subcommands to `app`; the subcommand's callback
// stores its exit status into `exit_code`.
void register_model_commands(CLI::App& app, int& exit_code);
void register_text_commands(CLI::App& app, int& exit_code);
void register_bench_command(CLI::App& app, int& exit_code);
void register_make_model_command(CLI::App& app, int& exit_code);
void register_serve_command(CLI::App& app, int& exit_code);
void register_bench_serve_command(CLI::App& app, int& exit_code);
void register_token_map_command(CLI::App& app, int& exit_code);

}  // namespace dsv4::tools
