#include "engine/hicache_storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dsv4 {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'H', 'I', 'C', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 16 * 3 + 8 * 3 + 16 * 2;  // 120
constexpr const char* kSuffix = ".dsv4";

// The fixed little-endian header of a record file; the token ids and the
// payload follow it.
struct Header {
  uint32_t version = kFormatVersion, kind = 0;
  Hash128 identity, key, prefix;
  uint64_t start = 0, tokens = 0, payload = 0;
  Hash128 body_sum, header_sum;
};

void put(uint8_t*& p, const void* v, size_t n) {
  if (n > 0) std::memcpy(p, v, n);  // (an empty vector's data() may be null)
  p += n;
}
void put_hash(uint8_t*& p, const Hash128& h) {
  put(p, &h.lo, 8);
  put(p, &h.hi, 8);
}
void get(const uint8_t*& p, void* v, size_t n) {
  if (n > 0) std::memcpy(v, p, n);
  p += n;
}
Hash128 get_hash(const uint8_t*& p) {
  Hash128 h;
  get(p, &h.lo, 8);
  get(p, &h.hi, 8);
  return h;
}

// Everything before the header checksum.
void encode_header(const Header& h, uint8_t* out) {
  uint8_t* p = out;
  put(p, kMagic, 8);
  put(p, &h.version, 4);
  put(p, &h.kind, 4);
  put_hash(p, h.identity);
  put_hash(p, h.key);
  put_hash(p, h.prefix);
  put(p, &h.start, 8);
  put(p, &h.tokens, 8);
  put(p, &h.payload, 8);
  put_hash(p, h.body_sum);
  const Hash128 sum = Hasher(7).bytes(out, size_t(p - out)).digest();
  put_hash(p, sum);
}

// False when the bytes are not a well-formed header (magic, version,
// header checksum).
bool decode_header(const uint8_t* in, Header* h) {
  if (std::memcmp(in, kMagic, 8) != 0) return false;
  const uint8_t* p = in + 8;
  get(p, &h->version, 4);
  get(p, &h->kind, 4);
  h->identity = get_hash(p);
  h->key = get_hash(p);
  h->prefix = get_hash(p);
  get(p, &h->start, 8);
  get(p, &h->tokens, 8);
  get(p, &h->payload, 8);
  h->body_sum = get_hash(p);
  const Hash128 expected = Hasher(7).bytes(in, size_t(p - in)).digest();
  h->header_sum = get_hash(p);
  return h->version == kFormatVersion && h->header_sum == expected;
}

Hash128 body_checksum(const int32_t* tokens, int64_t n, const uint8_t* payload, size_t size) {
  return Hasher(11).bytes(tokens, size_t(n) * 4).bytes(payload, size).digest();
}

bool read_all(int fd, void* out, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= size_t(r);
  }
  return true;
}

bool write_all(int fd, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= size_t(w);
  }
  return true;
}

}  // namespace

HiCacheStorage::HiCacheStorage(std::string dir, const std::string& identity,
                               std::function<void(const std::string&)> warn)
    : dir_(std::move(dir)), warn_(std::move(warn)) {
  identity_ = Hasher(3).bytes(identity.data(), identity.size()).digest();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  // Probe: a directory we cannot write to is no tier at all.
  const std::string probe = dir_ + "/.dsv4-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const bool writable = fd >= 0 && write_all(fd, "ok", 2);
  const int saved = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (ec || !writable) {
    ++errors_;
    disable("cannot write to " + dir_ + " (" + (ec ? ec.message() : std::string(std::strerror(saved))) + ")");
    return;
  }
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 5 && name.ends_with(kSuffix)) present_.insert(name);
  }
  enabled_ = true;
  thread_ = std::thread([this] { io_loop(); });
}

HiCacheStorage::~HiCacheStorage() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HiCacheStorage::disable(const std::string& why) {
  if (enabled_.exchange(false) || !thread_.joinable())
    if (warn_) warn_("hicache storage: " + why + "; the storage tier (L3) is off, the memory tiers go on");
}

std::string HiCacheStorage::path_of(RecordKind kind, const Hash128& key) const {
  const Hash128 name = Hasher(5).hash(identity_).u64(uint64_t(kind)).hash(key).digest();
  return name.hex() + kSuffix;
}

