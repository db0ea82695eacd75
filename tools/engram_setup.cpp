#include "engram_setup.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/config.h"
#include "text/engram_token_map.h"
#include "text/tokenizer.h"

namespace dsv4::tools {
namespace fs = std::filesystem;

std::vector<int32_t> engram_token_map_for(const std::string& model_dir, const std::string& tokenizer_path) {
  const ModelConfig c = load_config(model_dir);
  if (!c.has_engram() || fs::exists(fs::path(model_dir) / "engram_tokenizer.json")) return {};
  fs::path path = tokenizer_path.empty() ? fs::path(model_dir) / "tokenizer.json" : fs::path(tokenizer_path);
  if (fs::is_directory(path)) path /= "tokenizer.json";
  if (!fs::exists(path))
    throw Error("the Engram layers of this checkpoint need its tokenizer (" + path.string() + " not found)");
  const auto t0 = std::chrono::steady_clock::now();
  auto tokenizer = text::Tokenizer::from_file(path.string());
  text::EngramTokenMap map = text::build_engram_token_map(*tokenizer);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "Engram token map: %zu token ids -> %lld classes, derived from %s in %.0f ms\n", map.ids.size(),
               (long long)map.classes, path.c_str(), ms);
  return map.ids;
}

}  // namespace dsv4::tools
