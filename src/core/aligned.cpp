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

}  // namespace dsv4
