#include <cstdio>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek-V4 inference engine"};
  app.require_subcommand(1);
  int exit_code = 0;
  dsv4::tools::register_model_commands(app, exit_code);
  dsv4::tools::register_text_commands(app, exit_code);
  dsv4::tools::register_bench_command(app, exit_code);
  dsv4::tools::register_make_model_command(app, exit_code);
  dsv4::tools::register_serve_command(app, exit_code);
  dsv4::tools::register_bench_serve_command(app, exit_code);
  dsv4::tools::register_token_map_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
