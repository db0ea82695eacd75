#include "core/aligned.h"

#include <sys/mman.h>

namespace dsv4 {

void* allocate_huge_pages(std::size_t& bytes) {
  bytes = whole_huge_pages(bytes);
  void* p = std::aligned_alloc(kHugePageBytes, bytes);
  if (!p) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void touch_huge_pages(const void* p, std::size_t bytes) {
  const auto* bytes_in = static_cast<const volatile unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; i += kHugePageBytes) (void)bytes_in[i];
}

}  // namespace dsv4
