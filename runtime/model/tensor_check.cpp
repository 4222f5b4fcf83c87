// `piper-model verify --tp N`: every region with a tensor-parallel layout, run as N slices by the
// contract (docs/models.md) and summed, against the region whole: forward and every gradient.
#include <fmt/format.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "runtime/model/region_model.h"
#include "runtime/model/region_model_impl.h"
#include "runtime/model/tensor_slice.h"

namespace piper::runtime {

namespace {
double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0 : INFINITY;
  return (a - b).abs().max().item<double>();
}

// One region: slices k = 0..ways-1 of its sharded parameters in clones of its module.
TensorCheck check_region(torch::jit::Module m, const nlohmann::json& r, int64_t ways, int64_t batch) {
  TensorCheck c;
  c.region = r["name"].get<std::string>();
  std::vector<int64_t> shape{batch};
  for (const auto& d : r["input"]["shape"]) shape.push_back(d.get<int64_t>());
  const auto sliced = sliced_params(r);
  torch::Tensor x = torch::randn(shape).requires_grad_(true);
  std::vector<torch::Tensor> whole_inputs{x};
  for (const auto& p : m.parameters()) whole_inputs.push_back(p);
  torch::Tensor y = m.forward({x}).toTensor();
  torch::Tensor dy = torch::randn_like(y);
  auto whole = torch::autograd::grad({y}, whole_inputs, {dy}, /*retain_graph=*/false, false, /*allow_unused=*/true);
  try {
    std::vector<torch::jit::Module> parts;
    std::vector<torch::Tensor> inputs{x};
    for (const auto& p : m.parameters()) inputs.push_back(p);
    for (int64_t k = 0; k < ways; ++k) {
      torch::jit::Module part = m.clone();
      for (const SlicedParam& s : sliced) {
        torch::Tensor t = tensor_slice(m.attr(s.name).toTensor(), s.spec, ways, k).requires_grad_(true);
        part.setattr(s.name, t);
        inputs.push_back(t);
      }
      parts.push_back(part);
    }
    torch::Tensor h = m.run_method("tp_enter", x).toTensor();
    torch::Tensor sum;
    for (auto& part : parts) {
      torch::Tensor p = part.run_method("tp_partial", h).toTensor();
      sum = sum.defined() ? sum + p : p;
    }
    torch::Tensor y2 = m.run_method("tp_exit", x, sum).toTensor();
    c.max_output_diff = max_diff(y, y2);
    auto got = torch::autograd::grad({y2}, inputs, {dy}, false, false, true);
    // x and the whole module's parameters: the replicated ones must match; the sharded ones went unused.
    const auto names = m.named_parameters();
    size_t i = 1;
    c.max_grad_diff = max_diff(whole[0], got[0]);
    std::map<std::string, torch::Tensor> whole_grad;
    for (const auto& p : names) {
      whole_grad[p.name] = whole[i];
      const bool is_sliced = std::any_of(sliced.begin(), sliced.end(), [&](const SlicedParam& s) { return s.name == p.name; });
      if (!is_sliced) c.max_grad_diff = std::max(c.max_grad_diff, max_diff(whole[i], got[i]));
      ++i;
    }
    for (int64_t k = 0; k < ways; ++k)
      for (const SlicedParam& s : sliced) {
        const torch::Tensor want = tensor_slice(whole_grad.at(s.name), s.spec, ways, k);
        c.max_grad_diff = std::max(c.max_grad_diff, max_diff(want, got[i++]));
      }
  } catch (const c10::Error& e) {
    c.error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    c.error = e.what();
  }
  return c;
}
}  // namespace

std::vector<TensorCheck> RegionModel::check_tensor_parallel(int64_t ways, int64_t batch, uint64_t seed) {
  torch::manual_seed(seed);
  impl_->root.eval();
  const auto j = nlohmann::json::parse(impl_->manifest);
  std::vector<TensorCheck> out;
  for (const auto& r : j["regions"]) {
    if (!r.contains("tp") || !r.contains("input")) continue;
    const int64_t count = r["tp"].value("count", int64_t{0});
    if (count % ways != 0) {
      out.push_back(TensorCheck{r["name"].get<std::string>(), 0, 0,
                                fmt::format("its {} {} do not divide by {}", count, r["tp"].value("dim", ""), ways)});
      continue;
    }
    out.push_back(check_region(impl_->region(r["name"].get<std::string>()), r, ways, batch));
  }
  return out;
}

}  // namespace piper::runtime
