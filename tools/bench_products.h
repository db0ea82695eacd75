// The weight products of a timed run by kind (TimedBackend::products): the
// line `dsv4 bench` prints after each split, and its CSV rows.
#pragma once
#include <cstdint>
#include <ostream>

#include "kernels/timed_backend.h"
#include "machine_limits.h"

namespace dsv4::tools {

// Prints the line: each kind with its time and bytes per step (divided by
// `steps`; `per` says what a step is) and the rate it read them at, so that
// the product keeping a step from its roofline shows by name. `csv` (may be
// null) gets rows `<phase>_product_<kind>` with the seconds, the bytes per
// token and the rate. With `limits`, each kind also gets the share of its
// own floor it ran at (product_floor_seconds), so that a product bound by
// its decoding shows apart from one that falls short of it.
void print_products(const TimedBackend& timed, const char* phase, int64_t batch, int64_t tokens, double steps,
                    const char* per, std::ostream* csv, const MachineLimits* limits = nullptr);

// The least time a kind's products can take on this machine: the longer of
// its bytes at the read bandwidth and its compute floor
// (decoding_floor_seconds, bench_costs.h, as the batches' rooflines).
double product_floor_seconds(const TimedBackend::ProductAccount& p, const MachineLimits& limits);

}  // namespace dsv4::tools
