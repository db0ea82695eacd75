// Cache-line aligned storage for SIMD buffers. A 64-byte vector load that
// straddles two cache lines costs about twice as much; std::vector only
// guarantees 16-byte alignment, which halved the speed of the batched
// kernels (every 512-bit load split).
#pragma once
#include <cstddef>
#include <cstdlib>
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

// The transparent huge page size of x86-64.
constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;
// `bytes` rounded up to whole huge pages.
constexpr std::size_t whole_huge_pages(std::size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

// Large buffers (weights, the kernels' scratch, activations) in whole 2 MB
// pages, aligned to them and marked for transparent huge pages (advisory:
// ignored where THP is off; needed where it is in `madvise` mode): a
// product that streams many rows at once otherwise also pays a TLB miss
// every 4 KB. Rounds `bytes` up to the size allocated; free with std::free.
void* allocate_huge_pages(std::size_t& bytes);

// Reads one byte of each 2 MB page of [p, p + bytes). On the development VM
// (Firecracker, Linux 6.18, AMD Zen 5) the first pass over a huge page made
// read-only by mprotect read at 4-6 GB/s on one core against 26-37 GB/s on
// later passes, with no page fault counted; one load per page first (18 ms
// for 6 GB) removes that (docs/loading.md, "The first read after write
// protection"; bench/bench_first_read.cpp measures it).
void touch_huge_pages(const void* p, std::size_t bytes);

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(std::size_t n) {
    std::size_t bytes = n * sizeof(T);
    return static_cast<T*>(allocate_huge_pages(bytes));
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  bool operator==(const HugePageAllocator&) const { return true; }
  bool operator!=(const HugePageAllocator&) const { return false; }
};

}  // namespace dsv4
