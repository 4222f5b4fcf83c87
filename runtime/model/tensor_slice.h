// One rank's slice of a tensor-parallel parameter, as its manifest entry says how it splits.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include "lang/manifest.h"

namespace piper::runtime {

// Coordinate `coord` of `ways`: dimension spec.shard_dim cut in spec.shard_blocks blocks, each
// block's coord-th part, the parts concatenated (a fused q/k/v weight keeps q, k and v apart).
torch::Tensor tensor_slice(const torch::Tensor& whole, const ParamSpec& spec, int64_t ways, int64_t coord);

}  // namespace piper::runtime
