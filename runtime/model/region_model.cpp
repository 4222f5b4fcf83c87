#include "runtime/model/region_model.h"
#include "runtime/model/region_model_impl.h"

#include <fmt/format.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace piper::runtime {

// `layers_3.attn` or `layers.3`: walk the attribute path from the root module.
torch::jit::Module submodule(const torch::jit::Module& root, const std::string& path) {
  torch::jit::Module cur = root;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur.hasattr(part)) throw std::runtime_error(fmt::format("no submodule '{}' (looking for '{}')", part, path));
    cur = cur.attr(part).toModule();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

torch::jit::Module RegionModel::Impl::region(const std::string& name) const {
  auto it = module_of.find(name);
  return submodule(root, it == module_of.end() ? name : it->second);
}

namespace {
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}
}  // namespace

void plain_interpreter() { torch::jit::setGraphExecutorOptimize(false); }

RegionModel::RegionModel(const std::string& path) : impl_(std::make_unique<Impl>()) {
  plain_interpreter();
  std::unordered_map<std::string, std::string> extra{{"piper/manifest.json", ""}};
  try {
    impl_->root = torch::jit::load(path, c10::nullopt, extra);
  } catch (const c10::Error& e) {
    throw std::runtime_error(fmt::format("{}: not a loadable TorchScript model: {}", path, e.what_without_backtrace()));
  }
  impl_->manifest = extra["piper/manifest.json"];
  if (impl_->manifest.empty())
    throw std::runtime_error(fmt::format("{}: has no piper/manifest.json (save it with piper-model or python/piper_export.py)", path));
  auto j = nlohmann::json::parse(impl_->manifest, nullptr, false);
  if (j.is_discarded() || !j.contains("sequence") || !j.contains("regions"))
    throw std::runtime_error(fmt::format("{}: piper/manifest.json is not a region manifest", path));
  auto& module_of = impl_->module_of;
  for (const auto& r : j["regions"]) module_of[r.value("name", "")] = r.value("module", r.value("name", ""));
  for (const auto& name : j["sequence"]) {
    std::string n = name.get<std::string>();
    impl_->sequence.push_back(n);
    try {
      impl_->modules.push_back(submodule(impl_->root, module_of.count(n) ? module_of[n] : n));
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{}: region '{}': {}", path, n, e.what()));
    }
  }
  // Tied weights (one tensor under two names, e.g. an embedding and the output head) are trained as
  // one only where the manifest declares them (`ties`: the plan then sums their copies' gradients);
  // an undeclared one would become independent copies on different stages, or be stepped twice on one.
  std::set<std::pair<std::string, std::string>> declared;  // tied pairs of full parameter names
  if (j.contains("ties") && j["ties"].is_array())
    for (const auto& tie : j["ties"]) {
      std::vector<std::string> names;
      for (const auto& m : tie)
        names.push_back(module_of[m.value("region", "")] + "." + m.value("param", ""));
      for (const auto& a : names)
        for (const auto& b : names) declared.emplace(a, b);
    }
  std::map<const void*, std::string> seen;
  for (const auto& p : impl_->root.named_parameters()) {
    if (p.value.numel() == 0) continue;
    auto [it, fresh] = seen.emplace(p.value.data_ptr(), p.name);
    if (!fresh && !declared.count({it->second, p.name}))
      throw std::runtime_error(fmt::format("{}: parameters '{}' and '{}' are one tensor (tied weights) that the manifest "
                                           "does not declare; declare them in \"ties\" (python/piper_export.py does "
                                           "it for you) so that Piper keeps the copies in sync, or untie them",
                                           path, it->second, p.name));
  }
  impl_->seq_len = j.contains("input") ? j["input"]["shape"][0].get<int64_t>() : 0;
  impl_->vocab = j["model"]["config"].value("vocab", 0);
  for (auto p : impl_->root.parameters()) p.set_requires_grad(true);
}

RegionModel::~RegionModel() = default;
RegionModel::RegionModel(RegionModel&&) noexcept = default;
const std::string& RegionModel::manifest_json() const { return impl_->manifest; }
const std::vector<std::string>& RegionModel::sequence() const { return impl_->sequence; }

RegionCheck RegionModel::check_regions(int64_t batch, uint64_t seed) {
  torch::manual_seed(seed);
  impl_->root.eval();  // dropout off: the whole and the chain must see the same function
  int64_t vocab = impl_->vocab > 0 ? impl_->vocab : 256;
  auto tokens = torch::randint(vocab, {batch, impl_->seq_len + 1}, torch::kLong);
  auto idx = tokens.slice(1, 0, impl_->seq_len), targets = tokens.slice(1, 1);
  std::vector<torch::Tensor> params;  // each tensor once: a tied one is one parameter
  std::set<const void*> seen;
  for (const auto& p : impl_->root.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  auto grads = [&](const torch::Tensor& loss) {
    for (auto p : params)
      if (p.grad().defined()) p.mutable_grad().zero_();
    loss.backward();
    std::vector<torch::Tensor> out;
    for (auto p : params) out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return out;
  };
  auto whole = impl_->root.forward({idx}).toTensor();
  auto loss_whole = next_token_loss(whole, targets);
  auto g_whole = grads(loss_whole);

  torch::Tensor x = idx;
  for (auto& m : impl_->modules) x = m.forward({x}).toTensor();
  auto loss_chain = next_token_loss(x, targets);
  auto g_chain = grads(loss_chain);

  RegionCheck r;
  r.loss = loss_whole.item<double>();
  r.regions = impl_->modules.size();
  r.parameters = g_whole.size();
  r.max_output_diff = (whole - x).abs().max().item<double>();
  for (size_t i = 0; i < g_whole.size(); ++i)
    r.max_grad_diff = std::max(r.max_grad_diff, (g_whole[i] - g_chain[i]).abs().max().item<double>());
  return r;
}

}  // namespace piper::runtime
