#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/aligned.h"
#include "core/error.h"

namespace dsv4 {
namespace fs = std::filesystem;
using nlohmann::json;

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E8M0: return "F8_E8M0";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I64: return 8;
    default: return 1;
  }
}

static bool parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> names[] = {
      {"F32", DType::F32},         {"F16", DType::F16},         {"BF16", DType::BF16},
      {"F8_E4M3", DType::F8_E4M3}, {"F8_E8M0", DType::F8_E8M0}, {"I8", DType::I8},
      {"U8", DType::U8},           {"I32", DType::I32},         {"I64", DType::I64}};
  for (auto& [name, dtype] : names)
    if (s == name) return *out = dtype, true;
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// Anonymous memory of at least `bytes`, rounded up to whole 2 MB pages and
// advised to transparent huge pages; sets `mapped`.
uint8_t* allocate_copy(const std::string& path, int64_t bytes, size_t& mapped) {
  mapped = whole_huge_pages(size_t(std::max<int64_t>(bytes, 1)));
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("cannot allocate " + std::to_string(bytes >> 20) + " MiB to copy " + path + ": " +
                std::strerror(errno));
  madvise(p, mapped, MADV_HUGEPAGE);  // advisory: ignored where THP is off
  return static_cast<uint8_t*>(p);
}

// Reads bytes [offset, offset + bytes) of fd into dst, in pieces of at most
// 64 MB; an empty string, or why it failed.
std::string read_range(int fd, uint8_t* dst, int64_t offset, int64_t bytes) {
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got =
        ::pread(fd, dst + done, size_t(std::min<int64_t>(bytes - done, int64_t(64) << 20)), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? std::strerror(errno) : "file shrank while reading";
    done += got;
  }
  return "";
}

}  // namespace

