// Checks that need the whole strategy: the mesh against the world, stages, unused axes, the batch.
#include "lang/checker_impl.h"
#include "lang/placement.h"

#include <cmath>

namespace piper::check {

void Checker::finish() {
  for (const Override& o : opt_.overrides) {
    if (used_overrides_.count(o.name)) continue;
    if (auto it = bound_by_use_.find(o.name); it != bound_by_use_.end()) {
      diags_.error(o.loc, fmt::format("--set {}: '{}' is given by a `use` argument, which takes precedence over --set",
                                      o.name, o.name))
          .note(it->second, "given here; make it a parameter of this file to set it from the command line");
      continue;
    }
    std::vector<std::string> names;
    for (auto& [n, _] : declared_params_)
      if (n != o.name) names.push_back(n);
    diags_.error(o.loc, fmt::format("--set {}: the strategy has no parameter '{}'{}", o.name, o.name,
                                    did_you_mean(o.name, names)));
  }
  finish_mesh();
  finish_placement();
  if (const int64_t stages = static_cast<int64_t>(out_.stages.size()); stages * out_.microbatches > kMaxStageMicrobatches)
    diags_.error(split_loc_.valid() ? split_loc_ : SourceLoc{top_, 1, 1, 1},
                 fmt::format("{} microbatches over {} stages are {} forward tasks a step: the limit is {}",
                             out_.microbatches, stages, stages * out_.microbatches, kMaxStageMicrobatches));
  finish_axes();
  finish_mirror();
  finish_split_blocks();
  finish_batch();
  if (diags_.has_errors()) return;
  finish_orders();
  if (!diags_.has_errors()) finish_schedule_files();
}

// A tensor or context shard of part of a block runs the block as its parts chained; a block with
// experts chains only as DualPipeV × EP runs it (attention and router, then the experts' piece), so
// its experts must be sharded too.
void Checker::finish_split_blocks() {
  std::vector<RegionId> spread;  // expert lists sharded over an axis
  for (const Directive& d : out_.directives)
    if (const auto* sh = std::get_if<ShardDirective>(&d.body)) spread.insert(spread.end(), sh->regions.begin(), sh->regions.end());
  for (const Directive& d : out_.directives) {
    const std::vector<RegionId>* parts = nullptr;
    if (const auto* t = std::get_if<TensorShardDirective>(&d.body)) parts = &t->regions;
    if (const auto* c = std::get_if<ContextShardDirective>(&d.body)) parts = &c->regions;
    if (!parts) continue;
    for (RegionId r : *parts)
      for (RegionId block : m_.sequence) {
        if (block == r || !m_.is_ancestor(block, r)) continue;
        for (size_t q = 0; q < m_.regions.size(); ++q) {
          const bool spread_q = std::any_of(spread.begin(), spread.end(), [&](RegionId l) { return m_.is_ancestor(l, RegionId(q)); });
          if (m_.regions[q].kind != "expert" || !m_.is_ancestor(block, RegionId(q)) || spread_q) continue;
          diags_.error(d.loc, fmt::format("'{}' is split, but its block's experts are not sharded over an axis: "
                                          "that block cannot run as its parts yet", m_.selector_text(r)))
              .note(SourceLoc{}, "shard the experts too (`shard layers[*].moe.experts over ep;`, as dualpipev_ep_tp.piper)");
          return;
        }
      }
  }
}

void Checker::finish_mesh() {
  int64_t product = 1;
  for (const auto& a : axes_)
    if (__builtin_mul_overflow(product, a.size, &product)) {
      diags_.error(a.loc, "the mesh has more devices than fit in 64 bits");
      return;
    }
  if (product > kMaxWorld || opt_.world.value_or(0) > kMaxWorld) {
    diags_.error(product > kMaxWorld ? first_mesh_ : opt_.world_loc,
                 fmt::format("{} devices: the limit is {}", std::max(product, opt_.world.value_or(0)), kMaxWorld));
    return;
  }
  const int64_t world = opt_.world.value_or(product);
  out_.mesh = Mesh(axes_, world);
  if (product == world) return;
  std::vector<std::string> parts;
  for (const auto& a : axes_) parts.push_back(fmt::format("{}={}", a.name, a.size));
  if (axes_.empty()) {
    diags_.error(first_stmt_.valid() ? first_stmt_ : SourceLoc{top_, 1, 1, 1},
                 fmt::format("the strategy declares no mesh, so it runs on 1 device, but the world has {} ranks",
                             world))
        .note(SourceLoc{}, fmt::format("declare one, e.g. `mesh dp = {};`", world));
    return;
  }
  auto& d = diags_.error(first_mesh_, fmt::format("the mesh has {} devices ({}) but the world has {} ranks", product,
                                                  fmt::join(parts, " × "), world));
  if (opt_.world_loc.valid()) d.note(opt_.world_loc, "world size given here");
}

void Checker::finish_placement() {
  if (place_count_ == 0) {
    Stage all;
    all.regions = m_.sequence;
    out_.stages.push_back(std::move(all));
    return;
  }
  std::vector<std::string> missing;
  for (RegionId r : m_.sequence)
    if (!placed_.count(r)) missing.push_back(m_.selector_text(r));
  if (!missing.empty()) {
    diags_.error(first_place_, fmt::format("{} never placed: {}", missing.size() == 1 ? "this region is" : "these regions are",
                                           fmt::join(missing, ", ")))
        .note(SourceLoc{}, "once any region is placed, every pipeline region must be placed exactly once");
    return;
  }
  // Balanced placements are cut by FLOPs here, all the checks need; lowering cuts them again by
  // measured costs when a machine file has them (ir/cut.cpp), with the same algorithm.
  out_.stages = form_stages(m_.sequence, place_regions(out_.directives, out_.mesh, m_.sequence, [&](RegionId r) { return m_.flops(r); }));
}

// `mirror over AXIS`: the copies sit on the pipeline axis and take half the microbatches each.
void Checker::finish_mirror() {
  if (!mirror_loc_.valid()) return;
  const auto* d = &std::get<MirrorDirective>(out_.mirror()->body);
  if (out_.pipeline_axis.empty()) {
    diags_.error(mirror_loc_, "nothing is placed over a pipeline axis, so there are no stages to mirror")
        .note(SourceLoc{}, fmt::format("place the stages first, e.g. `place layers[*] over {};`", d->axis));
    return;
  }
  if (d->axis != out_.pipeline_axis) {
    diags_.error(mirror_axis_loc_, fmt::format("'{}' is not the pipeline axis: the stages are placed over '{}'", d->axis,
                                               out_.pipeline_axis))
        .note(first_place_, "placed here");
    return;
  }
  if (out_.microbatches % 2 != 0) {
    auto& e = diags_.error(mirror_loc_, fmt::format("a mirrored pipeline runs half the microbatches each way, but the "
                                                    "batch is split into {}", out_.microbatches));
    if (split_loc_.valid()) e.note(split_loc_, "split here; an even number of microbatches is needed");
  }
}

void Checker::finish_axes() {
  const std::string& pp = out_.pipeline_axis;
  for (auto* uses : {&replicate_axes_, &shard_axes_}) {
    if (auto it = uses->find(pp); !pp.empty() && it != uses->end())
      diags_.error(it->second, fmt::format("'{}' is the pipeline axis (regions are placed over it); {} over "
                                           "another axis",
                                           pp, uses == &replicate_axes_ ? "replicate" : "shard"))
          .note(first_place_, "placed over it here");
  }
  // A tensor-parallel axis splits the model: its ranks read the same samples, so it cannot carry
  // data parallelism, experts or the pipeline too.
  // So does a context-parallel axis (its ranks read the same samples, each a share of their tokens).
  for (const auto* model : {&tensor_axes_, &context_axes_})
    for (const auto& [axis, loc] : *model) {
      const bool tensor_too = model == &context_axes_ && tensor_axes_.count(axis);
      const char* other = axis == pp ? "the pipeline axis" : replicate_axes_.count(axis) ? "replicated over"
                          : shard_axes_.count(axis) ? "an expert axis" : tensor_too ? "a tensor-parallel axis" : nullptr;
      if (!other) continue;
      SourceLoc there = axis == pp ? first_place_ : replicate_axes_.count(axis) ? replicate_axes_.at(axis)
                        : shard_axes_.count(axis) ? shard_axes_.at(axis) : tensor_axes_.at(axis);
      const char* what = model == &tensor_axes_ ? "tensor" : "context";
      diags_.error(loc, fmt::format("'{}' is a {}-parallel axis here but {} too: give {} parallelism an axis "
                                    "of its own", axis, what, other, what))
          .note(there, "used here");
    }
  if (!tensor_axes_.empty() && !context_axes_.empty() && tensor_axes_.begin()->first != context_axes_.begin()->first)
    diags_.error(context_axes_.begin()->second, "context and tensor parallelism in one strategy are not built yet")
        .note(tensor_axes_.begin()->second, "tensor parallelism here");
  for (const auto& a : axes_)
    if (a.size > 1 && !used_axes_.count(a.name))
      diags_.error(a.loc, fmt::format("mesh axis '{}' (size {}) is not used by any place, replicate or shard",
                                      a.name, a.size))
          .note(SourceLoc{}, fmt::format("e.g. `replicate * over {};` for data parallelism", a.name));
}

void Checker::finish_batch() {
  if (!opt_.batch_size) return;
  const int64_t data_ways = out_.replicas();
  int64_t need = data_ways * out_.microbatches;
  if (need <= 0 || *opt_.batch_size % need == 0) return;  // need 0: the mesh error says why
  SourceLoc at = split_loc_.valid() ? split_loc_ : SourceLoc{top_, 1, 1, 1};
  diags_.error(at, fmt::format("the global batch of {} does not split into {} data-parallel replicas × {} "
                               "microbatches",
                               *opt_.batch_size, data_ways, out_.microbatches))
      .note(SourceLoc{}, fmt::format("use a batch size that is a multiple of {}", need));
}

}  // namespace piper::check
