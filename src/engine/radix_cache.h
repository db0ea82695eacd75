// HiCache for DeepSeek-V4 (docs/hicache.md): a radix tree over token ids
// whose nodes hold the state that every sequence with their prefix shares,
// in three tiers.
//
// The tree is a trie of pages of `page_tokens` tokens. A page node holds the
// compressed rows and indexer keys its tokens completed (state_rows), stored
// once however many prefixes run through it. Resuming also needs what only a
// position has (window rings, compressors' partial windows: state_tail), so
// nodes carry checkpoints: a tail taken at the node's end or a few tokens
// past it (with those tokens' rows and ids), optionally with the logits that
// follow. A lookup matches pages down the tree and resumes from the deepest
// checkpoint at or before the end of the match.
//
// Tiers: L1 (the engine's working memory: RAM here, device memory on a GPU
// backend) and L2 (host memory) hold copies of each part, L3 (files,
// engine/hicache_storage.h) outlives the process. The write policy says
// when a part is copied down (write_through: at insert; write_through_selective:
// at its second hit; write_back: when evicted from the tier above). Eviction
// is LRU per tier, leaves first: a page's rows leave the last memory tier
// only when nothing below it needs them, or when L3 has them. Parts in use
// (locked by a lease) are never evicted.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/hicache_storage.h"
#include "model/model.h"

namespace dsv4 {

enum class WritePolicy { WriteThrough, WriteThroughSelective, WriteBack };
enum class PrefetchPolicy { BestEffort, WaitComplete, Timeout };
WritePolicy parse_write_policy(const std::string& name);        // throws Error
PrefetchPolicy parse_prefetch_policy(const std::string& name);  // throws Error

struct HiCacheOptions {
  int64_t device_bytes = int64_t(1) << 30;  // L1; 0 turns the cache off
  int64_t host_bytes = 0;                   // L2; 0: no host tier
  int64_t page_tokens = 256;                // radix page
  int64_t checkpoint_interval = 2048;       // checkpoints inside prompts every this many tokens; 0: none
  WritePolicy write_policy = WritePolicy::WriteThrough;
  std::string storage_dir;     // L3 directory; empty: no storage tier (needs a host tier)
  std::string model_identity;  // model_fingerprint(); required with storage
  PrefetchPolicy prefetch_policy = PrefetchPolicy::BestEffort;
  int64_t prefetch_threshold = 256;  // tokens L3 must add over memory to be read
  double prefetch_timeout_base = 1.0, prefetch_timeout_per_ki_token = 0.25;  // seconds
  std::function<void(const std::string&)> warn;
};

struct HiCacheMetrics {
  int64_t device_bytes = 0, device_capacity = 0, host_bytes = 0, host_capacity = 0;
  int64_t device_tokens = 0, host_tokens = 0;  // tokens of the pages and checkpoint tails resident
  int64_t nodes = 0, checkpoints = 0;
  int64_t lookups = 0, hits = 0;  // lookups that resumed from a checkpoint
  int64_t hit_device = 0, hit_host = 0, hit_storage = 0;            // hits by the lowest tier used
  int64_t cached_device = 0, cached_host = 0, cached_storage = 0;   // cached tokens by tier
  int64_t evicted_device_tokens = 0, evicted_host_tokens = 0;       // tokens of rows leaving L1 / L2
  int64_t evictions_device = 0, evictions_host = 0;                 // parts leaving L1 / L2
  int64_t backup_tokens = 0, load_back_tokens = 0;                  // L1 -> L2, L2 -> L1
  int64_t checkpoint_bytes = 0, row_bytes = 0, row_tokens = 0;      // in memory (row_tokens: pages + tails)
  int64_t bad_parts = 0;  // parts that failed to rebuild a state (dropped)
  StorageMetrics storage;
  bool storage_configured = false;
};

// What a lookup found: the state to resume from, where, and from which tiers.
struct CacheHit {
  int64_t matched = 0;
  SequenceState state;
  std::vector<float> last_logits;  // when the checkpoint sits at the end of the prompt
  int64_t device_tokens = 0, host_tokens = 0, storage_tokens = 0;
  std::shared_ptr<void> lease;  // keeps the parts used in memory while held
};

struct PrefetchTicket {
  std::atomic<bool> done{false};
  double deadline = 0;          // timeout policy: now_seconds() past which the request runs anyway
  std::shared_ptr<void> lease;  // the prefetched parts, held until the request starts
};

class RadixCache {
 public:
  RadixCache(std::shared_ptr<const Model> model, HiCacheOptions options);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  bool enabled() const { return options_.device_bytes > 0; }
  const HiCacheOptions& options() const { return options_; }
  // The deepest checkpoint at or before the end of `tokens` (at the very end
  // only with logits). False: start from scratch.
  bool lookup(const std::vector<int32_t>& tokens, CacheHit* hit);
  // Stores `state`, which holds exactly `tokens`, with the logits that
  // follow it when `logits` is not null.
  void insert(const std::vector<int32_t>& tokens, const SequenceState& state, const float* logits);
  // Reads from L3 what it holds of `tokens` beyond the memory tiers (when
  // that is at least prefetch_threshold tokens) on the I/O thread; null when
  // there is no storage tier. `wake` runs when the ticket is done.
  std::shared_ptr<PrefetchTicket> prefetch(const std::vector<int32_t>& tokens, std::function<void()> wake);
  // Empties every tier. Safe while requests run: leases keep what they use
  // alive (outside the accounting) until released.
  void flush();
  // Waits for queued storage writes and prefetches (tests, benchmarks).
  void drain_storage();
  HiCacheMetrics metrics() const;

 private:
  struct Part;
  struct Checkpoint;
  struct Node;
  struct Generation;
  struct Found;
  struct Lease;

  Found find(Generation& g, const std::vector<int32_t>& tokens, int64_t len, bool memory_only) const;
  BytesPtr take_for_use(Part& p, int64_t* device, int64_t* host, int64_t* storage, int64_t tokens);
  void add_copy(Part& p, int tier, BytesPtr bytes);
  void drop_copy(Part& p, int tier);
  void on_hit(Part& p, const Hash128& key, const Hash128& prefix, int64_t start, const std::vector<int32_t>& ids,
              RecordKind kind);
  void write_storage(Part& p, RecordKind kind, const Hash128& key, const Hash128& prefix, int64_t start,
                     std::vector<int32_t> ids);
  void evict();
  bool evict_tier(int tier);
  void remove_checkpoint(Node& n, Checkpoint* c);
  void prune(Node* n);
  std::shared_ptr<void> lock_parts(const std::shared_ptr<Generation>& g, const std::vector<Node*>& nodes, Checkpoint* c);
  void unlock(const std::vector<Node*>& nodes, Checkpoint* c);
  bool run_prefetch(const std::vector<int32_t>& tokens, PrefetchTicket& ticket);
  Node* child(Node& parent, const std::vector<int32_t>& tokens, int64_t k, bool create);

  std::shared_ptr<const Model> model_;
  HiCacheOptions options_;
  mutable std::mutex mutex_;
  std::shared_ptr<Generation> gen_;
  uint64_t clock_ = 0;
  int64_t used_[3] = {0, 0, 0};  // bytes per memory tier (index 1, 2)
  HiCacheMetrics counters_;      // the monotonic counters
  std::unique_ptr<HiCacheStorage> storage_;  // last: its thread's jobs use the tree
};

}  // namespace dsv4
