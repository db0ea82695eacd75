// A decode state cut into the two kinds of pieces a prefix cache keeps
// (docs/hicache.md):
//  - rows: the compressed rows, V4.1 FP4 rows and indexer keys that the
//    tokens (from, to] completed. A later token never rewrites them, so every
//    sequence with the same prefix shares them;
//  - a tail: what only the position itself has: the window rings, the
//    compressors' partial windows (only the slots a later token reads) and
//    the token counts.
// A state after n tokens is rebuilt byte-exactly (in every byte a later
// token reads) from the rows of (0, n] in any number of consecutive ranges
// plus the tail taken at n. The forward pass is chunk-invariant, so resuming
// from it gives the bits of a cold run.
#pragma once
#include <cstdint>
#include <vector>

#include "model/state.h"

namespace dsv4 {

// Rows completed by tokens (from, to] of every layer (main, then MTP),
// serialized with their counts. `s` must hold at least `to` tokens.
std::vector<uint8_t> state_rows(const SequenceState& s, int64_t from, int64_t to);
// Appends rows made by state_rows(.., from, to) to `s`, which must hold the
// rows of exactly `from` tokens (a fresh state for from = 0). Throws Error
// when the bytes do not fit the model's layout or those positions.
void append_state_rows(SequenceState& s, const uint8_t* data, size_t size, int64_t from, int64_t to);

// The tail of `s` at its current position (no open checkpoint allowed).
std::vector<uint8_t> state_tail(const SequenceState& s);
// Sets the tail of `s`, which holds the rows of the tail's position; the
// V4.1 token ids come from `tokens` (the prefix the tail belongs to).
// Throws Error on a layout mismatch; `s` is unchanged then.
void restore_state_tail(SequenceState& s, const uint8_t* data, size_t size, const std::vector<int32_t>& tokens);
// Token count a serialized tail belongs to (-1: not a tail).
int64_t state_tail_tokens(const uint8_t* data, size_t size);

}  // namespace dsv4
