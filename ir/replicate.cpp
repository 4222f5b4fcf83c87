// Pass 6, replicate: data parallelism as the stage facts decided it (build). The gradients of each
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

// One replicated stage's rewrite: its reductions, then (ZeRO-3) its gathers.
class StageReplication {
 public:
  StageReplication(LowerContext& c, size_t s, const std::vector<NodeId>& chunks, NodeId update, int32_t grads, int32_t params)
      : g_(c.graph), s_(s), rep_(g_.facts.stages[s].replication), chunks_(chunks), u_(update),
        ranks_(g_.nodes[static_cast<size_t>(update)].ranks), chunk_(g_.nodes[static_cast<size_t>(update)].chunk),
        grads_(grads), params_(params) {
    const StageFacts& st = g_.facts.stages[s];
    if (!st.dense.empty())
      elem_ = dtype_bytes(c.manifest.regions[static_cast<size_t>(st.dense.front().region)].params[static_cast<size_t>(st.dense.front().index)].dtype);
    // Producers of a bucket's gradients: the B (or BW, where split) pieces over its range. Indexed
    // by microbatch: ZeRO-2/3 asks per bucket and microbatch, and a scan of the stage's pieces each
    // time made this pass quadratic in microbatches.
    for (NodeId v : chunks_)
      if (const Node& n = g_.nodes[static_cast<size_t>(v)]; n.op == Op::B || n.op == Op::BW) backwards_[n.microbatch].push_back(v);
  }

  // The gradients reach the update through the reductions, not directly: per bucket an all-reduce
  // (zero 0) or reduce-scatter (once, zero 1; per microbatch, zero 2/3), and (zero 1/2) an all-gather
  // of the updated parameters.
  void reduce_buckets() {
    // An expert piece's gradients are not replicated (its owner trains it alone): its edge stays, as
    // an order (the gradients are where the optimizer reads them; an edge that carried a value would
    // keep the piece's input gradients alive until the update). Without it the update would follow
    // them only by the compute stream's order, and the global norm not at all.
    for (Edge& e : g_.edges)
      if (e.dst == u_ && e.kind == EdgeKind::Data && e.label == grads_)
        e.kind = piece_of(e.src).sharded < 0 ? EdgeKind::Dead : EdgeKind::Temporal;
    for (int32_t k = 0; k < int32_t(rep_.buckets.size()); ++k) {
      const Range& b = rep_.buckets[static_cast<size_t>(k)];
      const int64_t bytes = b.size() * elem_;
      if (rep_.zero <= 1) {
        NodeId red = collective(rep_.zero == 0 ? Op::AllReduce : Op::ReduceScatter, Payload::Grad, -1, k, bytes, kBackward);
        for (NodeId v : producers(b, -1)) g_.connect(v, red, EdgeKind::Data, bytes, grads_);
        g_.connect(red, u_, EdgeKind::Data, bytes, grads_);
      } else {
        for (int32_t mb = 0; mb < int32_t(g_.facts.microbatches); ++mb) {
          auto from = producers(b, mb);
          if (from.empty()) continue;
          NodeId red = collective(Op::ReduceScatter, Payload::Grad, mb, k, bytes, kBackward | kShardGrads);
          for (NodeId v : from) g_.connect(v, red, EdgeKind::Data, bytes, grads_);
          g_.connect(red, u_, EdgeKind::Data, bytes, grads_);
        }
      }
      if (rep_.zero == 1 || rep_.zero == 2) g_.connect(u_, collective(Op::AllGather, Payload::Param, -1, k, bytes, 0), EdgeKind::Data, bytes, params_);
    }
  }

