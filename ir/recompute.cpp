// Pass 12, recompute: forward pieces that hold recomputed regions keep only their inputs; the
// scheduler frees their activations after F and charges a second forward before the backward.
#include "ir/pass.h"

namespace piper::ir {

void recompute_pass(LowerContext& c) {
  Graph& g = c.graph;
  const Manifest& m = c.manifest;
  for (const auto& d : c.strategy.directives) {
    const auto* rc = std::get_if<RecomputeDirective>(&d.body);
    if (!rc) continue;
    auto hit = [&](const Segment& seg) {
      auto touches = [&](RegionId r) {
        return std::any_of(rc->regions.begin(), rc->regions.end(),
                           [&](RegionId x) { return m.is_ancestor(x, r) || m.is_ancestor(r, x); });
      };
      if (seg.sharded >= 0) return touches(seg.sharded);
      return std::any_of(seg.regions.begin(), seg.regions.end(), touches);
    };
    for (Node& n : g.nodes) {
      if (n.op != Op::F) continue;
      if (hit(g.segment_of(n))) n.flags |= kRecompute;
    }
  }
}

}  // namespace piper::ir
