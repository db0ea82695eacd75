#include "engine/radix_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/machine.h"
#include "model/state_parts.h"

namespace dsv4 {

WritePolicy parse_write_policy(const std::string& name) {
  if (name == "write_through") return WritePolicy::WriteThrough;
  if (name == "write_through_selective") return WritePolicy::WriteThroughSelective;
  if (name == "write_back") return WritePolicy::WriteBack;
  throw Error("--hicache-write-policy " + name + ": expected write_through, write_through_selective or write_back");
}

PrefetchPolicy parse_prefetch_policy(const std::string& name) {
  if (name == "best_effort") return PrefetchPolicy::BestEffort;
  if (name == "wait_complete") return PrefetchPolicy::WaitComplete;
  if (name == "timeout") return PrefetchPolicy::Timeout;
  throw Error("--hicache-storage-prefetch-policy " + name + ": expected best_effort, wait_complete or timeout");
}

// One stored piece (a page's rows or a checkpoint) and where its copies are.
// copy[1]: L1, copy[2]: L2 (immutable bytes, shared with the leases that
// read them); l3: written to storage.
struct RadixCache::Part {
  BytesPtr copy[3];
  bool l3 = false, from_storage = false;
  int64_t bytes = 0, tokens = 0, hits = 0;
  uint64_t last_used = 0;
  bool in_memory() const { return copy[1] || copy[2]; }
};

struct RadixCache::Checkpoint {
  std::vector<int32_t> tail;  // tokens past the node's end
  bool logits = false;
  Hash128 key;  // chain hash at its position
  Part part;
  int locks = 0;
  RecordKind kind() const { return logits ? RecordKind::CheckpointLogits : RecordKind::Checkpoint; }
};

struct RadixCache::Node {
  Node* parent = nullptr;
  int64_t depth = 0;         // tokens from the root to this node's end
  std::vector<int32_t> page;  // its tokens (none for the root)
  Hash128 key;               // chain hash of tokens [0, depth)
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  std::vector<std::unique_ptr<Checkpoint>> checkpoints;
  Part rows;
  int locks = 0;
};

struct RadixCache::Generation {
  Node root;
};

struct RadixCache::Found {
  std::vector<Node*> path;  // page nodes from the root to the checkpoint's node
  Node* node = nullptr;
  Checkpoint* checkpoint = nullptr;
  int64_t position = 0;
  int64_t memory_pages = 0;  // leading pages of the tokens with rows in memory
};

namespace {

// A checkpoint's bytes: the rows its tail tokens completed, the tail
// state, and the logits after it (possibly none).
BytesPtr checkpoint_blob(const std::vector<uint8_t>& rows, const std::vector<uint8_t>& tail, const float* logits,
                         int64_t vocab) {
  auto b = std::make_shared<Bytes>();
  auto put = [&](const void* p, uint64_t n) {
    b->insert(b->end(), reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + 8);
    b->insert(b->end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  put(rows.data(), rows.size());
  put(tail.data(), tail.size());
  put(logits, logits ? uint64_t(vocab) * 4 : 0);
  return b;
}

struct BlobView {
  const uint8_t *rows, *tail, *logits;
  size_t rows_size, tail_size, logits_size;
};

BlobView parse_blob(const Bytes& b) {
  BlobView v{};
  size_t pos = 0;
  auto take = [&](const uint8_t** p, size_t* n) {
    uint64_t len;
    if (b.size() - pos < 8) throw Error("prefix-cache checkpoint is truncated");
    std::memcpy(&len, b.data() + pos, 8);
    pos += 8;
    if (len > b.size() - pos) throw Error("prefix-cache checkpoint is truncated");
    *p = b.data() + pos, *n = size_t(len);
    pos += len;
  };
  take(&v.rows, &v.rows_size);
  take(&v.tail, &v.tail_size);
  take(&v.logits, &v.logits_size);
  if (pos != b.size() || v.logits_size % 4) throw Error("prefix-cache checkpoint has a bad layout");
  return v;
}

}  // namespace

RadixCache::RadixCache(std::shared_ptr<const Model> model, HiCacheOptions options)
    : model_(std::move(model)), options_(std::move(options)), gen_(std::make_shared<Generation>()) {
  if (options_.page_tokens <= 0) throw Error("the radix page must hold at least one token");
  if (options_.checkpoint_interval < 0 || options_.checkpoint_interval % options_.page_tokens)
    throw Error("the checkpoint interval must be a multiple of the page size (" +
                std::to_string(options_.page_tokens) + " tokens)");
  if (!options_.storage_dir.empty() && enabled()) {
    if (options_.host_bytes <= 0) throw Error("the storage tier needs the host tier (--enable-hierarchical-cache)");
    if (options_.model_identity.empty()) throw Error("the storage tier needs the model's identity");
    storage_ = std::make_unique<HiCacheStorage>(options_.storage_dir, options_.model_identity, options_.warn);
  }
  counters_.device_capacity = options_.device_bytes;
  counters_.host_capacity = options_.host_bytes;
  counters_.storage_configured = storage_ != nullptr;
}

RadixCache::~RadixCache() = default;

RadixCache::Node* RadixCache::child(Node& parent, const std::vector<int32_t>& tokens, int64_t k, bool create) {
  const int64_t P = options_.page_tokens;
  std::vector<int32_t> page(tokens.begin() + k * P, tokens.begin() + (k + 1) * P);
  auto it = parent.children.find(page);
  if (it != parent.children.end()) return it->second.get();
  if (!create) return nullptr;
  auto n = std::make_unique<Node>();
  n->parent = &parent;
  n->depth = parent.depth + P;
  n->key = parent.key;
  for (int32_t t : page) n->key = chain_hash(n->key, t);
  n->page = page;
  Node* raw = n.get();
  parent.children.emplace(std::move(page), std::move(n));
  return raw;
}

RadixCache::Found RadixCache::find(Generation& g, const std::vector<int32_t>& tokens, int64_t len,
                                   bool memory_only) const {
  Found f;
  std::vector<Node*> path;
  auto consider = [&](Node* n) {
    for (auto& c : n->checkpoints) {
      if (memory_only && !c->part.in_memory()) continue;
      const int64_t pos = n->depth + int64_t(c->tail.size());
      if (pos > len || (pos == len && !c->logits)) continue;
      if (!std::equal(c->tail.begin(), c->tail.end(), tokens.begin() + n->depth)) continue;
      if (!f.checkpoint || pos > f.position || (pos == f.position && c->logits && !f.checkpoint->logits)) {
        f.checkpoint = c.get(), f.position = pos, f.node = n;
        f.path = path;
      }
    }
  };
  Node* n = &g.root;
  consider(n);
  const int64_t P = options_.page_tokens;
  for (int64_t k = 0; (k + 1) * P <= len; ++k) {
    auto it = n->children.find(std::vector<int32_t>(tokens.begin() + k * P, tokens.begin() + (k + 1) * P));
    if (it == n->children.end() || (memory_only && !it->second->rows.in_memory())) break;
    n = it->second.get();
    path.push_back(n);
    f.memory_pages = k + 1;
    consider(n);
  }
  return f;
}

void RadixCache::add_copy(Part& p, int tier, BytesPtr bytes) {
  if (p.copy[tier]) return;
  p.copy[tier] = std::move(bytes);
  p.bytes = int64_t(p.copy[tier]->size());
  used_[tier] += p.bytes;
}

void RadixCache::drop_copy(Part& p, int tier) {
  if (!p.copy[tier]) return;
  used_[tier] -= p.bytes;
  p.copy[tier].reset();
}

void RadixCache::write_storage(Part& p, RecordKind kind, const Hash128& key, const Hash128& prefix, int64_t start,
                               std::vector<int32_t> ids) {
  if (!storage_ || p.l3 || !storage_->enabled()) return;
  const BytesPtr& bytes = p.copy[2] ? p.copy[2] : p.copy[1];
  if (!bytes) return;
  storage_->write(kind, key, prefix, start, std::move(ids), bytes);
  p.l3 = true;
}

// A part's copy into the tiers below L1 (host, then storage): what
// write_through does at insert and write_through_selective at the second hit.
void RadixCache::on_hit(Part& p, const Hash128& key, const Hash128& prefix, int64_t start,
                        const std::vector<int32_t>& ids, RecordKind kind) {
  if (options_.host_bytes > 0 && !p.copy[2] && p.copy[1]) {
    // On a device backend this is the device-to-host copy.
    add_copy(p, 2, std::make_shared<Bytes>(*p.copy[1]));
    counters_.backup_tokens += p.tokens;
  }
  write_storage(p, kind, key, prefix, start, ids);
}

// The L1 bytes of a part about to be used, loaded back from L2 when L1 lost
// them; adds its tokens to the tier they came from.
BytesPtr RadixCache::take_for_use(Part& p, int64_t* device, int64_t* host, int64_t* storage, int64_t tokens) {
  p.last_used = ++clock_;
  ++p.hits;
  int64_t* source = p.from_storage ? storage : p.copy[1] ? device : host;
  p.from_storage = false;
  if (!p.copy[1]) {
    add_copy(p, 1, std::make_shared<Bytes>(*p.copy[2]));
    counters_.load_back_tokens += p.tokens;
  }
  *source += tokens;
  return p.copy[1];
}

std::shared_ptr<void> RadixCache::lock_parts(const std::shared_ptr<Generation>& g, const std::vector<Node*>& nodes,
                                       Checkpoint* c) {
  for (Node* n : nodes) ++n->locks;
  if (c) ++c->locks;
  // The generation is kept alive so that a flush cannot free locked parts.
  return std::shared_ptr<void>(new int(0), [this, g, nodes, c](int* p) {
    delete p;
    unlock(nodes, c);
  });
}

void RadixCache::unlock(const std::vector<Node*>& nodes, Checkpoint* c) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Node* n : nodes) --n->locks;
  if (c) --c->locks;
}

bool RadixCache::lookup(const std::vector<int32_t>& tokens, CacheHit* hit) {
  if (!enabled() || tokens.empty()) return false;
  std::unique_lock<std::mutex> guard(mutex_);
  ++counters_.lookups;
  std::shared_ptr<Generation> g = gen_;
  const Found f = find(*g, tokens, int64_t(tokens.size()), true);
  if (!f.checkpoint) return false;
  std::shared_ptr<void> lease = lock_parts(g, f.path, f.checkpoint);
  int64_t device = 0, host = 0, storage = 0;
  std::vector<BytesPtr> pages;
  for (Node* n : f.path) {
    pages.push_back(take_for_use(n->rows, &device, &host, &storage, options_.page_tokens));
    if (options_.write_policy == WritePolicy::WriteThroughSelective && n->rows.hits >= 2)
      on_hit(n->rows, n->key, n->parent->key, n->depth - options_.page_tokens, n->page, RecordKind::Page);
  }
  Checkpoint& c = *f.checkpoint;
  const BytesPtr blob = take_for_use(c.part, &device, &host, &storage, int64_t(c.tail.size()));
  if (options_.write_policy == WritePolicy::WriteThroughSelective && c.part.hits >= 2)
    on_hit(c.part, c.key, f.node->key, f.node->depth, c.tail, c.kind());
  evict();  // a load-back may have filled L1
  guard.unlock();

  // The state is built outside the lock: the bytes are immutable and the
  // lease keeps them (and their nodes) alive.
  const int64_t P = options_.page_tokens;
  try {
    SequenceState s = model_->new_state();
    for (size_t k = 0; k < pages.size(); ++k)
      append_state_rows(s, pages[k]->data(), pages[k]->size(), int64_t(k) * P, int64_t(k + 1) * P);
    const BlobView v = parse_blob(*blob);
    append_state_rows(s, v.rows, v.rows_size, f.node->depth, f.position);
    restore_state_tail(s, v.tail, v.tail_size,
                       std::vector<int32_t>(tokens.begin(), tokens.begin() + f.position));
    if (s.n_tokens != f.position) throw Error("prefix-cache checkpoint holds another position");
    hit->last_logits.clear();
    if (f.position == int64_t(tokens.size())) {
      if (v.logits_size != size_t(model_->config().vocab_size) * 4) throw Error("prefix-cache logits of a bad size");
      hit->last_logits.resize(v.logits_size / 4);
      std::memcpy(hit->last_logits.data(), v.logits, v.logits_size);
    }
    hit->state = std::move(s);
  } catch (const std::exception&) {
    // Parts that do not make a state of this model (only a bug or a forged
    // record gets here; checksums catch damage): forget the checkpoint and
    // start cold, which gives the right answer.
    lease.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.bad_parts;
    if (g == gen_ && f.checkpoint->locks == 0) remove_checkpoint(*f.node, f.checkpoint);
    return false;
  }
  hit->matched = f.position;
  hit->device_tokens = device, hit->host_tokens = host, hit->storage_tokens = storage;
  hit->lease = std::move(lease);
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.hits;
  counters_.cached_device += device, counters_.cached_host += host, counters_.cached_storage += storage;
  ++(storage > 0 ? counters_.hit_storage : host > 0 ? counters_.hit_host : counters_.hit_device);
  return true;
}

void RadixCache::insert(const std::vector<int32_t>& tokens, const SequenceState& state, const float* logits) {
  const int64_t n = int64_t(tokens.size()), P = options_.page_tokens;
  if (!enabled() || n == 0 || state.n_tokens != n || state.has_checkpoint()) return;
  std::lock_guard<std::mutex> guard(mutex_);
  Node* node = &gen_->root;
  for (int64_t k = 0; k < n / P; ++k) {
    node = child(*node, tokens, k, true);
    Part& p = node->rows;
    p.last_used = ++clock_;
    if (p.in_memory()) continue;
    // New, or known only to storage: the rows come from this state.
    p.tokens = P;
    add_copy(p, 1, std::make_shared<Bytes>(state_rows(state, k * P, (k + 1) * P)));
    if (options_.write_policy == WritePolicy::WriteThrough)
      on_hit(p, node->key, node->parent->key, node->depth - P, node->page, RecordKind::Page);
  }
  const std::vector<int32_t> tail(tokens.begin() + node->depth, tokens.end());
  Checkpoint* c = nullptr;
  for (auto& e : node->checkpoints)
    if (e->tail == tail) c = e.get();
  if (c && c->part.in_memory() && (c->logits || !logits)) {
    c->part.last_used = ++clock_;
    evict();
    return;
  }
  if (c && c->locks > 0) return;  // in use: the copy it has serves
  if (!c) {
    node->checkpoints.push_back(std::make_unique<Checkpoint>());
    c = node->checkpoints.back().get();
    c->tail = tail;
    c->key = node->key;
    for (int32_t t : tail) c->key = chain_hash(c->key, t);
  } else {  // known only to storage, or without the logits this one has
    drop_copy(c->part, 1);
    drop_copy(c->part, 2);
    c->part = Part();
  }
  c->logits = logits != nullptr;
  c->part.tokens = int64_t(tail.size());
  c->part.last_used = ++clock_;
  add_copy(c->part, 1,
           checkpoint_blob(state_rows(state, node->depth, n), state_tail(state), logits, model_->config().vocab_size));
  if (options_.write_policy == WritePolicy::WriteThrough)
    on_hit(c->part, c->key, node->key, node->depth, c->tail, c->kind());
  evict();
}

void RadixCache::remove_checkpoint(Node& n, Checkpoint* c) {
  drop_copy(c->part, 1);
  drop_copy(c->part, 2);
  std::erase_if(n.checkpoints, [&](const auto& p) { return p.get() == c; });
  prune(&n);
}

// Page nodes that nothing needs any more (no checkpoint at or below them)
// leave the tree, from `n` up.
void RadixCache::prune(Node* n) {
  while (n->parent && n->children.empty() && n->checkpoints.empty() && n->locks == 0) {
    Node* parent = n->parent;
    drop_copy(n->rows, 1);
    drop_copy(n->rows, 2);
    parent->children.erase(n->page);
    n = parent;
  }
}

void RadixCache::evict() {
  while (evict_tier(1)) {
  }
  while (evict_tier(2)) {
  }
}

// One part leaves `tier` (the least recently used that may); false when the
// tier fits its budget or nothing may leave.
bool RadixCache::evict_tier(int tier) {
  const int64_t budget = tier == 1 ? options_.device_bytes : options_.host_bytes;
  if (used_[tier] <= budget) return false;
  const bool host = options_.host_bytes > 0;
  const bool write_back = options_.write_policy == WritePolicy::WriteBack;
  const bool storage = storage_ && storage_->enabled();
  Node* best_node = nullptr;
  Checkpoint* best_c = nullptr;
  uint64_t best_when = UINT64_MAX;
  // Whether the part may leave this tier: it is unlocked, and either it
  // stays somewhere (the other memory tier, L3, or the copy write_back makes
  // now) or nothing depends on it.
  auto may_leave = [&](const Part& p, bool removable) {
    if (!p.copy[tier]) return false;
    const int other = tier == 1 ? 2 : 1;
    if (p.copy[other] || p.l3) return true;
    if (write_back && ((tier == 1 && host) || (tier == 2 && storage))) return true;
    return removable;
  };
  std::vector<Node*> stack{&gen_->root};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [page, c] : n->children) stack.push_back(c.get());
    for (auto& c : n->checkpoints)
      if (c->locks == 0 && c->part.last_used < best_when && may_leave(c->part, true))
        best_when = c->part.last_used, best_node = n, best_c = c.get();
    if (n->parent && n->locks == 0 && n->rows.last_used < best_when &&
        may_leave(n->rows, n->children.empty() && n->checkpoints.empty()))
      best_when = n->rows.last_used, best_node = n, best_c = nullptr;
  }
  if (!best_node) return false;
  Part& p = best_c ? best_c->part : best_node->rows;
  if (write_back && tier == 1 && host && !p.copy[2]) {
    add_copy(p, 2, p.copy[1]);  // the same bytes: L1 lets go of them below
    counters_.backup_tokens += p.tokens;
  }
  if (write_back && tier == 2 && !p.copy[1]) {
    if (best_c)
      write_storage(p, best_c->kind(), best_c->key, best_node->key, best_node->depth, best_c->tail);
    else
      write_storage(p, RecordKind::Page, best_node->key, best_node->parent->key,
                    best_node->depth - options_.page_tokens, best_node->page);
  }
  drop_copy(p, tier);
  if (tier == 1)
    ++counters_.evictions_device, counters_.evicted_device_tokens += p.tokens;
  else
    ++counters_.evictions_host, counters_.evicted_host_tokens += p.tokens;
  if (!p.in_memory()) {
    // Out of memory: a checkpoint leaves the tree (storage, if it has it,
    // finds it again); a page stays as a skeleton while others depend on it.
    if (best_c)
      remove_checkpoint(*best_node, best_c);
    else
      prune(best_node);
  }
  return true;
}

