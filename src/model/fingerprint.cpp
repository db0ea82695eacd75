#include "model/fingerprint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

namespace dsv4 {

namespace fs = std::filesystem;

namespace {

void hash_range(Hasher& h, std::ifstream& in, uint64_t offset, uint64_t n) {
  std::vector<char> buf(static_cast<size_t>(n));
  in.clear();
  in.seekg(std::streamoff(offset));
  in.read(buf.data(), std::streamsize(n));
  h.u64(offset).bytes(buf.data(), size_t(in.gcount()));
}

}  // namespace

std::string model_fingerprint(const std::string& model_dir) {
  const fs::path dir(model_dir);
  std::ifstream config(dir / "config.json", std::ios::binary);
  if (!config) throw Error("no config.json in " + model_dir);
  const std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  Hasher h(0x4453563446505231ULL);  // "DSV4FPR1"
  h.u64(text.size()).bytes(text.data(), text.size());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    const uint64_t size = fs::file_size(f);
    h.u64(name.size()).bytes(name.data(), name.size()).u64(size);
    std::ifstream in(f, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    header = std::min<uint64_t>(header, size > 8 ? size - 8 : 0);
    hash_range(h, in, 0, 8 + header);
    const uint64_t data = 8 + header, span = size - data, sample = 64 << 10;
    for (uint64_t k = 0; k < 4 && span > 0; ++k) {
      const uint64_t at = data + (span > sample ? (span - sample) * k / 3 : 0);
      hash_range(h, in, at, std::min(sample, size - at));
    }
  }
  return h.digest().hex();
}

}  // namespace dsv4
