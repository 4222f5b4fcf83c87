// Pass 5, replicate: data parallelism over an axis. The gradients of each stage's replicated
// parameters are reduced over the axis before its update:
//   zero 0: all-reduce after the last backward;
//   zero 1: reduce-scatter once, update the shard, all-gather the parameters;
//   zero 2: reduce-scatter after every microbatch's backward (gradients stay sharded);
//   zero 3: zero 2, and parameters are all-gathered before every forward and backward use and
//           freed after (per microbatch — correct under a pipeline, where stages interleave).
// Parameters of regions sharded over the same axis (experts) are not replicated there.
#include <fmt/format.h>

#include <set>

#include "ir/pass.h"

namespace piper::ir {

namespace {
int64_t selected_bytes(const Manifest& m, RegionId r, const std::vector<RegionId>& sel, const std::set<RegionId>& skip) {
  if (skip.count(r)) return 0;
  bool all = std::any_of(sel.begin(), sel.end(), [&](RegionId x) { return m.is_ancestor(x, r); });
  int64_t total = 0;
  if (all)
    for (const auto& p : m.regions[static_cast<size_t>(r)].params) total += p.bytes;
  for (RegionId ch : m.regions[static_cast<size_t>(r)].children) total += selected_bytes(m, ch, sel, skip);
  return total;
}
}  // namespace

void replicate_pass(LowerContext& c) {
  Graph& g = c.graph;
  int32_t grads = g.tensor("param_grads"), params = g.tensor("params");
  // Chunks and updates by stage, so the rewiring below does not rescan the graph per stage.
  const size_t stages = c.strategy.stages.size();
  std::vector<std::vector<NodeId>> chunks(stages);
  std::vector<NodeId> update(stages, -1);
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[v];
    if (!is_chunk(n.op)) continue;
    if (n.op == Op::U) update[static_cast<size_t>(n.stage)] = v;
    else chunks[static_cast<size_t>(n.stage)].push_back(v);
  }

  for (const auto& d : c.strategy.directives) {
    const auto* rep = std::get_if<ReplicateDirective>(&d.body);
    if (!rep || c.strategy.axis_size(rep->axis) <= 1) continue;  // one replica: nothing to reduce
    std::set<RegionId> skip;
    for (const auto& other : c.strategy.directives)
      if (const auto* sh = std::get_if<ShardDirective>(&other.body); sh && sh->axis == rep->axis)
        skip.insert(sh->regions.begin(), sh->regions.end());
    int32_t axis = c.axis_index(rep->axis);
    StreamId stream = g.stream(rep->stream.empty() ? "comm" : rep->stream);

    for (size_t s = 0; s < stages; ++s) {
      int64_t bytes = 0;
      for (RegionId r : c.strategy.stages[s].regions) bytes += selected_bytes(c.manifest, r, rep->regions, skip);
      if (bytes == 0) continue;
      const int64_t bucket = rep->bucket_bytes > 0 ? rep->bucket_bytes : bytes;
      const int32_t buckets = static_cast<int32_t>((bytes + bucket - 1) / bucket);
      const NodeId u = update[s];
      const GroupId ranks = g.nodes[static_cast<size_t>(u)].ranks;
      const int32_t chunk = g.nodes[static_cast<size_t>(u)].chunk;
      auto collective = [&](Op op, Payload what, int32_t mb, int32_t k, uint8_t flags) {
        int64_t b = std::min(bucket, bytes - int64_t(k) * bucket);
        return g.add(Node{op, what, flags, stream, -1, int32_t(s), mb, chunk, k, -1, ranks, axis, b});
      };
      // The gradients reach the update through the reduction now, not directly.
      for (Edge& e : g.edges)
        if (e.dst == u && e.kind == EdgeKind::Data && e.label == grads) e.kind = EdgeKind::Dead;

      const bool per_microbatch = rep->zero >= 2;
      const Op reduce = rep->zero == 0 ? Op::AllReduce : Op::ReduceScatter;
      // Gradient producers: BW where the backward is split, else B.
      for (int32_t k = 0; k < buckets; ++k) {
        if (!per_microbatch) {
          NodeId red = collective(reduce, Payload::Grad, -1, k, kBackward);
          for (NodeId v : chunks[s])
            if (g.nodes[v].op == Op::B || g.nodes[v].op == Op::BW)
              g.connect(v, red, EdgeKind::Data, g.nodes[v].bytes, grads);
          g.connect(red, u, EdgeKind::Data, g.nodes[red].bytes, grads);
        } else {
          std::map<int32_t, NodeId> per_mb;
          for (NodeId v : chunks[s]) {
            const Node n = g.nodes[v];
            if (n.op != Op::B && n.op != Op::BW) continue;
            auto [it, fresh] = per_mb.emplace(n.microbatch, -1);
            if (fresh) it->second = collective(Op::ReduceScatter, Payload::Grad, n.microbatch, k, kBackward | kShardGrads);
            g.connect(v, it->second, EdgeKind::Data, n.bytes, grads);
          }
          for (auto [mb, red] : per_mb) g.connect(red, u, EdgeKind::Data, g.nodes[red].bytes, grads);
        }
        if (rep->zero == 1 || rep->zero == 2) {
          NodeId gather = collective(Op::AllGather, Payload::Param, -1, k, 0);
          g.connect(u, gather, EdgeKind::Data, g.nodes[gather].bytes, params);
        }
      }
      if (rep->zero == 3) {
        // Materialize before each use, free after: one gather per microbatch and direction.
        std::map<std::pair<int32_t, bool>, std::vector<NodeId>> gathers;
        for (NodeId v : chunks[s]) {
          const int32_t mb = g.nodes[v].microbatch;  // copies: collective() grows g.nodes
          const bool backward = g.nodes[v].op != Op::F;
          auto [it, fresh] = gathers.emplace(std::make_pair(mb, backward), std::vector<NodeId>{});
          if (fresh)
            for (int32_t k = 0; k < buckets; ++k)
              it->second.push_back(collective(Op::AllGather, Payload::Param, mb, k,
                                              kMaterialize | (backward ? kBackward : 0)));
          for (NodeId gather : it->second) g.connect(gather, v, EdgeKind::Data, g.nodes[gather].bytes, params);
          g.nodes[v].flags |= kFreeParams;
        }
      }
    }
  }
  g.remove_dead_edges();
}

}  // namespace piper::ir
