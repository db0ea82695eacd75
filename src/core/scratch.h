// Per-thread scratch memory for the kernels, kept between calls.
//
// A 4096-token prefill runs hundreds of matrix products whose inputs are
// repacked into buffers of up to 128 MB. Fresh vectors for each call cost a
// page fault and a kernel-zeroed page for every 4 KB (glibc maps blocks over
// 32 MB anew on every allocation), which was about 8% of a prefill. A slot
// grows to the largest size asked of it and is not zero-filled; the engine
// releases the calling thread's slots when it goes idle, so that a server's
// memory returns to its baseline.
//
// The model's own transient arrays (a layer's activations: 0.5 GB for the
// queries of a 4096-token prefill) are ScratchArrays: blocks of 1 MB and
// more come from a per-thread pool of freed blocks instead of a fresh
// mapping each: in a 4096-token prefill's profile, page faults and kernel
// page zeroing went from 4.4% of the samples to 1.8%.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace dsv4 {

enum class ScratchSlot : int {
  LinearInput,
  LinearRow,
  DecodedRows,
  ScaledInput,
  GemmPanel,
  GemmRows,
  GemmLanes,
  GemmSums,
  IndexerKeys,
  IndexerDots,
  AttentionScores,
  AttentionKeyTile,
  Count
};

// `bytes` of 64-byte aligned memory owned by the calling thread, valid until
// the thread's next request for the same slot or release_thread_scratch().
void* thread_scratch(ScratchSlot slot, size_t bytes);

template <class T>
T* thread_scratch_array(ScratchSlot slot, int64_t count) {
  return static_cast<T*>(thread_scratch(slot, size_t(count) * sizeof(T)));
}

// Frees the calling thread's slots and its pool of free array blocks.
void release_thread_scratch();
// Bytes the calling thread's slots and free array blocks hold now.
size_t thread_scratch_bytes();

// Array blocks: at least `bytes` bytes, 64-byte aligned. Large ones come from
// the calling thread's pool (the smallest free block that fits) and go back
// to the pool of the thread that gives them back.
struct ArrayBlock {
  void* data = nullptr;
  size_t bytes = 0;  // the block's own size, at least the size asked for
};
ArrayBlock acquire_array_block(size_t bytes);
void give_back_array_block(ArrayBlock block);

// A fixed-size array of trivially copyable T, not initialized unless a fill
// value is given, whose memory comes from and returns to the pool above.
template <class T>
class ScratchArray {
  static_assert(std::is_trivially_copyable_v<T>, "the pool hands out raw memory");

 public:
  ScratchArray() = default;
  explicit ScratchArray(int64_t count) : block_(acquire_array_block(size_t(count) * sizeof(T))), count_(count) {}
  ScratchArray(int64_t count, T fill) : ScratchArray(count) { std::fill_n(data(), count, fill); }
  ScratchArray(ScratchArray&& other) noexcept
      : block_(std::exchange(other.block_, ArrayBlock{})), count_(std::exchange(other.count_, 0)) {}
  ScratchArray& operator=(ScratchArray&& other) noexcept {
    if (this != &other) {
      reset();
      block_ = std::exchange(other.block_, ArrayBlock{});
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ScratchArray(const ScratchArray&) = delete;
  ScratchArray& operator=(const ScratchArray&) = delete;
  ~ScratchArray() { reset(); }

  T* data() { return static_cast<T*>(block_.data); }
  const T* data() const { return static_cast<const T*>(block_.data); }
  int64_t size() const { return count_; }
  T& operator[](int64_t i) { return data()[i]; }
  const T& operator[](int64_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + count_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + count_; }

 private:
  void reset() {
    if (block_.data) give_back_array_block(block_);
    block_ = ArrayBlock{};
    count_ = 0;
  }
  ArrayBlock block_;
  int64_t count_ = 0;
};

}  // namespace dsv4
