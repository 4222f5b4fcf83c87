#include "runtime/model/tensor_slice.h"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

namespace piper::runtime {

torch::Tensor tensor_slice(const torch::Tensor& whole, const ParamSpec& spec, int64_t ways, int64_t coord) {
  torch::NoGradGuard no_grad;
  const int64_t dim = spec.shard_dim;
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& block : whole.chunk(spec.shard_blocks, dim)) {
    const int64_t per = block.size(dim) / ways;
    parts.push_back(block.narrow(dim, coord * per, per));
  }
  return torch::cat(parts, dim).contiguous().clone();
}

std::vector<SlicedParam> sliced_params(const nlohmann::json& region) {
  std::vector<SlicedParam> out;
  for (const auto& p : region.value("params", nlohmann::json::array()))
    if (p.contains("shard")) {
      ParamSpec spec;
      spec.shard_dim = p["shard"]["dim"].get<int32_t>();
      spec.shard_blocks = p["shard"].value("blocks", int64_t{1});
      out.push_back({p["name"].get<std::string>(), spec});
    }
  return out;
}

}  // namespace piper::runtime
