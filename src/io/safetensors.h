// Memory-mapped safetensors reader (single file or sharded through
// model.safetensors.index.json) and a small writer for result files.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsv4 {

enum class DType { F32, F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I32, I64 };

const char* dtype_name(DType dtype);
int64_t dtype_size(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  int64_t nbytes = 0;
  std::string file;  // the shard that holds it, for error messages

  int64_t numel() const;
  std::string shape_string() const;
};

// How a checkpoint file is made addressable.
enum class FileResidency {
  // mmap of the file: nothing is read until used, pages shared with the page
  // cache (and other processes), 4 KiB pages.
  Mapped,
  // Read into anonymous memory backed by transparent huge pages (llama.cpp's
  // --no-mmap): slower to load, but decode streams the weights without a
  // TLB miss every 4 KiB.
  Copied,
};

// Tensors in a copied file start at multiples of this many bytes: a cache
// line, so that a kernel's 64-byte loads of a row never straddle two lines.
// The files themselves align nothing (a safetensors header has any length,
// and tensors follow each other unpadded); see docs/loading.md.
constexpr int64_t kCopiedTensorAlignment = 64;

// One mapped file, or the tensors of one file copied. The memory lives as
// long as the object.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // mmap of the whole file
  // A byte range of the file, and where the copy below put it.
  struct Segment {
    int64_t offset = 0, bytes = 0;
    int64_t placed = 0;  // offset in data()
  };
  // Copies only `segments` of the file, each to its own multiple of
  // kCopiedTensorAlignment in anonymous (huge-page) memory, filling in
  // their `placed`. The ranges must lie inside the file.
  MappedFile(const std::string& path, std::vector<Segment>& segments);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  size_t mapped_bytes_ = 0;
};

// Whether a file in an unindexed checkpoint directory holds weights: every
// *.safetensors except golden.safetensors, the test checkpoints' reference
// outputs. TensorStore::open and the residency choice's size both use it.
bool is_weight_file(const std::string& filename);

// All tensors of a checkpoint directory (or a single .safetensors file).
class TensorStore {
 public:
  // Opens `path`: a directory with model.safetensors.index.json or
  // model.safetensors (or other *.safetensors), or a single file.
  static TensorStore open(const std::string& path, FileResidency residency = FileResidency::Mapped);

  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws naming the tensor
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  std::map<std::string, std::string> metadata;  // __metadata__ of the first file

 private:
  void add_file(const std::string& path, bool first);
  FileResidency residency_ = FileResidency::Mapped;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
};

// Writes float32/int32 tensors to a safetensors file (header padded to 8 bytes).
struct OutputTensor {
  std::string name;
  DType dtype;  // F32 or I32
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<OutputTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dsv4
