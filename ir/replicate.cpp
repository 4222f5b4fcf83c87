// Pass 5, replicate: data parallelism as the stage facts decided it (build). The gradients of each
// bucket are reduced over the replication axis before the update, starting as soon as the pieces
// that produce them are done (buckets are whole pieces' regions, last regions first):
//   zero 0: all-reduce after the last microbatch's backward of the bucket's piece;
//   zero 1: reduce-scatter once, update the shard, all-gather the parameters;
//   zero 2: reduce-scatter after every microbatch's backward (gradients stay sharded);
//   zero 3: zero 2, and each unit's parameters are all-gathered for every forward and backward use
//           of its piece and freed after (per microbatch — correct under a pipeline, where stages
//           interleave). With prefetch p, a unit's gather waits for the piece p+1 before its
//           consumer; the first ones of a task are issued just in time by the scheduler.
#include <fmt/format.h>

#include <map>
#include <set>

#include "ir/pass.h"

namespace piper::ir {

namespace {
bool overlaps(const Range& a, const Range& b) { return a.begin < b.end && b.begin < a.end; }
}  // namespace

void replicate_pass(LowerContext& c) {
  Graph& g = c.graph;
  int32_t grads = g.tensor("param_grads"), params = g.tensor("params");
  const size_t stages = g.facts.stages.size();
  std::vector<std::vector<NodeId>> chunks(stages);
  std::vector<NodeId> update(stages, -1);
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[v];
    if (!is_chunk(n.op)) continue;
    if (n.op == Op::U) update[static_cast<size_t>(n.stage)] = v;
    else chunks[static_cast<size_t>(n.stage)].push_back(v);
  }
  for (size_t s = 0; s < stages; ++s) {
    const StageFacts& st = g.facts.stages[s];
    const Replication& rep = st.replication;
    if (rep.axis < 0) continue;
    const int64_t elem = st.dense.empty() ? 4 : dtype_bytes(c.manifest.regions[static_cast<size_t>(st.dense.front().region)].params[static_cast<size_t>(st.dense.front().index)].dtype);
    const NodeId u = update[s];
    const GroupId ranks = g.nodes[static_cast<size_t>(u)].ranks;
    const int32_t chunk = g.nodes[static_cast<size_t>(u)].chunk;
    auto collective = [&](Op op, Payload what, int32_t mb, int32_t k, int64_t bytes, uint8_t flags) {
      return g.add(Node{.op = op, .payload = what, .flags = flags, .stream = rep.stream, .stage = int32_t(s),
                        .microbatch = mb, .chunk = chunk, .bucket = k, .ranks = ranks, .axis = rep.axis, .bytes = bytes});
    };
    auto range_of = [&](NodeId v) { return g.segment_of(g.nodes[static_cast<size_t>(v)]).dense; };
    // The gradients reach the update through the reductions now, not directly.
    for (Edge& e : g.edges)
      if (e.dst == u && e.kind == EdgeKind::Data && e.label == grads) e.kind = EdgeKind::Dead;
    // Producers of a bucket's gradients: the B (or BW, where split) pieces over its range.
    // Indexed by microbatch: ZeRO-2/3 asks per bucket and microbatch, and a scan of the stage's
    // pieces each time made this pass quadratic in microbatches.
    std::map<int32_t, std::vector<NodeId>> backwards;
    for (NodeId v : chunks[s])
      if (const Node& n = g.nodes[static_cast<size_t>(v)]; n.op == Op::B || n.op == Op::BW) backwards[n.microbatch].push_back(v);
    auto producers = [&](const Range& b, int32_t mb) {
      std::vector<NodeId> out;
      auto take = [&](const std::vector<NodeId>& pieces) {
        for (NodeId v : pieces)
          if (overlaps(range_of(v), b)) out.push_back(v);
      };
      if (mb >= 0) {
        if (auto it = backwards.find(mb); it != backwards.end()) take(it->second);
      } else {
        for (const auto& [m, pieces] : backwards) take(pieces);
      }
      if (mb < 0) std::sort(out.begin(), out.end());  // the scan's order: by node
      return out;
    };
    for (int32_t k = 0; k < int32_t(rep.buckets.size()); ++k) {
      const Range& b = rep.buckets[static_cast<size_t>(k)];
      const int64_t bytes = b.size() * elem;
      if (rep.zero <= 1) {
        NodeId red = collective(rep.zero == 0 ? Op::AllReduce : Op::ReduceScatter, Payload::Grad, -1, k, bytes, kBackward);
        for (NodeId v : producers(b, -1)) g.connect(v, red, EdgeKind::Data, bytes, grads);
        g.connect(red, u, EdgeKind::Data, bytes, grads);
      } else {
        for (int32_t mb = 0; mb < int32_t(g.facts.microbatches); ++mb) {
          auto from = producers(b, mb);
          if (from.empty()) continue;
          NodeId red = collective(Op::ReduceScatter, Payload::Grad, mb, k, bytes, kBackward | kShardGrads);
          for (NodeId v : from) g.connect(v, red, EdgeKind::Data, bytes, grads);
          g.connect(red, u, EdgeKind::Data, bytes, grads);
        }
      }
      if (rep.zero == 1 || rep.zero == 2) {
        NodeId gather = collective(Op::AllGather, Payload::Param, -1, k, bytes, 0);
        g.connect(u, gather, EdgeKind::Data, bytes, params);
      }
    }
    if (rep.zero != 3) continue;
    // ZeRO-3: per microbatch and direction, each unit gathered for the pieces that use it.
    // Pieces by (microbatch, backward?) in the order they run: forward by segment, backward reversed.
    std::map<std::pair<int32_t, bool>, std::map<int16_t, std::vector<NodeId>>> tasks;
    for (NodeId v : chunks[s]) {
      const Node& n = g.nodes[static_cast<size_t>(v)];
      tasks[{n.microbatch, n.op != Op::F}][n.segment].push_back(v);
    }
    for (auto& [key, pieces] : tasks) {
      const bool backward = key.second;
      std::vector<int16_t> order;
      for (auto& [seg, _] : pieces) order.push_back(seg);
      if (backward) std::reverse(order.begin(), order.end());
      for (size_t j = 0; j < order.size(); ++j) {
        const auto& users = pieces[order[j]];
        const Range piece = range_of(users.front());
        for (int32_t k = 0; k < int32_t(rep.units.size()); ++k) {
          const Range& unit = rep.units[static_cast<size_t>(k)];
          if (!overlaps(unit, piece)) continue;
          const int64_t bytes = unit.size() * elem;
          NodeId gather = collective(Op::AllGather, Payload::Param, key.first, k, bytes,
                                     kMaterialize | (backward ? kBackward : 0));
          for (NodeId v : users) {
            g.connect(gather, v, EdgeKind::Data, bytes, params);
            g.nodes[static_cast<size_t>(v)].flags |= kFreeParams;
          }
          // Prefetch p: gathered while the p pieces before its consumer run, so it waits for the
          // piece before those (temporal: no data flows); the first ones are issued just in time.
          // In a split backward only the input-gradient half (BI) runs in piece order: weight
          // halves (BW) may be deferred past every BI, so they pace nothing.
          const size_t ahead = static_cast<size_t>(rep.prefetch) + 1;
          if (j >= ahead)
            for (NodeId v : pieces[order[j - ahead]])
              if (g.nodes[static_cast<size_t>(v)].op != Op::BW) g.connect(v, gather, EdgeKind::Temporal, 0);
        }
      }
    }
  }
  g.remove_dead_edges();
}

}  // namespace piper::ir
