// Pass 3, split: the forward/backward sub-DAG is copied once per microbatch (all copies feed the
// one update: gradients accumulate), then backwards that the strategy orders as bwd_input/bwd_weight
// are split in two (zero-bubble).
#include <set>

#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

void split_pass(LowerContext& c) {
  Graph& g = c.graph;
  const int32_t mbs = static_cast<int32_t>(c.strategy.microbatches);
  // Copy microbatch 0's F/B nodes and the edges among them (and into the updates).
  std::vector<NodeId> base;
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v)
    if (g.nodes[v].op == Op::F || g.nodes[v].op == Op::B) base.push_back(v);
  std::vector<NodeId> copy_of(g.nodes.size(), -1);
  const size_t base_edges = g.edges.size();
  for (int32_t i = 1; i < mbs; ++i) {
    for (NodeId v : base) {
      Node n = g.nodes[v];
      n.microbatch = i;
      copy_of[v] = g.add(n);
    }
    for (size_t e = 0; e < base_edges; ++e) {
      Edge edge = g.edges[e];
      bool src_in = copy_of[edge.src] >= 0;
      if (!src_in) continue;
      // Edges into the update stay pointed at the one update of the stage.
      NodeId dst = g.nodes[edge.dst].op == Op::U ? edge.dst : copy_of[edge.dst];
      PIPER_INTERNAL_ASSERT(dst >= 0, "split: an edge leaves the microbatch sub-DAG");
      g.connect(copy_of[edge.src], dst, edge.kind, edge.bytes, edge.label);
    }
  }

  // Zero-bubble: which (stage, microbatch) backwards the orders name as bwd_input / bwd_weight.
  std::set<std::pair<int32_t, int32_t>> split;
  for (const auto& d : c.strategy.directives)
    if (const auto* o = std::get_if<OrderDirective>(&d.body))
      for (const auto& group : o->chain)
        for (const Task& t : group)
          if (t.kind == TaskKind::BwdInput || t.kind == TaskKind::BwdWeight)
            split.emplace(int32_t(t.stage), int32_t(t.microbatch));
  if (split.empty()) return;
  // B becomes BI (input gradient: what the upstream stage waits for); a new BW computes the weight
  // gradient from the same saved activations and the same incoming gradient, and feeds the update.
  int32_t pgrad = g.tensor("param_grads"), gout = g.tensor("grad_output"), saved = g.tensor("saved_activations");
  std::vector<NodeId> bw_of(g.nodes.size(), -1);
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    Node& n = g.nodes[v];
    if (n.op != Op::B || !split.count({n.stage, n.microbatch})) continue;
    n.op = Op::BI;
    Node w = n;
    w.op = Op::BW;
    bw_of[v] = g.add(w);
  }
  const size_t n_edges = g.edges.size();
  auto bw = [&](NodeId v) { return v < NodeId(bw_of.size()) ? bw_of[static_cast<size_t>(v)] : -1; };
  for (size_t e = 0; e < n_edges; ++e) {
    const Edge edge = g.edges[e];  // a copy: connect() may reallocate
    if (bw(edge.dst) >= 0 && g.nodes[edge.src].op == Op::F)
      g.connect(edge.src, bw(edge.dst), EdgeKind::Data, 0, saved);
    if (bw(edge.src) >= 0 && g.nodes[edge.dst].op == Op::U) {
      g.edges[e].src = bw(edge.src);  // the weight gradients now come from BW
      g.edges[e].label = pgrad;
    }
  }
  for (NodeId v = 0; v < NodeId(bw_of.size()); ++v)
    if (bw_of[v] >= 0) g.connect(v, bw_of[v], EdgeKind::Data, 0, gout);
}

}  // namespace piper::ir
