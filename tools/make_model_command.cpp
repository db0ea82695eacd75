// `dsv4 make-model`: writes a synthetic checkpoint in the official format.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/error.h"
#include "model/synthetic.h"

namespace dsv4::tools {

void load_progress(int64_t done, int64_t total);
std::string default_tokenizer_dir();

void register_make_model_command(CLI::App& app, int& exit_code) {
  struct Args {
    SyntheticSpec spec;
    std::string out, dtype = "fp8", tokenizer;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("make-model", "Write a random DeepSeek-V4-shaped checkpoint in the official format");
  cmd->add_option("--out", a->out, "Output directory")->required();
  cmd->add_option(
         "--preset", a->spec.preset,
         "smoke (tiny, real tokenizer), flash or pro (real shapes), flash-0731 or pro-0813 (with a DSpark head), "
         "v41 (DeepSeek-V4.1-Flash shapes) or smoke-v41 (tiny V4.1)")
      ->check(CLI::IsMember({"smoke", "flash", "pro", "flash-0731", "pro-0813", "smoke-0731", "v41", "smoke-v41"}));
  cmd->add_option("--layers", a->spec.layers,
                  "Main layers (V4: alternating CSA/HCA; V4.1: a ratio-2 then a ratio-1 group); default 2 (smoke-v41: 4)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--dtype", a->dtype, "fp8 (FP8 weights, FP4 experts, like the official files) or bf16")
      ->check(CLI::IsMember({"fp8", "bf16"}));
  cmd->add_option("--seed", a->spec.seed, "Random seed");
  cmd->add_option("--tokenizer-dir", a->tokenizer,
                  "Directory with tokenizer.json (default: the bundled DeepSeek-V4 tokenizer)");
  cmd->callback([a, &exit_code] {
    try {
      a->spec.fp8 = a->dtype == "fp8";
      std::string tok = a->tokenizer.empty() ? default_tokenizer_dir() : a->tokenizer;
      write_synthetic_checkpoint(a->spec, a->out, tok, load_progress);
      std::printf("wrote %s (preset %s, %s)\n", a->out.c_str(), a->spec.preset.c_str(), a->dtype.c_str());
      exit_code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsv4 make-model: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
