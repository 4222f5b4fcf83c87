// One rank's slice of a tensor-parallel parameter, as its manifest entry says how it splits.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "lang/manifest.h"

namespace piper::runtime {

// Coordinate `coord` of `ways`: dimension spec.shard_dim cut in spec.shard_blocks blocks, each
// block's coord-th part, the parts concatenated (a fused q/k/v weight keeps q, k and v apart).
torch::Tensor tensor_slice(const torch::Tensor& whole, const ParamSpec& spec, int64_t ways, int64_t coord);

// A region's manifest entry as JSON (what piper-model measures before the manifest is parsed): its
// parameters that say how they shard ("params[].shard"), each by name with that split. The runtime's
// one reader of it; lang/manifest.cpp validates the same field when a manifest is loaded.
struct SlicedParam {
  std::string name;
  ParamSpec spec;
};
std::vector<SlicedParam> sliced_params(const nlohmann::json& region);

}  // namespace piper::runtime
