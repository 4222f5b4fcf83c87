// Pass 1, cut: the stages of balanced placements (`place ... balanced`, `interleaved(v) balanced`,
// `vshape balanced`) cut again by measured region costs. The checker cut them by the manifest's
// FLOPs, which is all its checks need (how many stages, which regions are placed); what the plan
// runs is cut by what the machine measured, when its file has a time for every pipeline region.
// One algorithm for both (lang/placement.h); only the weights differ.
#include <algorithm>

#include "ir/pass.h"
#include "lang/placement.h"

namespace piper::ir {

void cut_pass(LowerContext& c) {
  const auto& costs = c.options.region_costs;
  const Manifest& m = c.manifest;
  const bool balanced = std::any_of(c.strategy.directives.begin(), c.strategy.directives.end(), [](const Directive& d) {
    const auto* p = std::get_if<PlaceDirective>(&d.body);
    return p && (p->mode == PlaceDirective::Mode::Balanced || p->balanced);
  });
  const bool measured = !costs.empty() && std::all_of(m.sequence.begin(), m.sequence.end(), [&](RegionId r) {
    return costs.count(m.regions[static_cast<size_t>(r)].name) > 0;
  });
  if (!balanced || !measured) return;
  auto nanoseconds = [&](RegionId r) { return static_cast<int64_t>(costs.at(m.regions[static_cast<size_t>(r)].name) * 1e9); };
  c.stages = form_stages(m.sequence, place_regions(c.strategy.directives, c.strategy.mesh, m.sequence, nanoseconds));
}

}  // namespace piper::ir
