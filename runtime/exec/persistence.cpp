// Persistence: checkpoints by the model's names (runtime/exec/checkpoint.h) and the trained model
// written for PyTorch.
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <tuple>

#include "runtime/exec/checkpoint.h"
#include "runtime/exec/executor_impl.h"
#include "runtime/model/region_model_impl.h"

namespace piper::runtime {

std::string Executor::save_checkpoint(const std::string& dir, int64_t steps_done, const std::string& strategy,
                                      const std::string& settings) {
  Impl& x = *impl_;
  std::vector<StatePiece> mine;
  int64_t optimizer_steps = 0;
  for (auto& [stage, sp] : x.params) {
    for (auto& p : sp->saved_state(x.view.replica == 0)) mine.push_back(std::move(p));
    optimizer_steps = sp->optimizer_steps();
  }
  nlohmann::json meta{{"model", x.plan.manifest.model_name}, {"strategy", strategy}, {"optimizer", x.opt.optimizer},
                      {"optimizer_steps", optimizer_steps}, {"lr", x.opt.lr}, {"seed", x.opt.seed},
                      {"batch_size", x.opt.global_batch}, {"settings", nlohmann::json::parse(settings)}};
  const auto all = everyone(x.comm);
  auto barrier = [&] {
    double z = 0;
    x.comm.all_reduce_sum(&z, 1, all, kRuntimeChannel);
  };
  // A failure on one rank must not leave the others waiting at a barrier: it ends the job.
  try {
    return write_checkpoint(dir, steps_done, mine, meta, x.comm.rank(), x.comm.size(), barrier);
  } catch (const std::exception& e) {
    x.comm.abort(fmt::format("rank {}: {}", x.comm.rank(), e.what()));
    throw;  // not reached (abort is [[noreturn]]); GCC does not see that through the virtual call
  }
}

int64_t Executor::load_checkpoint(const std::string& dir, std::string* note, std::string* settings) {
  Impl& x = *impl_;
  const std::string path = latest_checkpoint(dir);
  std::vector<StatePiece> want;
  for (auto& [stage, sp] : x.params)
    for (auto& p : sp->loaded_state()) want.push_back(std::move(p));
  std::set<std::pair<std::string, std::string>> model_params;  // a tied tensor under its first name only
  const Manifest& man = x.plan.manifest;
  for (RegionId r = 0; r < RegionId(man.regions.size()); ++r)
    for (int32_t i = 0; i < int32_t(man.regions[static_cast<size_t>(r)].params.size()); ++i) {
      const int32_t tie = man.tie_of(r, i);
      if (tie >= 0 && !(man.ties[static_cast<size_t>(tie)].members.front() == TiedParam{r, i})) continue;
      model_params.emplace(man.regions[static_cast<size_t>(r)].name, man.regions[static_cast<size_t>(r)].params[static_cast<size_t>(i)].name);
    }
  const nlohmann::json m = read_checkpoint(path, want, model_params);
  if (m.value("optimizer", "") != x.opt.optimizer)
    throw std::runtime_error(fmt::format("checkpoint {}: saved with optimizer {}, this run uses {}", path,
                                         m.value("optimizer", "?"), x.opt.optimizer));
  for (auto& [stage, sp] : x.params) sp->loaded(m.value("optimizer_steps", int64_t{0}));
  if (settings) *settings = m.value("settings", nlohmann::json::object()).dump();
  if (note) {
    *note = fmt::format("resumed from {} (step {}, saved by {} on {} ranks)", path, m.value("step", int64_t{0}),
                        m.value("strategy", "?"), m.value("world", 0));
  }
  return m.value("step", int64_t{0});
}

void Executor::save_model(const std::string& path) {
  Impl& x = *impl_;
  // Every rank sends what it owns (each element once) to rank 0: a JSON index, then the values.
  std::vector<StatePiece> mine;
  for (auto& [stage, sp] : x.params)
    for (auto& p : sp->saved_state(x.view.replica == 0)) mine.push_back(std::move(p));
  nlohmann::json index = nlohmann::json::array();
  std::vector<float> values;
  for (const auto& p : mine) {
    index.push_back({p.region, p.param, p.begin, p.end});
    if (p.slice.sliced()) index.back().push_back(slice_json(p.slice));  // begin and end count the slice's elements
    const torch::Tensor v = p.value.detach().to(torch::kCPU, torch::kFloat).contiguous();
    values.insert(values.end(), v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
  }
  const int kLenTag = x.comm.max_tag() - 2, kIndexTag = x.comm.max_tag() - 1, kValueTag = x.comm.max_tag();  // above the plan's
  if (x.comm.rank() != 0) {
    const std::string text = index.dump();
    uint64_t sizes[2] = {text.size(), values.size()};
    x.comm.send(sizes, sizeof sizes, 0, kLenTag);
    x.comm.send(text.data(), text.size(), 0, kIndexTag);
    x.comm.send(values.data(), values.size() * sizeof(float), 0, kValueTag);
  } else {
    RegionModel out(x.model_path);  // a fresh copy: this rank released the weights it does not hold
    auto& impl = out.impl();
    torch::NoGradGuard no_grad;
    // Tensor-parallel slices are gathered whole (their ranges may come from several ranks under
    // ZeRO), then put in their places in the parameter.
    std::map<std::tuple<std::string, std::string, int64_t>, std::pair<SliceOf, torch::Tensor>> slices;
    auto fill = [&](const nlohmann::json& idx, const std::vector<float>& vals) {
      size_t at = 0;
      for (const auto& e : idx) {
        const int64_t b = e[2], en = e[3];
        torch::Tensor target = module_parameter(impl.region(e[0]), e[1]);
        if (e.size() > 4) {
          const SliceOf s = slice_from_json(e[4]);
          auto& [slice, buf] = slices[{e[0], e[1], s.coord}];
          if (!buf.defined()) buf = torch::empty({target.numel() / s.ways}, torch::kFloat);
          slice = s;
          target = buf;
        }
        target.view({-1}).narrow(0, b, en - b).copy_(torch::from_blob(const_cast<float*>(vals.data()) + at, {en - b}));
        at += static_cast<size_t>(en - b);
      }
    };
    fill(index, values);
    for (int r = 1; r < x.comm.size(); ++r) {
      uint64_t sizes[2] = {0, 0};
      x.comm.recv(sizes, sizeof sizes, r, kLenTag);
      std::string text(sizes[0], '\0');
      x.comm.recv(text.data(), text.size(), r, kIndexTag);
      std::vector<float> vals(sizes[1]);
      x.comm.recv(vals.data(), vals.size() * sizeof(float), r, kValueTag);
      fill(nlohmann::json::parse(text), vals);
    }
    for (const auto& [key, sl] : slices) place_slice(module_parameter(impl.region(std::get<0>(key)), std::get<1>(key)), sl.second, sl.first);
    for (auto p : impl.root.parameters()) p.set_requires_grad(true);
    const std::string tmp = path + ".tmp";
    impl.root.save(tmp, {{"piper/manifest.json", impl.manifest}});
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error(fmt::format("--save-model: cannot write {}", path));
  }
  double z = 0;
  const auto all = everyone(x.comm);
  x.comm.all_reduce_sum(&z, 1, all, kRuntimeChannel);
}

}  // namespace piper::runtime
