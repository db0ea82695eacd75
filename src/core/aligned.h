// Cache-line aligned storage for SIMD buffers. A 64-byte vector load that
// straddles two cache lines costs about twice as much; std::vector only
// guarantees 16-byte alignment, which halved the speed of the batched
// kernels (every 512-bit load split).
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace dsv4 {

template <class T, std::size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kAlign)); }
  bool operator==(const AlignedAllocator&) const { return true; }
  bool operator!=(const AlignedAllocator&) const { return false; }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace dsv4
