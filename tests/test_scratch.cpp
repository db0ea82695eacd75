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

// The model's transient arrays: a freed block is handed out again (a
// prefill must not fault in its half-gigabyte activations for every layer),
// and the engine's idle release returns the pool.
TEST(ScratchArray, FreedLargeBlockIsReused) {
  release_thread_scratch();
  const int64_t count = (int64_t(8) << 20) / 4;
  const float* first = nullptr;
  {
    ScratchArray<float> a(count, 1.5f);
    ASSERT_EQ(a.size(), count);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
    EXPECT_EQ(a[0], 1.5f);
    EXPECT_EQ(a[count - 1], 1.5f);
    first = a.data();
  }
  EXPECT_GE(thread_scratch_bytes(), size_t(8) << 20);  // kept in the pool
  ScratchArray<float> b(count - 1000);                 // a little smaller: same block
  EXPECT_EQ(b.data(), first);
  ScratchArray<float> c(count);  // the block is taken: a new one
  EXPECT_NE(c.data(), first);
}

TEST(ScratchArray, SmallRequestDoesNotTakeAMuchLargerBlock) {
  release_thread_scratch();
  const float* big = nullptr;
  {
    ScratchArray<float> a((int64_t(64) << 20) / 4);
    big = a.data();
  }
  {
    ScratchArray<float> small((int64_t(4) << 20) / 4);
    EXPECT_NE(small.data(), big);
  }
  ScratchArray<float> again((int64_t(60) << 20) / 4);
  EXPECT_EQ(again.data(), big);  // still there for a request of its size
}

TEST(ScratchArray, MoveHandsOverTheBlockAndReleaseEmptiesThePool) {
  release_thread_scratch();
  ScratchArray<int32_t> a((int64_t(4) << 20) / 4, 7);
  const int32_t* p = a.data();
  ScratchArray<int32_t> b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0);
  EXPECT_EQ(b[12345], 7);
  b = ScratchArray<int32_t>();
  EXPECT_GE(thread_scratch_bytes(), size_t(4) << 20);
  release_thread_scratch();
  EXPECT_EQ(thread_scratch_bytes(), 0u);
}