MappedFile::MappedFile(const std::string& path, std::vector<Segment>& segments) : path_(path) {
  int64_t total = 0;
  for (Segment& s : segments) {
    s.placed = total;
    total += (s.bytes + kCopiedTensorAlignment - 1) / kCopiedTensorAlignment * kCopiedTensorAlignment;
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  uint8_t* dst = nullptr;
  try {
    dst = allocate_copy(path, total, mapped_bytes_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  for (const Segment& s : segments) {
    const std::string why = read_range(fd, dst + s.placed, s.offset, s.bytes);
    if (!why.empty()) {
      munmap(dst, mapped_bytes_);
      ::close(fd);
      throw Error("cannot read " + path + ": " + why);
    }
  }
  ::close(fd);
  mprotect(dst, mapped_bytes_, PROT_READ);
  // The first read of a page after mprotect can be slow; each page's first
  // read happens here, not on an expert's first use (core/aligned.h).
  touch_huge_pages(dst, mapped_bytes_);
  data_ = dst;
  size_ = total;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error("cannot stat " + path + ": " + std::strerror(errno));
  }
  size_ = st.st_size;
  if (size_ > 0) {
    mapped_bytes_ = size_t(size_);
    void* p = mmap(nullptr, mapped_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error("cannot map " + path + ": " + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), mapped_bytes_);
}

void TensorStore::add_file(const std::string& path, bool first) {
  // The header is read from a mapping in either residency (only its pages
  // are touched); a copy then takes the tensors, each cache-line aligned.
  auto file = std::make_shared<MappedFile>(path);
  if (file->size() < 8) throw Error(path + ": truncated safetensors file (no header)");
  uint64_t header_len;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > uint64_t(file->size() - 8) || header_len > (uint64_t(100) << 20))
    throw Error(path + ": truncated or corrupt safetensors file (header length " + std::to_string(header_len) +
                " exceeds file size " + std::to_string(file->size()) + ")");
  json header;
  try {
    header = json::parse(file->data() + 8, file->data() + 8 + header_len);
  } catch (const json::exception& e) {
    throw Error(path + ": corrupt safetensors header: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": corrupt safetensors header (not an object)");
  const uint8_t* base = file->data() + 8 + header_len;
  const int64_t data_size = file->size() - 8 - int64_t(header_len);
  std::vector<TensorInfo*> added;  // this file's tensors, in tensors_
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (first && entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) metadata[k] = v.get<std::string>();
      continue;
    }
    TensorInfo info;
    info.name = name;
    info.file = path;
    try {
      std::string dtype = entry.at("dtype").get<std::string>();
      if (!parse_dtype(dtype, &info.dtype)) throw Error(path + ": tensor " + name + " has unsupported dtype " + dtype);
      for (auto& d : entry.at("shape")) {
        int64_t v = d.get<int64_t>();
        if (v < 0) throw Error(path + ": tensor " + name + " has a negative dimension");
        info.shape.push_back(v);
      }
      auto offsets = entry.at("data_offsets");
      int64_t begin = offsets.at(0).get<int64_t>(), end = offsets.at(1).get<int64_t>();
      if (begin < 0 || end < begin) throw Error(path + ": tensor " + name + " has invalid data offsets");
      if (end > data_size)
        throw Error(path + ": truncated file: tensor " + name + " ends at byte " + std::to_string(end) + " of a " +
                    std::to_string(data_size) + "-byte data section");
      info.nbytes = end - begin;
      if (info.nbytes != info.numel() * dtype_size(info.dtype))
        throw Error(path + ": tensor " + name + " has " + std::to_string(info.nbytes) + " bytes but shape " +
                    info.shape_string() + " of " + dtype + " needs " +
                    std::to_string(info.numel() * dtype_size(info.dtype)));
      info.data = base + begin;
    } catch (const json::exception& e) {
      throw Error(path + ": malformed header entry for tensor " + name + ": " + e.what());
    }
    if (tensors_.count(name)) throw Error(path + ": duplicate tensor " + name);
    added.push_back(&tensors_.emplace(name, std::move(info)).first->second);
  }
  if (residency_ == FileResidency::Copied) {
    std::vector<MappedFile::Segment> segments;
    for (const TensorInfo* t : added) segments.push_back({t->data - file->data(), t->nbytes});
    auto copy = std::make_shared<MappedFile>(path, segments);
    for (size_t i = 0; i < added.size(); ++i) added[i]->data = copy->data() + segments[i].placed;
    file = std::move(copy);  // unmaps the mapping the header was read from
  }
  files_.push_back(std::move(file));
}

TensorStore TensorStore::open(const std::string& path, FileResidency residency) {
  TensorStore store;
  store.residency_ = residency;
  if (!fs::exists(path)) throw Error("checkpoint path does not exist: " + path);
  if (!fs::is_directory(path)) {
    store.add_file(path, true);
    return store;
  }
  fs::path dir(path);
  fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(index.string() + ": malformed index: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": no weight_map object");
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw Error(index.string() + ": weight_map entry for " + name + " is not a file name");
      by_file[file.get<std::string>()].push_back(name);
    }
    bool first = true;
    for (auto& [file, names] : by_file) {
      fs::path shard = dir / file;
      if (!fs::exists(shard)) throw Error("missing shard " + shard.string() + " (holds " + names.front() + ")");
      store.add_file(shard.string(), first);
      first = false;
      for (auto& name : names)
        if (!store.find(name)) throw Error(shard.string() + ": tensor " + name + " listed in the index is missing");
    }
    return store;
  }
  std::vector<std::string> files;
  for (auto& entry : fs::directory_iterator(dir))
    if (is_weight_file(entry.path().filename().string())) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw Error("no .safetensors files in " + path);
  for (size_t i = 0; i < files.size(); ++i) store.add_file(files[i], i == 0);
  return store;
}

bool is_weight_file(const std::string& filename) {
  const fs::path name(filename);
  return name.extension() == ".safetensors" && name.filename() != "golden.safetensors";
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& TensorStore::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error("missing tensor " + name);
  return *t;
}

void write_safetensors(const std::string& path, const std::vector<OutputTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  for (auto& t : tensors) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    int64_t bytes = n * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write " + path);
  uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (size_t i = 0; i < tensors.size(); ++i)
    out.write(static_cast<const char*>(tensors[i].data), std::streamsize(sizes[i]));
  out.flush();
  if (!out) throw Error("failed writing " + path + " (disk full?)");
}

}  // namespace dsv4
