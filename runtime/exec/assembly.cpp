// Model assembly: the model's regions into this rank's stages — each stage's dense parameters in
// the plan's layout (tied copies made and named), its pieces' modules, its experts — and the
// weights of regions this rank does not hold released.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "runtime/exec/executor_impl.h"
#include "runtime/model/region_model_impl.h"

namespace piper::runtime {

void Executor::Impl::assemble_stages() {
  auto& impl = model.impl();
  const Manifest& m = plan.manifest;
  auto region = [&](RegionId r) { return impl.region(m.regions[static_cast<size_t>(r)].name); };
  std::set<std::string> kept;  // regions whose weights this rank keeps
  std::set<int32_t> tied_here;  // ties a stage on this rank already holds
  const char* drop = std::getenv("PIPER_TEST_DROP_COLLECTIVE");  // the equivalence test's negative control
  drop_copy_sums = drop && std::string(drop) == "mirror";
  for (auto& [stage, sv] : view.stages) {
    const ir::StageFacts& f = *sv.facts;
    const int64_t tp_coord = f.tp.axis >= 0 ? plan.dag.facts.mesh.coord(view.rank, f.tp.axis) : 0;
    if (!sv.tp_group.empty())
      tensor_groups[stage] = TensorGroup{&comm, sv.tp_group, tensor_channel(stage), drop && std::string(drop) == "tensor"};
    if (!sv.cp_group.empty()) {
      context_groups[stage] = TensorGroup{&comm, sv.cp_group, context_channel(stage), drop && std::string(drop) == "context",
                                          /*balanced=*/true};
      context_rings.emplace(stage, GroupRing(context_groups.at(stage)));
    }
    std::vector<torch::Tensor> dense, experts;
    StageParams::Names dense_names, expert_names;
    std::vector<size_t> copies;
    std::vector<SliceOf> slices;  // per dense parameter
    for (const ir::ParamSlot& slot : f.dense) {
      const ParamSpec& spec = m.regions[static_cast<size_t>(slot.region)].params[static_cast<size_t>(slot.index)];
      torch::Tensor t = module_parameter(region(slot.region), spec.name);
      slices.push_back(slot.sliced ? slice_of(spec, f.tp.ways, tp_coord) : SliceOf{});
      if (slot.sliced) {  // this rank's slice replaces the whole tensor in the module
        t = take_slice(t, slices.back()).requires_grad_(true);
        set_module_parameter(region(slot.region), spec.name, t);
      }
      std::string rname = m.regions[static_cast<size_t>(slot.region)].name, pname = spec.name;
      if (const int32_t tie = m.tie_of(slot.region, slot.index); tie >= 0) {
        // Another stage here holds the tensor: this one trains a copy of its own (its flat layout
        // owns its storage), kept equal by ALLREDUCE_T. Checkpoints know it by the tie's first name.
        if (!tied_here.insert(tie).second) {
          torch::NoGradGuard no_grad;
          t = t.detach().clone();
          set_module_parameter(region(slot.region), spec.name, t);
        }
        const TiedParam& canon = m.ties[static_cast<size_t>(tie)].members.front();
        if (canon.region != slot.region) copies.push_back(dense.size());
        rname = m.regions[static_cast<size_t>(canon.region)].name;
        pname = m.regions[static_cast<size_t>(canon.region)].params[static_cast<size_t>(canon.index)].name;
      }
      dense.push_back(t);
      dense_names.emplace_back(rname, pname);
    }
    int64_t expert_replicas = 1;
    std::vector<PieceModules> ps;
    for (size_t j = 0; j < f.segments.size(); ++j) {
      const ir::Segment& seg = f.segments[j];
      PieceModules pm;
      if (seg.sharded >= 0) {
        const auto& ex = sv.experts.at(static_cast<int32_t>(j));
        pm.expert = true;
        for (int64_t e : ex.owned) {
          const RegionId member = ex.shard->members[static_cast<size_t>(e)];
          auto mod = region(member);
          pm.experts.emplace_back(e, mod);
          for (const auto& p : mod.named_parameters()) {
            experts.push_back(p.value);
            expert_names.emplace_back(m.regions[static_cast<size_t>(member)].name, p.name);
          }
          kept.insert(m.regions[static_cast<size_t>(member)].name);
        }
        expert_replicas = static_cast<int64_t>(ex.group.size());
      } else {
        for (RegionId r : seg.regions) {
          const bool ends_moe = j + 1 < f.segments.size() && f.segments[j + 1].sharded >= 0 &&
                                m.is_ancestor(r, f.segments[j + 1].sharded);
          if (ends_moe) {
            pm.moe_end = true;
            const RegionId attn = child_of_kind(r, "attention");
            pm.attn = region(attn);
            pm.attn_sharded = std::count(seg.tp_regions.begin(), seg.tp_regions.end(), attn) > 0;
            pm.attn_sequence = std::count(seg.sequence_regions.begin(), seg.sequence_regions.end(), attn) > 0;
            pm.attn_context = std::count(seg.context_regions.begin(), seg.context_regions.end(), attn) > 0;
            pm.router = region(child_of_kind(r, "router"));
          } else {
            sharded_modules(r, seg, pm);
          }
        }
      }
      ps.push_back(with_groups(stage, std::move(pm)));
    }
    for (const ir::ParamSlot& slot : f.dense) kept.insert(m.regions[static_cast<size_t>(slot.region)].name);
    pieces[stage] = std::move(ps);
    params[stage] = std::make_unique<StageParams>(sv, std::move(dense), std::move(experts), expert_replicas,
                                                  OptimizerOptions{opt.optimizer, opt.lr, opt.recipe.beta1, opt.recipe.beta2,
                                                                   opt.recipe.eps, opt.recipe.weight_decay, opt.recipe.no_decay},
                                                  comm, std::move(dense_names),
                                                  std::move(expert_names));
    if (!copies.empty()) params[stage]->mark_copies(copies);
    tensor_parallel_params(stage, f, std::move(slices));
    if (queues)
      params[stage]->set_before_release([this](const torch::Tensor& t) { queues->used_by_current_stream(t); });
  }
  release_others(kept);
}

// The stage's tensor- and context-parallel groups, for the piece's regions that need them.
PieceModules Executor::Impl::with_groups(int32_t stage, PieceModules pm) const {
  if (auto it = tensor_groups.find(stage); it != tensor_groups.end()) pm.tp = &it->second;
  if (auto it = context_rings.find(stage); it != context_rings.end()) pm.cp = &it->second;
  const bool context = pm.attn_context || std::any_of(pm.context.begin(), pm.context.end(),
                                                      [](PieceModules::Context c) { return c != PieceModules::kWhole; });
  if (context && !pm.cp)
    throw std::logic_error(fmt::format("stage {}: a context-parallel region without a context-parallel group", stage));
  if ((std::find(pm.sharded.begin(), pm.sharded.end(), true) != pm.sharded.end() || pm.attn_sharded) && !pm.tp)
    throw std::logic_error(fmt::format("stage {}: a sharded region without a tensor-parallel group", stage));
  return pm;
}

// Weights of regions this rank does not hold are released: the archive is read whole (TorchScript
// has no partial load), but only the owned stages' weights (and experts) stay in memory.
void Executor::Impl::release_others(const std::set<std::string>& kept) {
  const Manifest& m = plan.manifest;
  for (size_t r = 1; r < m.regions.size(); ++r) {
    if (kept.count(m.regions[r].name) || m.regions[r].params.empty()) continue;
    auto mod = model.impl().region(m.regions[r].name);
    for (const auto& spec : m.regions[r].params) set_module_parameter(mod, spec.name, torch::empty({0}));
  }
}

// What a stage's parameters need to know of tensor parallelism: where its slices lie (checkpoints),
// and under sequence parallelism which gradients the tp group sums and how.
void Executor::Impl::tensor_parallel_params(int32_t stage, const ir::StageFacts& f, std::vector<SliceOf> slices) {
  params[stage]->set_slices(std::move(slices));
  std::vector<ir::Range> shared = sequence_shared(f);
  if (shared.empty()) return;
  const TensorGroup& tg = context_groups.count(stage) ? context_groups.at(stage) : tensor_groups.at(stage);
  const char* drop = std::getenv("PIPER_TEST_DROP_COLLECTIVE");
  const bool skip = drop && std::string(drop) == "sequence";  // the negative control of these sums
  params[stage]->set_sequence_shared(std::move(shared), [this, &tg, skip, stage](torch::Tensor& t) {
    if (!skip) comm.all_reduce_sum(t.data_ptr<float>(), static_cast<size_t>(t.numel()), tg.group, sequence_channel(stage));
  });
}

// Sequence and context parallelism: the layout ranges of the replicated (not sliced) parameters
// inside regions that run on shares of the tokens, whose gradients each rank computed from its share only.
std::vector<ir::Range> Executor::Impl::sequence_shared(const ir::StageFacts& f) const {
  const Manifest& m = plan.manifest;
  std::vector<ir::Range> out;
  auto under = [&](const std::vector<RegionId>& v, RegionId r) {
    return std::any_of(v.begin(), v.end(), [&](RegionId q) { return m.is_ancestor(q, r); });
  };
  for (const ir::ParamSlot& slot : f.dense) {
    if (slot.sliced) continue;
    for (const ir::Segment& seg : f.segments)
      if (under(seg.sequence_regions, slot.region) || under(seg.context_regions, slot.region)) {
        out.push_back(ir::Range{slot.offset, slot.offset + slot.numel});
        break;
      }
  }
  return out;
}

// The modules that run region `r` of a piece: the region itself, or, when regions inside it run
// sharded, its children chained (the tensor-parallel contract: such a region is its children in order).
void Executor::Impl::sharded_modules(RegionId r, const ir::Segment& seg, PieceModules& pm) {
  auto& impl = model.impl();
  const Manifest& m = plan.manifest;
  auto among = [&](const std::vector<RegionId>& v) { return std::count(v.begin(), v.end(), r) > 0; };
  auto below = [&](const std::vector<RegionId>& v) {
    return std::any_of(v.begin(), v.end(), [&](RegionId q) { return m.is_ancestor(r, q); });
  };
  const bool sharded = among(seg.tp_regions), context = among(seg.context_regions);
  if (sharded || context || (!below(seg.tp_regions) && !below(seg.context_regions))) {
    pm.plain.push_back(impl.region(m.regions[static_cast<size_t>(r)].name));
    pm.sharded.push_back(sharded);
    pm.sequence.push_back(among(seg.sequence_regions));
    pm.context.push_back(!context ? PieceModules::kWhole
                         : m.regions[static_cast<size_t>(r)].cp == "attention" ? PieceModules::kRing
                                                                                : PieceModules::kTokenwise);
    return;
  }
  for (RegionId c : m.regions[static_cast<size_t>(r)].children) sharded_modules(c, seg, pm);
}

// The child region of `under` with this kind (attention, router).
RegionId Executor::Impl::child_of_kind(RegionId under, const std::string& kind) const {
  const auto& m = plan.manifest;
  for (size_t r = 0; r < m.regions.size(); ++r)
    if (m.regions[r].kind == kind && m.is_ancestor(under, static_cast<RegionId>(r))) return static_cast<RegionId>(r);
  throw std::runtime_error(fmt::format("expert parallelism: '{}' has no {} region (the runtime runs the zoo's "
                                       "MoE contract, docs/models.md)",
                                       m.regions[static_cast<size_t>(under)].name, kind));
}

}  // namespace piper::runtime
