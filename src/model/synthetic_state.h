// A decode state as if `tokens` tokens had been prefilled, without running
// them: every cached row a long context leaves (window ring, compressed
// rows, indexer keys, V4.1's FP4 rows and token ids) filled with random
// values in its exact storage format. `dsv4 bench --context N` decodes from
// it: what a decode step costs at 1M tokens of context depends on how many
// rows it reads and scores, not on their values, and prefilling 1M tokens
// would take hours on a CPU. The outputs are meaningless.
#pragma once
#include <cstdint>

#include "model/state.h"

namespace dsv4 {

SequenceState synthetic_context_state(const ModelConfig& config, int64_t tokens, uint64_t seed);

}  // namespace dsv4
