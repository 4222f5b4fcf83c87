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

// Where a tensor-parallel slice lies in its whole parameter: what a checkpoint records beside the
// slice's element range, so a plan that cuts the parameter another way (or not at all) reads it back.
struct SliceOf {
  int32_t dim = -1;  // -1: not a slice (the whole parameter)
  int64_t blocks = 1, ways = 1, coord = 0;
  std::vector<int64_t> shape;  // the whole parameter's
  bool sliced() const { return dim >= 0; }
  bool operator==(const SliceOf&) const = default;
};
SliceOf slice_of(const ParamSpec& spec, int64_t ways, int64_t coord);
nlohmann::json slice_json(const SliceOf& s);
SliceOf slice_from_json(const nlohmann::json& j);  // throws std::runtime_error on a malformed entry
// The elements of `whole` that slice `s` holds, in the slice's own order; and the inverse, writing
// `slice` (any shape with that many elements) into its place in `whole`.
torch::Tensor take_slice(const torch::Tensor& whole, const SliceOf& s);
void place_slice(const torch::Tensor& whole, const torch::Tensor& slice, const SliceOf& s);

// A region's manifest entry as JSON (what piper-model measures before the manifest is parsed): its
// parameters that say how they shard ("params[].shard"), each by name with that split. The runtime's
// one reader of it; lang/manifest.cpp validates the same field when a manifest is loaded.
struct SlicedParam {
  std::string name;
  ParamSpec spec;
};
std::vector<SlicedParam> sliced_params(const nlohmann::json& region);

}  // namespace piper::runtime
