// Where bundled assets and the embedded default model live.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace dsv4::tools {
namespace fs = std::filesystem;

// The DeepSeek-V4 tokenizer shipped in assets/: $DSV4_TOKENIZER_DIR, next to
// the executable's tree, or the source tree this binary was built from.
std::string default_tokenizer_dir() {
  if (const char* env = std::getenv("DSV4_TOKENIZER_DIR")) return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path candidate :
       {exe.parent_path() / "../assets/dsv4-tokenizer", exe.parent_path() / "../share/dsv4/dsv4-tokenizer",
        fs::path(DSV4_SOURCE_DIR) / "assets/dsv4-tokenizer"})
    if (!exe.empty() && fs::exists(candidate / "tokenizer.json")) return fs::weakly_canonical(candidate).string();
  fs::path src = fs::path(DSV4_SOURCE_DIR) / "assets/dsv4-tokenizer";
  if (fs::exists(src / "tokenizer.json")) return src.string();
  throw Error("cannot find the bundled tokenizer (set DSV4_TOKENIZER_DIR)");
}

// The embedded smoke-test model is generated here on first use.
std::string default_model_dir() {
  if (const char* env = std::getenv("DSV4_HOME")) return (fs::path(env) / "smoke-model").string();
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) return (fs::path(xdg) / "dsv4/smoke-model").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : "/tmp") / ".cache/dsv4/smoke-model").string();
}

}  // namespace dsv4::tools
