// The identity of a checkpoint, for records that must only ever be read by
// the model that wrote them (the prefix cache's disk tier): config.json as
// it is, and for every safetensors file its name, size, header (names,
// shapes, dtypes, offsets) and four 64 KiB samples of its data. Two
// checkpoints of one shape with other weights (a fine-tune, another random
// seed) differ in the samples; reading all the weights would take minutes
// for a real checkpoint.
#pragma once
#include <string>

namespace dsv4 {

// 32 hex digits. Throws Error when the directory has no config.json.
std::string model_fingerprint(const std::string& model_dir);

}  // namespace dsv4
