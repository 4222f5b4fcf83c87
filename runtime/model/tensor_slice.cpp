#include "runtime/model/tensor_slice.h"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

namespace piper::runtime {

torch::Tensor tensor_slice(const torch::Tensor& whole, const ParamSpec& spec, int64_t ways, int64_t coord) {
  SliceOf s = slice_of(spec, ways, coord);
  s.shape = whole.sizes().vec();  // callers may pass a spec that says only how it splits
  return take_slice(whole, s);
}

SliceOf slice_of(const ParamSpec& spec, int64_t ways, int64_t coord) {
  if (!spec.sharded()) return SliceOf{.shape = spec.shape};
  return SliceOf{spec.shard_dim, spec.shard_blocks, ways, coord, spec.shape};
}

nlohmann::json slice_json(const SliceOf& s) {
  return {{"dim", s.dim}, {"blocks", s.blocks}, {"ways", s.ways}, {"coord", s.coord}, {"shape", s.shape}};
}

SliceOf slice_from_json(const nlohmann::json& j) {
  SliceOf s;
  try {
    s = SliceOf{j.at("dim").get<int32_t>(), j.at("blocks").get<int64_t>(), j.at("ways").get<int64_t>(),
                j.at("coord").get<int64_t>(), j.at("shape").get<std::vector<int64_t>>()};
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("a tensor-parallel slice entry is malformed: ") + e.what());
  }
  const bool ok = s.dim >= 0 && s.dim < int32_t(s.shape.size()) && s.blocks > 0 && s.ways > 0 && s.coord >= 0 &&
                  s.coord < s.ways && s.shape[size_t(s.dim)] % (s.blocks * s.ways) == 0;
  if (!ok) throw std::runtime_error("a tensor-parallel slice entry does not fit its parameter's shape: " + j.dump());
  return s;
}

namespace {
// The parts of `whole` (viewed with the slice's whole shape) that slice `s` holds, block by block.
std::vector<torch::Tensor> slice_parts(const torch::Tensor& whole, const SliceOf& s) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& block : whole.view(s.shape).chunk(s.blocks, s.dim)) {
    const int64_t per = block.size(s.dim) / s.ways;
    parts.push_back(block.narrow(s.dim, s.coord * per, per));
  }
  return parts;
}
}  // namespace

torch::Tensor take_slice(const torch::Tensor& whole, const SliceOf& s) {
  torch::NoGradGuard no_grad;
  if (!s.sliced()) return whole.contiguous().clone();
  return torch::cat(slice_parts(whole, s), s.dim).contiguous().clone();
}

void place_slice(const torch::Tensor& whole, const torch::Tensor& slice, const SliceOf& s) {
  torch::NoGradGuard no_grad;
  if (!s.sliced()) return void(whole.view({-1}).copy_(slice.reshape({-1})));
  std::vector<int64_t> shape = s.shape;
  shape[size_t(s.dim)] /= s.ways;  // the slice's own shape
  const std::vector<torch::Tensor> from = slice.reshape(shape).chunk(s.blocks, s.dim), to = slice_parts(whole, s);
  for (size_t b = 0; b < to.size(); ++b) to[b].copy_(from[b]);
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
