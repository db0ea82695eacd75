// How fast the cores turn checkpoint weights into fp32 lanes: the
// batched-decode floor of `dsv4 bench`. A decode step of b sequences decodes
// each weight it reads once, for all b tokens, and then pays one fp32 FMA
// lane per weight and token. On a CPU the decoding (FP4: a table lookup and
// an index shift per 16 weights; FP8: a widening, two conversions and a
// scale) competes with the FMAs for the same vector ports, so once the bytes
// of a step are cheap enough (few cores: little compute per GB/s) the step is
// bound by decoding + FMAs, not by the bytes nor by the FLOPs alone.
#pragma once
#include <array>

namespace dsv4::tools {

// Weights per second, all threads together, that dsv4's register kernels
// multiply with one token when the weights sit in the cache (a 4 MB matrix
// per core: no DRAM traffic): the decoding plus one FMA lane per weight, for
// F32, BF16, FP8 and FP4 (indexed by WeightFormat).
std::array<double, 4> measure_one_token_weight_rates();

}  // namespace dsv4::tools
