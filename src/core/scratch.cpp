#include "core/scratch.h"

#include <array>
#include <cstdlib>
#include <new>

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

}  // namespace

void* thread_scratch(ScratchSlot which, size_t bytes) {
  Slot& s = t_scratch.slots[size_t(which)];
  if (bytes > s.bytes) {
    std::free(s.data);
    s.data = nullptr;
    s.bytes = 0;
    // Whole 2 MB pages, so that transparent huge pages can back large slots.
    const size_t granule = bytes >= (size_t(4) << 20) ? (size_t(2) << 20) : 64;
    const size_t rounded = (bytes + granule - 1) / granule * granule;
    void* p = std::aligned_alloc(granule == 64 ? 64 : granule, rounded);
    if (!p) throw std::bad_alloc();
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
}

size_t thread_scratch_bytes() {
  size_t total = 0;
  for (const Slot& s : t_scratch.slots) total += s.bytes;
  return total;
}

}  // namespace dsv4
