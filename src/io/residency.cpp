#include "io/residency.h"

#include <cstdio>
#include <filesystem>

namespace dsv4 {
namespace fs = std::filesystem;

namespace {

std::string gb(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", double(bytes) / 1e9);
  return text;
}

}  // namespace

bool parse_load_mode(const std::string& name, LoadMode* mode) {
  if (name == "auto")
    *mode = LoadMode::Auto;
  else if (name == "mmap")
    *mode = LoadMode::Mmap;
  else if (name == "none")
    *mode = LoadMode::Copy;
  else
    return false;
  return true;
}

ResidencyChoice choose_residency(LoadMode mode, int64_t checkpoint_bytes, int64_t reserved_bytes,
                                 int64_t available_bytes) {
  if (mode == LoadMode::Mmap) return {FileResidency::Mapped, "--load-mode mmap"};
  if (mode == LoadMode::Copy) return {FileResidency::Copied, "--load-mode none"};
  const std::string need = "the " + gb(checkpoint_bytes) + " checkpoint" +
                           (reserved_bytes > 0 ? " and " + gb(reserved_bytes) + " of caches" : std::string());
  if (available_bytes < 0)
    return {FileResidency::Mapped, "--load-mode auto: the memory available is unknown; --load-mode none copies"};
  const bool plural = reserved_bytes > 0;
  if (double(checkpoint_bytes + reserved_bytes) <= kAutoCopyShare * double(available_bytes))
    return {FileResidency::Copied, "--load-mode auto: " + need + (plural ? " fit" : " fits") + " in the " +
                                       gb(available_bytes) + " available"};
  return {FileResidency::Mapped, "--load-mode auto: " + need + (plural ? " do" : " does") + " not fit in " +
                                     std::to_string(int(kAutoCopyShare * 100 + 0.5)) + "% of the " +
                                     gb(available_bytes) +
                                     " available; decode streams 4 KiB pages, slower than copied weights"};
}

int64_t checkpoint_file_bytes(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    const auto size = fs::file_size(path, ec);
    return ec ? 0 : int64_t(size);
  }
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (!is_weight_file(entry.path().filename().string())) continue;
    const auto size = entry.file_size(ec);
    if (!ec) total += int64_t(size);
  }
  return total;
}

}  // namespace dsv4
