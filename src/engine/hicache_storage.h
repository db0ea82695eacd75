// The prefix cache's storage tier (L3, `--hicache-storage-backend file`):
// one file per record in a directory that outlives the server, so that the
// next server with the same model reuses what this one computed
// (docs/hicache.md has the file format and why plain files).
//
// A record is a page of compressed rows or a checkpoint (rows + tail), keyed
// by the chain hash of the token prefix it ends. Its file name hashes that
// key with the model's identity, so models sharing a directory never look
// at each other's records. Each file carries a format version, the model
// identity, its key, the hash of the prefix before its own tokens, those
// tokens, and checksums over header and body: a torn, truncated, foreign or
// bit-flipped record fails one of these checks, is deleted, counted and
// treated as a miss (the request recomputes; the answer cannot change).
//
// Writes are asynchronous (a single I/O thread, which also runs the
// prefetches) and atomic (a temporary file renamed into place). Any write
// failure (a full disk, a directory that turned read-only) switches the tier
// off with one warning line; requests go on with the memory tiers.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/hash.h"

namespace dsv4 {

using Bytes = std::vector<uint8_t>;
using BytesPtr = std::shared_ptr<const Bytes>;

enum class RecordKind : uint32_t {
  Page = 1,              // rows of one radix page
  Checkpoint = 2,        // tail rows + tail state at a position
  CheckpointLogits = 3,  // the same, with the logits that follow it
};

struct StorageMetrics {
  bool enabled = false;
  int64_t records = 0;                      // files of this model known to exist
  int64_t reads = 0, writes = 0;            // records read (verified) and written
  int64_t read_bytes = 0, write_bytes = 0;  // file bytes
  int64_t corrupt = 0;                      // records dropped by a check
  int64_t errors = 0;                       // I/O errors (a write failure turns the tier off)
  int64_t prefetched_tokens = 0;            // tokens whose rows came from storage
  int64_t backuped_tokens = 0;              // tokens whose rows were written to storage
};

class HiCacheStorage {
 public:
  // `identity`: model_fingerprint() of the model. `warn` gets one line per
  // event worth a log (the tier turning off).
  HiCacheStorage(std::string dir, const std::string& identity, std::function<void(const std::string&)> warn);
  ~HiCacheStorage();
  HiCacheStorage(const HiCacheStorage&) = delete;
  HiCacheStorage& operator=(const HiCacheStorage&) = delete;

  bool enabled() const { return enabled_; }
  const std::string& dir() const { return dir_; }
  bool contains(RecordKind kind, const Hash128& key) const;
  // Queues a write of the record of tokens [start, start + tokens.size())
  // ending the prefix `key`, after the prefix `prefix`. Nothing when the
  // tier is off or the record exists.
  void write(RecordKind kind, const Hash128& key, const Hash128& prefix, int64_t start, std::vector<int32_t> tokens,
             BytesPtr payload);
  // The payload of that record, verified against what the caller expects;
  // null when missing or bad (then deleted and counted). Any thread.
  BytesPtr read(RecordKind kind, const Hash128& key, const Hash128& prefix, int64_t start, const int32_t* tokens,
                int64_t n);
  // Runs `job` on the I/O thread ahead of queued writes.
  void run_async(std::function<void()> job);
  // Deletes every record of this model (the index's) and drops queued writes.
  void clear();
  // Waits until no job is queued or running (tests, shutdown).
  void drain();
  void add_prefetched_tokens(int64_t n) { prefetched_tokens_ += n; }
  StorageMetrics metrics() const;

 private:
  std::string path_of(RecordKind kind, const Hash128& key) const;
  void disable(const std::string& why);
  void io_loop();
  void write_now(const std::string& path, uint64_t generation, const Bytes& file, int64_t tokens);

  std::string dir_;
  Hash128 identity_;
  std::function<void(const std::string&)> warn_;
  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> generation_{0};
  mutable std::mutex mutex_;
  std::unordered_set<std::string> present_;  // file names of this model's records
  std::unordered_set<std::string> pending_;  // queued writes
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false, stop_ = false;
  std::condition_variable cv_, idle_cv_;
  std::atomic<int64_t> reads_{0}, writes_{0}, read_bytes_{0}, write_bytes_{0}, corrupt_{0}, errors_{0};
  std::atomic<int64_t> prefetched_tokens_{0}, backuped_tokens_{0};
  std::atomic<uint64_t> tmp_counter_{0};
  std::thread thread_;
};

}  // namespace dsv4
