// Pass 4, place: every chunk gets the ranks that hold its stage (all coordinates of the other
// mesh axes: replicas and shards run the same chunk) and its virtual-stage index.
#include <fmt/format.h>

#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

void place_pass(LowerContext& c) {
  Graph& g = c.graph;
  const auto& stages = c.graph.facts.stages;
  const Mesh& mesh = c.strategy.mesh;
  std::vector<GroupId> group(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) group[s] = g.group(mesh.ranks_at(g.facts.pipeline_axis, stages[s].coord));
  // A place directive's stream applies to the chunks of the stages it placed.
  std::vector<StreamId> stream(stages.size(), g.stream("compute"));
  for (const auto& d : c.strategy.directives) {
    const auto* p = std::get_if<PlaceDirective>(&d.body);
    if (!p || p->stream.empty()) continue;
    for (size_t s = 0; s < stages.size(); ++s)
      for (RegionId r : stages[s].regions)
        if (std::find(p->regions.begin(), p->regions.end(), r) != p->regions.end()) stream[s] = g.stream(p->stream);
  }
  for (Node& n : g.nodes) {
    PIPER_INTERNAL_ASSERT(is_chunk(n.op) && n.stage >= 0, "place runs before any communication exists");
    n.ranks = group[static_cast<size_t>(n.stage)];
    n.chunk = static_cast<int32_t>(stages[static_cast<size_t>(n.stage)].chunk);
    n.stream = stream[static_cast<size_t>(n.stage)];
  }
}

}  // namespace piper::ir