  // ZeRO-3: per microbatch and direction, each unit gathered for the pieces that use it. Pieces by
  // (microbatch, backward?) in the order they run: forward by segment, backward reversed.
  void gather_units() {
    std::map<std::pair<int32_t, bool>, std::map<int16_t, std::vector<NodeId>>> tasks;
    for (NodeId v : chunks_) {
      const Node& n = g_.nodes[static_cast<size_t>(v)];
      tasks[{n.microbatch, n.op != Op::F}][n.segment].push_back(v);
    }
    for (auto& [key, pieces] : tasks) {
      const bool backward = key.second;
      std::vector<int16_t> order;
      for (auto& [seg, _] : pieces) order.push_back(seg);
      if (backward) std::reverse(order.begin(), order.end());
      for (size_t j = 0; j < order.size(); ++j) {
        const auto& users = pieces[order[j]];
        const Segment& piece = piece_of(users.front());
        for (int32_t k = 0; k < int32_t(rep_.units.size()); ++k) {
          const Range& unit = rep_.units[static_cast<size_t>(k)];
          if (!piece.touches(unit)) continue;
          const int64_t bytes = unit.size() * elem_;
          NodeId gather = collective(Op::AllGather, Payload::Param, key.first, k, bytes, kMaterialize | (backward ? kBackward : 0));
          for (NodeId v : users) {
            g_.connect(gather, v, EdgeKind::Data, bytes, params_);
            g_.nodes[static_cast<size_t>(v)].flags |= kFreeParams;
          }
          // Prefetch p: gathered while the p pieces before its consumer run, so it waits for the
          // piece before those (temporal: no data flows); the first ones are issued just in time.
          // In a split backward only the input-gradient half (BI) runs in piece order: weight
          // halves (BW) may be deferred past every BI, so they pace nothing.
          const size_t ahead = static_cast<size_t>(rep_.prefetch) + 1;
          if (j >= ahead)
            for (NodeId v : pieces[order[j - ahead]])
              if (g_.nodes[static_cast<size_t>(v)].op != Op::BW) g_.connect(v, gather, EdgeKind::Temporal, 0);
        }
      }
    }
  }

 private:
  NodeId collective(Op op, Payload what, int32_t mb, int32_t k, int64_t bytes, uint8_t flags) {
    return g_.add(Node{.op = op, .payload = what, .flags = flags, .stream = rep_.stream, .stage = int32_t(s_), .microbatch = mb,
                       .chunk = chunk_, .bucket = k, .ranks = ranks_, .axis = rep_.axis, .bytes = bytes});
  }
  const Segment& piece_of(NodeId v) const { return g_.segment_of(g_.nodes[static_cast<size_t>(v)]); }
  std::vector<NodeId> producers(const Range& b, int32_t mb) const {
    std::vector<NodeId> out;
    auto take = [&](const std::vector<NodeId>& pieces) {
      for (NodeId v : pieces)
        if (piece_of(v).touches(b)) out.push_back(v);
    };
    if (mb >= 0) {
      if (auto it = backwards_.find(mb); it != backwards_.end()) take(it->second);
    } else {
      for (const auto& [m, pieces] : backwards_) take(pieces);
      std::sort(out.begin(), out.end());  // the scan's order: by node
    }
    return out;
  }

  Graph& g_;
  const size_t s_;
  const Replication& rep_;
  const std::vector<NodeId>& chunks_;
  const NodeId u_;
  const GroupId ranks_;
  const int32_t chunk_;
  const int32_t grads_, params_;
  int64_t elem_ = 4;
  std::map<int32_t, std::vector<NodeId>> backwards_;
};
}  // namespace

void replicate_pass(LowerContext& c) {
  Graph& g = c.graph;
  const int32_t grads = g.tensor("param_grads"), params = g.tensor("params");
  const size_t stages = g.facts.stages.size();
  // Per stage and the ranks that hold it (two sets for a `mirror` copy, each with its update).
  std::map<std::pair<size_t, GroupId>, std::vector<NodeId>> chunks;
  std::map<std::pair<size_t, GroupId>, NodeId> update;
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[v];
    if (!is_chunk(n.op)) continue;
    const auto key = std::make_pair(static_cast<size_t>(n.stage), n.ranks);
    if (n.op == Op::U) update[key] = v;
    else chunks[key].push_back(v);
  }
  for (const auto& [key, u] : update) {
    if (g.facts.stages[key.first].replication.axis < 0) continue;
    StageReplication r(c, key.first, chunks[key], u, grads, params);
    r.reduce_buckets();
    if (g.facts.stages[key.first].replication.zero == 3) r.gather_units();
  }
  g.remove_dead_edges();
}

}  // namespace piper::ir
