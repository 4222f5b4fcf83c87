#include "runtime/model/region_memory.h"

#include <fmt/format.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/model/backward_split.h"
#include "runtime/device/memory_counter.h"
#include "runtime/model/region_model.h"
#include "runtime/model/region_model_impl.h"
#include "runtime/model/ring_attention.h"
#include "runtime/model/tensor_slice.h"

namespace piper::runtime {

namespace {
using nlohmann::json;
constexpr int kMeasureRank = 255;  // a memory-counter slot of its own, apart from any rank's

struct Sample {
  int64_t saved = 0, forward_peak = 0, backward_peak = 0;
  int64_t split_held = -1;  // -1: the input is not differentiable (tokens), no split
  int64_t split_peak = -1;
};

std::vector<torch::Tensor> tensors_of(const c10::IValue& v) {
  if (v.isTensor()) return {v.toTensor()};
  std::vector<torch::Tensor> out;
  if (v.isTuple())
    for (const auto& e : v.toTuple()->elements())
      if (e.isTensor()) out.push_back(e.toTensor());
  return out;
}

// One forward and backward of `m` on `b` samples, as the executor runs a piece: parameter
// gradients already exist (they are views into flat buffers there), so accumulation allocates nothing.
using Runner = std::function<c10::IValue(const torch::Tensor&)>;

Sample measure_once(const Runner& run, const json& input, bool loss, int64_t b, int64_t vocab, torch::ScalarType dtype) {
  std::vector<int64_t> shape{b};
  for (const auto& d : input["shape"]) shape.push_back(d.get<int64_t>());
  const bool tokens = input.value("dtype", "float32") == "int64";
  auto make_input = [&] {
    return tokens ? torch::randint(vocab, shape, torch::kLong)
                  : torch::randn(shape, torch::TensorOptions().dtype(dtype)).requires_grad_(true);
  };
  torch::Tensor targets = loss ? torch::randint(vocab, {b, shape.size() > 1 ? shape[1] : 1}, torch::kLong) : torch::Tensor();
  auto forward = [&](const torch::Tensor& x) {
    std::vector<torch::Tensor> outs = tensors_of(run(x));
    if (loss) {
      const torch::Tensor logits = outs.at(0).to(torch::kFloat);  // the loss in fp32, as the executor does
      outs = {at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}))};
    }
    return outs;
  };
  // The outputs that receive a gradient, and a gradient for each (a loss needs none).
  auto roots_of = [&](const std::vector<torch::Tensor>& outs, std::vector<torch::Tensor>& roots, std::vector<torch::Tensor>& grads) {
    for (auto& o : outs)
      if (o.requires_grad()) {
        roots.push_back(o);
        if (!loss) grads.push_back(torch::randn_like(o));
      }
  };
  Sample s;
  torch::Tensor x = make_input();
  reset_memory_peak(kMeasureRank);
  const int64_t before = memory_stats(kMeasureRank).live;
  std::vector<torch::Tensor> outs = forward(x);
  const MemoryStats after = memory_stats(kMeasureRank);
  s.saved = after.live - before;
  s.forward_peak = after.peak - before;
  std::vector<torch::Tensor> roots, grads;
  roots_of(outs, roots, grads);
  reset_memory_peak(kMeasureRank);
  const int64_t level = memory_stats(kMeasureRank).live;
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  s.backward_peak = memory_stats(kMeasureRank).peak - level;
  outs.clear();
  roots.clear();
  grads.clear();
  x = torch::Tensor();
  if (tokens) return s;
  // The split backward, as the executor runs BI and BW. What the graph holds in between counts the
  // input and the output gradients where the graph keeps them (a layer norm's saved input, a
  // captured gradient), since the executor lets go of its own references at BI, but not the input
  // gradient (the memory model counts that as the piece's value). And BI's peak above its start.
  const int64_t start = memory_stats(kMeasureRank).live;
  x = make_input();
  outs = forward(x);
  roots_of(outs, roots, grads);
  reset_memory_peak(kMeasureRank);
  const int64_t before_bi = memory_stats(kMeasureRank).live;
  WeightHalf rest;
  std::vector<torch::Tensor> dx = backward_inputs(roots, grads, {x}, &rest);
  s.split_peak = memory_stats(kMeasureRank).peak - before_bi;
  outs.clear();
  roots.clear();
  grads.clear();
  dx.clear();
  x = torch::Tensor();
  s.split_held = memory_stats(kMeasureRank).live - start;
  backward_weights(rest);
  return s;
}
}  // namespace

