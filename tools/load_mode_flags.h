// `--load-mode auto|mmap|none` and `--no-mmap` (llama.cpp's spellings; the
// latter its older name for `--load-mode none`), shared by `dsv4 serve` and
// `dsv4 bench`. What each mode does: io/residency.h.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "io/residency.h"

namespace dsv4::tools {

struct LoadModeFlags {
  std::string load_mode = "auto";
  bool no_mmap = false;
};

void add_load_mode_flags(CLI::App* cmd, LoadModeFlags* flags);
// The mode the flags ask for; throws if --no-mmap meets --load-mode mmap.
LoadMode resolve_load_mode(const LoadModeFlags& flags);
// "copied into huge-page memory (why)" or "mapped from the checkpoint files (why)".
std::string describe_residency(const ResidencyChoice& choice);

}  // namespace dsv4::tools