// Reads from storage (L3 -> L2). When a request arrives, the I/O thread
// looks for the deepest checkpoint storage holds for its prompt, reads the
// pages the memory tiers lack and that checkpoint, verifies each record and
// adds them to the tree as host-tier parts, locked until the request starts.
std::shared_ptr<PrefetchTicket> RadixCache::prefetch(const std::vector<int32_t>& tokens, std::function<void()> wake) {
  if (!enabled() || !storage_ || !storage_->enabled() || tokens.empty()) return nullptr;
  auto ticket = std::make_shared<PrefetchTicket>();
  ticket->deadline = now_seconds() + options_.prefetch_timeout_base +
                     options_.prefetch_timeout_per_ki_token * double(tokens.size()) / 1024.0;
  storage_->run_async([this, tokens, ticket, wake = std::move(wake)] {
    try {
      // A bad record is deleted by the read; the next attempt plans around it.
      for (int attempt = 0; attempt < 4 && !run_prefetch(tokens, *ticket); ++attempt) {
      }
    } catch (const std::exception&) {
      // A failed read is a miss: the request computes what it lacks.
    }
    ticket->done = true;
    if (wake) wake();
  });
  return ticket;
}

// True when done (nothing worth reading, or read and adopted); false when a
// record failed its checks (it is gone now: plan again).
bool RadixCache::run_prefetch(const std::vector<int32_t>& tokens, PrefetchTicket& ticket) {
  const int64_t len = int64_t(tokens.size()), P = options_.page_tokens;
  std::vector<Hash128> h(size_t(len + 1));
  for (int64_t i = 0; i < len; ++i) h[size_t(i + 1)] = chain_hash(h[size_t(i)], tokens[size_t(i)]);
  int64_t memory_pos = 0, memory_pages = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Found f = find(*gen_, tokens, len, true);
    memory_pos = f.checkpoint ? f.position : 0;
    memory_pages = f.memory_pages;
  }
  // The deepest position with a checkpoint record whose pages are all in
  // memory or in storage.
  int64_t best = -1;
  RecordKind kind = RecordKind::Checkpoint;
  const int64_t floor = memory_pos + std::max<int64_t>(options_.prefetch_threshold, 1);
  for (int64_t n = len; n >= floor && best < 0; --n) {
    if (n == len) {
      if (!storage_->contains(RecordKind::CheckpointLogits, h[size_t(n)])) continue;
      kind = RecordKind::CheckpointLogits;
    } else if (storage_->contains(RecordKind::Checkpoint, h[size_t(n)])) {
      kind = RecordKind::Checkpoint;
    } else if (storage_->contains(RecordKind::CheckpointLogits, h[size_t(n)])) {
      kind = RecordKind::CheckpointLogits;
    } else {
      continue;
    }
    bool pages = true;
    for (int64_t k = memory_pages; k < n / P && pages; ++k)
      pages = storage_->contains(RecordKind::Page, h[size_t((k + 1) * P)]);
    if (pages) best = n;
  }
  if (best < 0) return true;
  std::vector<BytesPtr> read;  // pages memory_pages .. best / P - 1, then the checkpoint
  for (int64_t k = memory_pages; k < best / P; ++k) {
    read.push_back(storage_->read(RecordKind::Page, h[size_t((k + 1) * P)], h[size_t(k * P)], k * P,
                                  tokens.data() + k * P, P));
    if (!read.back()) return false;
  }
  const int64_t base = best / P * P;
  BytesPtr blob = storage_->read(kind, h[size_t(best)], h[size_t(base)], base, tokens.data() + base, best - base);
  if (!blob) return false;
  std::shared_ptr<void> lease;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int tier = options_.host_bytes > 0 ? 2 : 1;
    std::vector<Node*> path;
    Node* node = &gen_->root;
    for (int64_t k = 0; k < best / P; ++k) {
      node = child(*node, tokens, k, true);
      path.push_back(node);
      Part& p = node->rows;
      p.last_used = ++clock_;
      if (p.in_memory()) continue;
      if (k < memory_pages) {  // evicted since the plan: give up, the request computes it
        prune(node);
        return true;
      }
      p.tokens = P;
      p.l3 = p.from_storage = true;
      add_copy(p, tier, read[size_t(k - memory_pages)]);
    }
    Checkpoint* c = nullptr;
    const std::vector<int32_t> tail(tokens.begin() + base, tokens.begin() + best);
    for (auto& e : node->checkpoints)
      if (e->tail == tail && e->part.in_memory()) c = e.get();
    if (!c) {
      node->checkpoints.push_back(std::make_unique<Checkpoint>());
      c = node->checkpoints.back().get();
      c->tail = tail;
      c->logits = kind == RecordKind::CheckpointLogits;
      c->key = h[size_t(best)];
      c->part.tokens = best - base;
      c->part.l3 = c->part.from_storage = true;
      add_copy(c->part, tier, blob);
    }
    c->part.last_used = ++clock_;
    storage_->add_prefetched_tokens(best - memory_pos);
    lease = lock_parts(gen_, path, c);
    evict();
  }
  ticket.lease = std::move(lease);
  return true;
}

