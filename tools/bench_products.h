// The weight products of a timed run by kind (TimedBackend::products): the
// line `dsv4 bench` prints after each split, and its CSV rows.
#pragma once
#include <cstdint>
#include <ostream>

#include "kernels/timed_backend.h"

namespace dsv4::tools {

// Prints the line: each kind with its time and bytes per step (divided by
// `steps`; `per` says what a step is) and the rate it read them at, so that
// the product keeping a step from its roofline shows by name. `csv` (may be
// null) gets rows `<phase>_product_<kind>` with the seconds, the bytes per
// token and the rate.
void print_products(const TimedBackend& timed, const char* phase, int64_t batch, int64_t tokens, double steps,
                    const char* per, std::ostream* csv);

}  // namespace dsv4::tools
