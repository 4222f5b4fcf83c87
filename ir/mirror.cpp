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
// in the same order. Sharded experts: a rank's copy holds the experts of its expert coordinate, as
// the rank holding the stage itself does, so their gradients are summed between the two as well.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "ir/pass.h"

namespace piper::ir {

namespace {
// A tie held by several stages is summed over all their copies by the tie pass, which runs first
// (its sum is among what an update waits for); the copies' sum leaves those ranges alone.
int64_t summed_elems(const Graph& g, int32_t stage) {
  const StageFacts& st = g.stage(stage);
  int64_t n = st.dense_elems;
  for (const TiedSlot& t : st.tied)
    for (const TieFacts& tf : g.facts.ties)
      if (tf.tie == t.tie) n -= t.range.size();
  const Replication& rep = st.replication;
  if (rep.axis >= 0 && rep.zero > 0) n = (n + rep.ways - 1) / rep.ways;  // ZeRO: a member's shards
  for (const ExpertShard& e : st.experts)  // the experts one rank holds (the copy's rank at its ep coordinate the same)
    n += (e.member_bytes / 4) * ((static_cast<int64_t>(e.members.size()) + e.ways - 1) / e.ways);
  return n;
}
}  // namespace

void mirror_pass(LowerContext& c) {
  Graph& g = c.graph;
  if (g.facts.mirror_from < 0) return;
  const StreamId stream = g.stream("mirror");
  const int32_t grads = g.tensor("param_grads");
  // Per update (one per copy): what its gradients come from, as the earlier passes wired it — data
  // edges, and the temporal edges by which replicate left the experts' backwards (whose gradients no
  // reduction covers) before the update: the sum must wait for those too.
  std::map<NodeId, std::vector<NodeId>> feeds;
  for (size_t k = 0; k < g.edges.size(); ++k) {
    const Edge& e = g.edges[k];
    const Node& dst = g.nodes[static_cast<size_t>(e.dst)];
    if (dst.op != Op::U || !g.stage(dst.stage).copied()) continue;
    if (e.kind == EdgeKind::Data || (e.kind == EdgeKind::Temporal && is_chunk(g.nodes[static_cast<size_t>(e.src)].op)))
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
