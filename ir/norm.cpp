// Pass 9, norm: gradients clipped by their global norm (LowerOptions::global_norm). The norm must
// count every parameter once, however it is held — replicated over dp, sharded by ZeRO, split over
// pipeline stages, tied across two of them, an expert on one ep rank — so each rank sums the squares
// of the gradient pieces it owns (as the storage layout and the experts' owners say) and one
// all-reduce over the whole mesh adds them up. The same scale then multiplies every gradient, so:
//   - a rank's ALLREDUCE_N waits for everything its updates wait for (its gradients are final:
//     after the data-parallel reductions, the tied sums, the backwards);
//   - every update on it waits for the ALLREDUCE_N;
//   - the all-reduce spans every rank, so it ends only when the last rank's gradients are final:
//     the scheduler and the deadlock check start the norms of all classes together (a rendezvous,
//     as a send and its receive are), since no edge may cross ranks.
// One node per set of ranks that holds updates (a schedule class), on a stream of its own so that
// it waits behind no other collective. It follows tie and shard, whose sums and exchanges the
// updates wait for; order may then add user edges around it.
#include <map>

#include "ir/pass.h"

namespace piper::ir {

void norm_pass(LowerContext& c) {
  if (!c.options.global_norm) return;
  Graph& g = c.graph;
  const StreamId stream = g.stream("norm");
  std::map<GroupId, std::vector<NodeId>> updates;  // by the ranks that run them
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v)
    if (g.nodes[static_cast<size_t>(v)].op == Op::U) updates[g.nodes[static_cast<size_t>(v)].ranks].push_back(v);
  const size_t live = g.edges.size();
  std::vector<std::vector<NodeId>> inputs(g.nodes.size());
  for (size_t k = 0; k < live; ++k)
    if (g.edges[k].kind != EdgeKind::Dead && g.nodes[static_cast<size_t>(g.edges[k].dst)].op == Op::U)
      inputs[static_cast<size_t>(g.edges[k].dst)].push_back(g.edges[k].src);
  for (const auto& [ranks, us] : updates) {
    const Node& first = g.nodes[static_cast<size_t>(us.front())];
    const NodeId norm = g.add(Node{.op = Op::AllReduce, .payload = Payload::Norm, .flags = kBackward, .stream = stream,
                                   .stage = first.stage, .microbatch = -1, .chunk = first.chunk, .ranks = ranks,
                                   .axis = -1, .bytes = 8});  // one double: the rank's sum of squares
    // Temporal edges: the norm reads the gradients where the optimizer keeps them, not a value an
    // edge carries, and must not extend the lifetime of what the backwards produced.
    for (NodeId u : us) {
      for (NodeId src : inputs[static_cast<size_t>(u)]) g.connect(src, norm, EdgeKind::Temporal);
      g.connect(norm, u, EdgeKind::Temporal);
    }
  }
}

}  // namespace piper::ir
