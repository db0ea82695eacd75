#include "load_mode_flags.h"

#include "core/error.h"

namespace dsv4::tools {

void add_load_mode_flags(CLI::App* cmd, LoadModeFlags* flags) {
  cmd->add_option("--load-mode", flags->load_mode,
                  "How the weights are held: auto (copy them into huge-page memory when they and the caches fit in "
                  "90% of the memory available, else map the files), mmap (map the checkpoint files: 4 KiB pages, "
                  "quick to load, slower decode) or none (copy; llama.cpp's names)")
      ->check(CLI::IsMember({"auto", "mmap", "none"}));
  cmd->add_flag("--no-mmap", flags->no_mmap, "Copy the weights into huge-page memory: --load-mode none");
}

LoadMode resolve_load_mode(const LoadModeFlags& flags) {
  LoadMode mode = LoadMode::Auto;
  if (!parse_load_mode(flags.load_mode, &mode)) throw Error("--load-mode: auto, mmap or none");
  if (flags.no_mmap) {
    if (mode == LoadMode::Mmap) throw Error("--no-mmap contradicts --load-mode mmap");
    mode = LoadMode::Copy;
  }
  return mode;
}

std::string describe_residency(const ResidencyChoice& choice) {
  return std::string(choice.residency == FileResidency::Copied ? "copied into huge-page memory"
                                                               : "mapped from the checkpoint files") +
         " (" + choice.why + ")";
}

}  // namespace dsv4::tools
