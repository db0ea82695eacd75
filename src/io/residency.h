// Whether the checkpoint's weights are mapped from its files or copied into
// huge-page memory (`--load-mode`, llama.cpp's names: auto, mmap, none).
//
// Mapped weights live in the page cache in 4 KiB pages: loading is quick
// and processes share them, but a decode step that streams gigabytes of
// weights takes a TLB miss every 4 KiB, which on a VM (two-level page
// walks) cost 10-40% of a batch-1 step (docs/kernels.md). Copied weights
// sit in transparent huge pages. `auto` copies when the checkpoint and the
// caches the server will allocate fit in the memory available, and maps
// otherwise; every choice is logged with its reason.
#pragma once
#include <cstdint>
#include <string>

#include "io/safetensors.h"

namespace dsv4 {

enum class LoadMode { Auto, Mmap, Copy };

// "auto" | "mmap" | "none" (copy: no mapping, as llama.cpp's --load-mode
// none and --no-mmap); false for anything else.
bool parse_load_mode(const std::string& name, LoadMode* mode);

struct ResidencyChoice {
  FileResidency residency = FileResidency::Mapped;
  std::string why;  // for the startup log
};

// Auto copies when checkpoint_bytes + reserved_bytes is at most
// kAutoCopyShare of available_bytes (-1: unknown, then it maps).
constexpr double kAutoCopyShare = 0.9;
ResidencyChoice choose_residency(LoadMode mode, int64_t checkpoint_bytes, int64_t reserved_bytes,
                                 int64_t available_bytes);

// The bytes of the checkpoint's .safetensors files under `path` (a
// directory or one file), which a copy reads into memory.
int64_t checkpoint_file_bytes(const std::string& path);

}  // namespace dsv4
