// Pass 4, place: every chunk gets the ranks that hold its stage (all coordinates of the other
// mesh axes: replicas and shards run the same chunk) and its virtual-stage index. Under `mirror`
// the copies' microbatches run at the mirrored coordinate, and each copy gets an update of its own.
#include <fmt/format.h>

#include <map>

#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

namespace {
// `mirror`: each stage's copy at the mirrored pipeline coordinate, as a virtual stage there after
// the stages placed there (in stage order).
void place_copies(LowerContext& c) {
  const int64_t from = c.strategy.mirror_from();
  if (from < 0) return;
  auto& stages = c.graph.facts.stages;
  c.graph.facts.mirror_from = from;
  const int64_t n = c.strategy.axis_size(c.strategy.pipeline_axis);
  std::map<int64_t, int64_t> next;  // per coordinate: the next free virtual-stage index
  for (const StageFacts& st : stages) next[st.coord] = std::max(next[st.coord], st.chunk + 1);
  for (StageFacts& st : stages) {
    st.copy_coord = n - 1 - st.coord;
    st.copy_chunk = st.copied() ? next[st.copy_coord]++ : st.chunk;
  }
}

// `mirror`: a copied stage's copy steps its own parameters, so it gets an update of its own, which
// the backwards of the copy's microbatches feed (the mirror pass sums the two copies' gradients
// before both updates).
void copy_updates(Graph& g) {
  std::vector<NodeId> copy_u(g.facts.stages.size(), -1);
  const size_t nodes = g.nodes.size();
  for (size_t v = 0; v < nodes; ++v) {
    if (g.nodes[v].op != Op::U || !g.stage(g.nodes[v].stage).copied()) continue;
    Node u = g.nodes[v];
    const StageFacts& st = g.stage(u.stage);
    u.ranks = g.group(g.facts.mesh.ranks_at(g.facts.pipeline_axis, st.copy_coord));
    u.chunk = static_cast<int32_t>(st.copy_chunk);
    copy_u[static_cast<size_t>(u.stage)] = g.add(u);
  }
  for (Edge& e : g.edges) {
    const Node &src = g.nodes[static_cast<size_t>(e.src)], &dst = g.nodes[static_cast<size_t>(e.dst)];
    if (dst.op == Op::U && g.facts.on_copy(src.microbatch) && copy_u[static_cast<size_t>(dst.stage)] >= 0)
      e.dst = copy_u[static_cast<size_t>(dst.stage)];
  }
}
}  // namespace

void place_pass(LowerContext& c) {
  place_copies(c);
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
    const StageFacts& st = stages[static_cast<size_t>(n.stage)];
    const bool copy = g.facts.on_copy(n.microbatch);  // an update (microbatch -1) is the stage's own
    n.ranks = copy ? g.group(mesh.ranks_at(g.facts.pipeline_axis, st.copy_coord)) : group[static_cast<size_t>(n.stage)];
    n.chunk = static_cast<int32_t>(copy ? st.copy_chunk : st.chunk);
    n.stream = stream[static_cast<size_t>(n.stage)];
  }
  if (g.facts.mirror_from >= 0) copy_updates(g);
}

}  // namespace piper::ir
