// Per-thread scratch memory for the kernels, kept between calls.
//
// A 4096-token prefill runs hundreds of matrix products whose inputs are
// repacked into buffers of up to 128 MB. Fresh vectors for each call cost a
// page fault and a kernel-zeroed page for every 4 KB (glibc maps blocks over
// 32 MB anew on every allocation), which was about 8% of a prefill. A slot
// grows to the largest size asked of it and is not zero-filled; the engine
// releases the calling thread's slots when it goes idle, so that a server's
// memory returns to its baseline.
#pragma once
#include <cstddef>
#include <cstdint>

namespace dsv4 {

enum class ScratchSlot : int { LinearInput, LinearRow, GemmPanel, GemmRows, GemmLanes, GemmSums, Count };

// `bytes` of 64-byte aligned memory owned by the calling thread, valid until
// the thread's next request for the same slot or release_thread_scratch().
void* thread_scratch(ScratchSlot slot, size_t bytes);

template <class T>
T* thread_scratch_array(ScratchSlot slot, int64_t count) {
  return static_cast<T*>(thread_scratch(slot, size_t(count) * sizeof(T)));
}

// Frees the calling thread's slots.
void release_thread_scratch();
// Bytes the calling thread's slots hold now.
size_t thread_scratch_bytes();

}  // namespace dsv4
