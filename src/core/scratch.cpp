#include "core/scratch.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <new>
#include <vector>

#include "core/aligned.h"

namespace dsv4 {
namespace {

struct Slot {
  void* data = nullptr;
  size_t bytes = 0;
};

struct ThreadScratch {
  std::array<Slot, size_t(ScratchSlot::Count)> slots;
  ~ThreadScratch() {
    for (Slot& s : slots) std::free(s.data);
  }
};

thread_local ThreadScratch t_scratch;

// Blocks below this size come from malloc, which reuses them well; above
// it glibc maps each block anew (from 32 MB on) or trims freed ones.
constexpr size_t kPooledBlockBytes = size_t(1) << 20;

// Free array blocks of one thread.
struct ArrayPool {
  std::vector<ArrayBlock> free_blocks;
  size_t bytes() const {
    size_t total = 0;
    for (const ArrayBlock& b : free_blocks) total += b.bytes;
    return total;
  }
  void free_all() {
    for (const ArrayBlock& b : free_blocks) std::free(b.data);
    free_blocks.clear();
  }
  ~ArrayPool() { free_all(); }
};

thread_local ArrayPool t_pool;

}  // namespace

ArrayBlock acquire_array_block(size_t bytes) {
  if (bytes < kPooledBlockBytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    return {p, rounded};
  }
  std::vector<ArrayBlock>& blocks = t_pool.free_blocks;
  auto best = blocks.end();
  for (auto it = blocks.begin(); it != blocks.end(); ++it)
    if (it->bytes >= bytes && (best == blocks.end() || it->bytes < best->bytes)) best = it;
  if (best != blocks.end() && best->bytes / 2 <= bytes) {
    const ArrayBlock block = *best;
    blocks.erase(best);
    return block;
  }
  // Nothing fits (a block over twice the size stays for a larger request):
  // the free blocks that are too small go, so that the pool holds about the
  // largest working set, not every size ever asked for.
  std::erase_if(blocks, [&](const ArrayBlock& b) {
    if (b.bytes >= bytes) return false;
    std::free(b.data);
    return true;
  });
  size_t rounded = bytes;
  void* p = allocate_huge_pages(rounded);
  return {p, rounded};
}

void give_back_array_block(ArrayBlock block) {
  if (block.bytes < kPooledBlockBytes)
    std::free(block.data);
  else
    t_pool.free_blocks.push_back(block);
}

void* thread_scratch(ScratchSlot which, size_t bytes) {
  Slot& s = t_scratch.slots[size_t(which)];
  if (bytes > s.bytes) {
    std::free(s.data);
    s.data = nullptr;
    s.bytes = 0;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = nullptr;
    if (bytes >= (size_t(4) << 20)) {
      p = allocate_huge_pages(rounded);
    } else {
      p = std::aligned_alloc(64, rounded);
      if (!p) throw std::bad_alloc();
    }
    s.data = p;
    s.bytes = rounded;
  }
  return s.data;
}

void release_thread_scratch() {
  for (Slot& s : t_scratch.slots) {
    std::free(s.data);
    s = Slot{};
  }
  t_pool.free_all();
}

size_t thread_scratch_bytes() {
  size_t total = 0;
  for (const Slot& s : t_scratch.slots) total += s.bytes;
  return total + t_pool.bytes();
}

}  // namespace dsv4