bool HiCacheStorage::contains(RecordKind kind, const Hash128& key) const {
  if (!enabled_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return present_.count(path_of(kind, key)) > 0;
}

void HiCacheStorage::write(RecordKind kind, const Hash128& key, const Hash128& prefix, int64_t start,
                           std::vector<int32_t> tokens, BytesPtr payload) {
  if (!enabled_) return;
  const std::string name = path_of(kind, key);
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (present_.count(name) || pending_.count(name)) return;
    pending_.insert(name);
    generation = generation_;
  }
  auto job = [this, name, generation, kind, key, prefix, start, tokens = std::move(tokens),
              payload = std::move(payload)] {
    Header h;
    h.kind = uint32_t(kind);
    h.identity = identity_;
    h.key = key;
    h.prefix = prefix;
    h.start = uint64_t(start);
    h.tokens = tokens.size();
    h.payload = payload->size();
    h.body_sum = body_checksum(tokens.data(), int64_t(tokens.size()), payload->data(), payload->size());
    Bytes file(kHeaderBytes + tokens.size() * 4 + payload->size());
    encode_header(h, file.data());
    if (!tokens.empty()) std::memcpy(file.data() + kHeaderBytes, tokens.data(), tokens.size() * 4);
    if (!payload->empty())
      std::memcpy(file.data() + kHeaderBytes + tokens.size() * 4, payload->data(), payload->size());
    write_now(name, generation, file, kind == RecordKind::Page ? int64_t(tokens.size()) : 0);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void HiCacheStorage::write_now(const std::string& name, uint64_t generation, const Bytes& file, int64_t tokens) {
  const std::string path = dir_ + "/" + name;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(++tmp_counter_);
  bool ok = false;
  int err = 0;
  if (enabled_ && generation == generation_) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ok = fd >= 0 && write_all(fd, file.data(), file.size());
    err = errno;
    if (fd >= 0 && ::close(fd) != 0 && ok) ok = false, err = errno;
    ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) {
      if (!err) err = errno;
      ::unlink(tmp.c_str());
      ++errors_;
      disable("cannot write a record in " + dir_ + " (" + std::strerror(err) + ")");
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(name);
  if (!ok) return;
  if (generation != generation_) {  // flushed while it was being written
    ::unlink(path.c_str());
    return;
  }
  present_.insert(name);
  ++writes_;
  write_bytes_ += int64_t(file.size());
  backuped_tokens_ += tokens;
}

BytesPtr HiCacheStorage::read(RecordKind kind, const Hash128& key, const Hash128& prefix, int64_t start,
                              const int32_t* tokens, int64_t n) {
  if (!enabled_) return nullptr;
  const std::string name = path_of(kind, key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!present_.count(name)) return nullptr;
  }
  const std::string path = dir_ + "/" + name;
  auto drop = [&](bool bad) -> BytesPtr {
    std::lock_guard<std::mutex> lock(mutex_);
    present_.erase(name);
    if (bad) {
      ++corrupt_;
      ::unlink(path.c_str());
    }
    return nullptr;
  };
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return drop(false);  // deleted by someone else
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ::lseek(fd, 0, SEEK_SET);
  uint8_t raw[kHeaderBytes];
  Header h;
  if (size < off_t(kHeaderBytes) || !read_all(fd, raw, kHeaderBytes) || !decode_header(raw, &h)) return drop(true);
  // Every field must be what this lookup expects: another model's record
  // (identity), another prefix (key, prefix hash, position, token ids), and
  // a file whose length disagrees with its header (truncated, appended to).
  if (h.identity != identity_ || h.kind != uint32_t(kind) || h.key != key || h.prefix != prefix ||
      h.start != uint64_t(start) || h.tokens != uint64_t(n) ||
      uint64_t(size) != kHeaderBytes + h.tokens * 4 + h.payload)
    return drop(true);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  auto payload = std::make_shared<Bytes>(size_t(h.payload));
  if (!read_all(fd, ids.data(), size_t(n) * 4) || !read_all(fd, payload->data(), payload->size())) return drop(true);
  if (std::memcmp(ids.data(), tokens, size_t(n) * 4) != 0 ||
      body_checksum(ids.data(), n, payload->data(), payload->size()) != h.body_sum)
    return drop(true);
  ++reads_;
  read_bytes_ += int64_t(size);
  return payload;
}

void HiCacheStorage::run_async(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_front(std::move(job));
  }
  cv_.notify_all();
}

void HiCacheStorage::io_loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      // Shutdown finishes the queued writes: they are what the next server
      // would reuse.
      if (jobs_.empty()) break;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    job();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void HiCacheStorage::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return !thread_.joinable() || (jobs_.empty() && !busy_); });
}

void HiCacheStorage::clear() {
  if (!thread_.joinable()) return;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    // Queued writes would only bring back what is being cleared; prefetches
    // stay (they check what they read).
    std::erase_if(pending_, [](const std::string&) { return true; });
    names.assign(present_.begin(), present_.end());
  }
  // Only this model's records go: other models may share the directory.
  for (const std::string& name : names) {
    const std::string path = dir_ + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) continue;
    uint8_t raw[kHeaderBytes];
    Header h;
    const bool ours = read_all(fd, raw, kHeaderBytes) && decode_header(raw, &h) && h.identity == identity_;
    ::close(fd);
    if (!ours) continue;
    ::unlink(path.c_str());
    std::lock_guard<std::mutex> lock(mutex_);
    present_.erase(name);
  }
}

StorageMetrics HiCacheStorage::metrics() const {
  StorageMetrics m;
  m.enabled = enabled_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    m.records = int64_t(present_.size());
  }
  m.reads = reads_, m.writes = writes_, m.read_bytes = read_bytes_, m.write_bytes = write_bytes_;
  m.corrupt = corrupt_, m.errors = errors_;
  m.prefetched_tokens = prefetched_tokens_, m.backuped_tokens = backuped_tokens_;
  return m;
}

}  // namespace dsv4
