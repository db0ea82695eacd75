#include "core/aligned.h"

#include <sys/mman.h>

namespace dsv4 {

void* allocate_huge_pages(std::size_t& bytes) {
  constexpr std::size_t kHugePage = std::size_t(2) << 20;
  bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, bytes);
  if (!p) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void touch_huge_pages(const void* p, std::size_t bytes) {
  constexpr std::size_t kHugePage = std::size_t(2) << 20;
  const auto* bytes_in = static_cast<const volatile unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; i += kHugePage) (void)bytes_in[i];
}

}  // namespace dsv4