void RadixCache::flush() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gen_ = std::make_shared<Generation>();  // leases keep the old one until they end
    used_[1] = used_[2] = 0;
  }
  if (storage_) storage_->clear();
}

void RadixCache::drain_storage() {
  if (storage_) storage_->drain();
}

HiCacheMetrics RadixCache::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  HiCacheMetrics m = counters_;
  m.device_bytes = used_[1];
  m.host_bytes = used_[2];
  std::vector<const Node*> stack{&gen_->root};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (auto& [page, c] : n->children) stack.push_back(c.get());
    if (n->parent) {
      ++m.nodes;
      if (n->rows.copy[1]) m.device_tokens += n->rows.tokens;
      if (n->rows.copy[2]) m.host_tokens += n->rows.tokens;
      if (n->rows.in_memory()) m.row_bytes += n->rows.bytes, m.row_tokens += n->rows.tokens;
    }
    for (auto& c : n->checkpoints) {
      ++m.checkpoints;
      if (c->part.in_memory()) m.checkpoint_bytes += c->part.bytes, m.row_tokens += c->part.tokens;
      if (c->part.copy[1]) m.device_tokens += c->part.tokens;
      if (c->part.copy[2]) m.host_tokens += c->part.tokens;
    }
  }
  if (storage_) m.storage = storage_->metrics();
  return m;
}

}  // namespace dsv4