namespace {
// What decides a region's activation memory: its kind, activation specs, whether the loss follows,
// and its subtree's parameter shapes (read from the manifest, so a manifest of another size of the
// same model can be matched against a small measured one).
std::string signature(const json& manifest, const json& r) {
  const std::string name = r["name"].get<std::string>();
  const bool loss = manifest["sequence"].back().get<std::string>() == name;
  std::string sig = fmt::format("{}|{}|{}|{}|", r.value("kind", ""), r["input"].dump(), r.value("output", json()).dump(), loss);
  for (const auto& x : manifest["regions"]) {
    const std::string n = x.value("name", "");
    if (n == name || n.rfind(name + ".", 0) == 0)
      for (const auto& p : x.value("params", json::array())) sig += p["shape"].dump() + ",";
  }
  return sig;
}

// A tensor-parallel region as one rank of `ways` holds it: its sliced parameters replaced by slice 0.
torch::jit::Module sliced(const torch::jit::Module& region, const json& r, int64_t ways) {
  torch::jit::Module m = region.clone();
  for (const SlicedParam& p : sliced_params(r)) m.setattr(p.name, tensor_slice(m.attr(p.name).toTensor(), p.spec, ways, 0));
  return m;
}

// Stands in for member 0 of a ring of two: the "previous member's" keys are a copy of its own (the
// same bytes a receive allocates; the values do not matter to memory).
class ProbeRing : public RingLink {
 public:
  int64_t ways() const override { return 2; }
  int64_t member() const override { return 0; }
  torch::Tensor shift(const torch::Tensor& t) const override { return t.clone(); }
};

// How the probe runs a region: whole, on a tensor-parallel slice of two, or as one rank of a
// context-parallel ring of two (attention regions only, on half the tokens).
enum class Probe { kWhole, kTp2, kCp2 };

// `probe` other than kWhole: only the regions it applies to (what one rank of two holds).
std::map<std::string, json> measure(RegionModel& model, json& j, torch::ScalarType dtype, Probe probe = Probe::kWhole) {
  install_memory_counter();
  const int saved_rank = memory_rank();
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);  // allocation sizes of some kernels depend on the thread count
  set_memory_rank(kMeasureRank);
  const int64_t vocab = j["model"]["config"].value("vocab", int64_t{256});
  const std::string last = j["sequence"].back().get<std::string>();
  std::map<std::string, json> facts;  // signature -> memory facts
  torch::manual_seed(0);
  for (auto& r : j["regions"]) {
    if (!r.contains("input") || !r.contains("name")) continue;
    const std::string name = r["name"].get<std::string>();
    const std::string sig = signature(j, r);
    if (facts.count(sig) || (probe == Probe::kTp2 && !r.contains("tp")) || (probe == Probe::kCp2 && r.value("cp", "") != "attention"))
      continue;
    torch::jit::Module m;
    try {
      m = model.impl().region(name);
    } catch (const std::exception&) {
      continue;  // a region without a module of its own (a group) is not run alone
    }
    if (probe == Probe::kTp2) m = sliced(m, r, 2);
    if (dtype != torch::kFloat) m.to(dtype);
    for (auto p : m.parameters()) {  // as in the executor: gradients exist before the backward
      p.set_requires_grad(true);
      p.mutable_grad() = torch::zeros_like(p);
    }
    json saved = json::array(), fwd = json::array(), bwd = json::array(), held = json::array(), split_peak = json::array();
    try {
      const ProbeRing ring;
      json input = r["input"];
      if (probe == Probe::kCp2) input["shape"][0] = input["shape"][0].get<int64_t>() / 2;
      const Runner run = [&](const torch::Tensor& x) -> c10::IValue {
        if (probe == Probe::kCp2) return run_ring_region(m, x, ring);
        return m.forward({x});
      };
      for (int64_t b : {1, 2, 4}) {
        Sample s = measure_once(run, input, name == last, b, vocab, dtype);
        saved.push_back(s.saved);
        fwd.push_back(s.forward_peak);
        bwd.push_back(s.backward_peak);
        if (s.split_held >= 0) held.push_back(s.split_held);
        if (s.split_peak >= 0) split_peak.push_back(s.split_peak);
      }
    } catch (const std::exception& e) {
      set_memory_rank(saved_rank);
      torch::set_num_threads(threads);
      throw std::runtime_error(fmt::format("measuring region '{}': {}", name, e.what()));
    }
    for (auto p : m.parameters()) p.mutable_grad() = torch::Tensor();
    facts[sig] = json{{"saved", saved}, {"forward_peak", fwd}, {"backward_peak", bwd}};
    if (held.size() == 3) facts[sig]["split_held"] = held;
    if (split_peak.size() == 3) facts[sig]["split_peak"] = split_peak;
  }
  set_memory_rank(saved_rank);
  torch::set_num_threads(threads);
  return facts;
}

json fill_memory(json j, const std::map<std::string, json>& facts, const char* field) {
  for (auto& r : j["regions"]) {
    if (!r.contains("input") || !r.contains("name")) continue;
    if (auto it = facts.find(signature(j, r)); it != facts.end()) r[field] = it->second;
  }
  return j;
}

// Both precisions, each on a model loaded afresh (measuring bf16 converts the modules), the
// tensor-parallel regions on a slice of two, and ring attention as one rank of two.
json measure_both(const std::string& probe, json target) {
  for (auto [dtype, field] : {std::pair{torch::kFloat, "memory"}, std::pair{torch::kBFloat16, "memory_bf16"}}) {
    RegionModel model(probe);
    json p = json::parse(model.manifest_json());
    target = fill_memory(std::move(target), measure(model, p, dtype), field);
  }
  RegionModel model(probe);
  json p = json::parse(model.manifest_json());
  target = fill_memory(std::move(target), measure(model, p, torch::kFloat, Probe::kTp2), "memory_tp2");
  RegionModel ring_model(probe);
  json q = json::parse(ring_model.manifest_json());
  return fill_memory(std::move(target), measure(ring_model, q, torch::kFloat, Probe::kCp2), "memory_cp2");
}
}  // namespace

std::string measure_manifest(const std::string& path) {
  return measure_both(path, json::parse(RegionModel(path).manifest_json())).dump(1) + "\n";
}

std::string measure_manifest_like(const std::string& probe, const std::string& manifest) {
  return measure_both(probe, json::parse(manifest)).dump(1) + "\n";
}

}  // namespace piper::runtime
