// Decoding the cached FP8 rows of a decode state (kernels/backend.h,
// Fp8RowsView) to floats: value = e4m3(code) * e8m0(block scale) for the
// first `nope` values of a row, the RoPE floats copied for the rest. Every
// path gives the scalar table lookup's bits, NaN codes included. Whole rows
// into memory: decode_fp8_rows (kernels/cpu/ops.h), here too.
#pragma once
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace dsv4::cpu {

// Values [d0, d1) of row `id`, written to row[d0, d1) (`row` is the start of
// the whole decoded row, so that a caller can decode part of a row in
// place). d0 and d1 are within [0, rows.width].
void decode_fp8_row(KernelIsa isa, const Fp8RowsView& rows, int64_t id, int64_t d0, int64_t d1, float* row);
// Asks for the bytes that decoding values [d0, d1) of row `id` reads.
void prefetch_fp8_row(const Fp8RowsView& rows, int64_t id, int64_t d0, int64_t d1);

}  // namespace dsv4::cpu
