// The kernels' per-thread scratch: reused between calls (a prefill must not
// fault in fresh pages for every matrix product) and handed back when the
// engine goes idle (a server's memory returns to its baseline).
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "core/scratch.h"

using namespace dsv4;

TEST(Scratch, SlotIsReusedAndOnlyGrows) {
  release_thread_scratch();
  auto* a = static_cast<uint8_t*>(thread_scratch(ScratchSlot::LinearInput, 1000));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  a[999] = 7;
  // A smaller request gets the same memory, contents kept.
  auto* b = static_cast<uint8_t*>(thread_scratch(ScratchSlot::LinearInput, 10));
  EXPECT_EQ(a, b);
  EXPECT_EQ(b[999], 7);
  // A larger one gets enough memory for all of it.
  auto* c = static_cast<uint8_t*>(thread_scratch(ScratchSlot::LinearInput, size_t(5) << 20));
  c[(size_t(5) << 20) - 1] = 1;
  EXPECT_GE(thread_scratch_bytes(), size_t(5) << 20);
  // Slots are independent.
  auto* d = static_cast<uint8_t*>(thread_scratch(ScratchSlot::GemmPanel, 64));
  EXPECT_NE(d, c);
}

TEST(Scratch, ReleaseFreesTheCallingThreadsSlots) {
  thread_scratch(ScratchSlot::GemmSums, size_t(8) << 20);
  EXPECT_GE(thread_scratch_bytes(), size_t(8) << 20);
  size_t other_thread_bytes = 0;
  std::thread([&] { other_thread_bytes = thread_scratch_bytes(); }).join();
  EXPECT_EQ(other_thread_bytes, 0u);  // per thread
  release_thread_scratch();
  EXPECT_EQ(thread_scratch_bytes(), 0u);
}
