// Pass 3, place: every chunk gets the ranks that hold its stage (all coordinates of the other
// mesh axes: replicas and shards run the same chunk) and its virtual-stage index.
#include <fmt/format.h>

#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

int32_t LowerContext::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < strategy.mesh.size(); ++i)
    if (strategy.mesh[i].name == axis) return static_cast<int32_t>(i);
  return -1;
}

std::vector<int32_t> LowerContext::ranks_at(const std::string& axis, int64_t coord) const {
  // Ranks are row-major over the mesh axes in declaration order: the last axis varies fastest.
  const auto& mesh = strategy.mesh;
  int32_t a = axis_index(axis);
  int64_t stride = 1;
  for (size_t i = mesh.size(); i-- > 0;) {
    if (static_cast<int32_t>(i) == a) break;
    stride *= mesh[i].size;
  }
  std::vector<int32_t> out;
  for (int64_t r = 0; r < strategy.world; ++r)
    if (a < 0 || (r / stride) % mesh[static_cast<size_t>(a)].size == coord) out.push_back(static_cast<int32_t>(r));
  return out;
}

void place_pass(LowerContext& c) {
  Graph& g = c.graph;
  const auto& stages = c.strategy.stages;
  c.stage_ranks.clear();
  std::vector<GroupId> group(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    c.stage_ranks.push_back(c.ranks_at(c.strategy.pipeline_axis, stages[s].coord));
    group[s] = g.group(c.stage_ranks.back());
  }
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
