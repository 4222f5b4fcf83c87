// Pass 8, mirror: under `mirror` a stage is held twice (place put the copy's microbatches and an
// update of its own at the mirrored coordinate), and the two copies stay equal only if both step
// with the same gradient: the sum of what each computed from its half of the microbatches. Per
// copied stage, one ALLREDUCE_C at each copy sums the stage's gradient between the two (what each
// member steps: with ZeRO its shards, the same elements in both copies), once
// it is final there (after the copy's backwards, or its data-parallel reductions) and before that
// copy's update. Sums commute with the data-parallel mean, as the tie pass's do. A parameter tied
// across stages is not summed again: the tie pass summed it over every copy of every holder.
//
// Two copies sum on a stream of their own (a rank's collectives with one partner in one sequence),
// in stage order on every rank: ranks r and n-1-r share two stages' sums, and each must call them
// in the same order. What `mirror` does not compose with is refused here, at the directive.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "ir/pass.h"

namespace piper::ir {

namespace {
// The copies sum what their members step: whole gradients, or (ZeRO) each member its shards, the
// same elements in both copies (ZeRO-3 gathers each copy's parameters from its own members' shards,
// which stay equal). Experts held by one rank of a group would need a sum of their own.
bool composable(LowerContext& c, const Directive& at) {
  for (size_t s = 0; s < c.graph.facts.stages.size(); ++s) {
    const StageFacts& st = c.graph.facts.stages[s];
    std::string why;
    if (!st.experts.empty()) why = fmt::format("stage {} holds sharded experts", s);
    if (why.empty()) continue;
    auto& e = c.diags.error(at.loc, fmt::format("a mirrored pipeline sums the copies' gradients as their members step them, but {}", why));
    e.note(SourceLoc{}, "mirror composes with data parallelism (plain and ZeRO-1/2/3), tensor and context "
                        "parallelism and tied parameters; not yet with sharded experts");
    for (const Note& n : at.used_from) e.notes.push_back(n);
    return false;
  }
  return true;
}
// A tie held by several stages is summed over all their copies by the tie pass, which runs first
// (its sum is among what an update waits for); the copies' sum leaves those ranges alone.
int64_t summed_elems(const Graph& g, int32_t stage) {
  const StageFacts& st = g.stage(stage);
  int64_t n = st.dense_elems;
  for (const TiedSlot& t : st.tied)
    for (const TieFacts& tf : g.facts.ties)
      if (tf.tie == t.tie) n -= t.range.size();
  const Replication& rep = st.replication;
  return rep.axis >= 0 && rep.zero > 0 ? (n + rep.ways - 1) / rep.ways : n;  // ZeRO: a member's shards
}
}  // namespace

void mirror_pass(LowerContext& c) {
  Graph& g = c.graph;
  if (g.facts.mirror_from < 0) return;
  if (const Directive* at = c.strategy.mirror(); at && !composable(c, *at)) {
    c.failed = true;
    return;
  }
  const StreamId stream = g.stream("mirror");
  const int32_t grads = g.tensor("param_grads");
  // Per update (one per copy): what its gradients come from, as the earlier passes wired it.
  std::map<NodeId, std::vector<NodeId>> feeds;
  for (size_t k = 0; k < g.edges.size(); ++k) {
    const Edge& e = g.edges[k];
    if (e.kind == EdgeKind::Data && g.nodes[static_cast<size_t>(e.dst)].op == Op::U &&
        g.stage(g.nodes[static_cast<size_t>(e.dst)].stage).copied())
      feeds[e.dst].push_back(e.src);
  }
  // In stage order (not node order: place added the copies' updates after every stage's own).
  std::vector<std::pair<int32_t, NodeId>> updates;
  for (const auto& [u, srcs] : feeds) updates.emplace_back(g.nodes[static_cast<size_t>(u)].stage, u);
  std::sort(updates.begin(), updates.end());
  std::map<GroupId, NodeId> last_on;  // per copy's ranks: the previous sum there
  for (const auto& [stage, u] : updates) {
    const Node up = g.nodes[static_cast<size_t>(u)];
    const NodeId sum = g.add(Node{.op = Op::AllReduce, .payload = Payload::Copy, .flags = kBackward, .stream = stream,
                                  .stage = up.stage, .microbatch = -1, .chunk = up.chunk, .ranks = up.ranks,
                                  .axis = g.facts.pipeline_axis, .bytes = summed_elems(g, up.stage) * 4});
    for (NodeId src : feeds[u]) g.connect(src, sum, EdgeKind::Data, 0, grads);
    g.connect(sum, u, EdgeKind::Data, 0, grads);
    if (auto prev = last_on.find(up.ranks); prev != last_on.end()) g.connect(prev->second, sum, EdgeKind::Temporal);
    last_on[up.ranks] = sum;
  }
}

}  // namespace piper::ir
