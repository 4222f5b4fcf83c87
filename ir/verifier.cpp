#include "ir/verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace piper::ir {

namespace {
// The checks, each a short function over the graph; problems are collected (at most 20).
class Verifier {
 public:
  Verifier(const Graph& g, bool p2p_done) : g_(g), p2p_done_(p2p_done), n_(static_cast<NodeId>(g.nodes.size())) {}

  std::vector<std::string> run() {
    if (!nodes_and_edges_sound()) return problems_;
    std::vector<NodeId> cycle;
    if (!g_.topological_order(&cycle)) say(fmt::format("the graph has a cycle through {} nodes", cycle.size()));
    adj_ = g_.adjacency();
    edges_stay_on_ranks();
    index_chunks();
    for (NodeId v = 0; v < n_; ++v) node(v);
    norms_precede_updates();
    backwards_reach_updates();
    storage_covers_layout();
    return problems_;
  }

 private:
  void say(std::string s) {
    if (problems_.size() < 20) problems_.push_back(std::move(s));
  }

  // Every node has ranks (once placed) and a stream; every edge joins two nodes and is live.
  bool nodes_and_edges_sound() {
    // Before place no node has ranks; after it, every node must.
    const bool placed = std::any_of(g_.nodes.begin(), g_.nodes.end(), [](const Node& x) { return x.ranks >= 0; });
    for (const Node& x : g_.nodes) {
      if (placed && (x.ranks < 0 || static_cast<size_t>(x.ranks) >= g_.group_count())) say(fmt::format("{} has no ranks", token(x)));
      if (x.stream >= g_.streams.size()) say(fmt::format("{} is on an unknown stream", token(x)));
    }
    for (const Edge& e : g_.edges) {
      if (e.src < 0 || e.src >= n_ || e.dst < 0 || e.dst >= n_) {
        say("an edge points outside the graph");
        return false;
      }
      if (e.kind == EdgeKind::Dead) say("a retired edge was left in the graph");
    }
    return problems_.empty();
  }

  std::vector<const Edge*> in_edges(NodeId v) const {
    std::vector<const Edge*> out;
    for (int32_t k = adj_.in_offsets[static_cast<size_t>(v)]; k < adj_.in_offsets[static_cast<size_t>(v) + 1]; ++k)
      out.push_back(&g_.edges[static_cast<size_t>(adj_.in_edges[static_cast<size_t>(k)])]);
    return out;
  }
  std::vector<const Edge*> out_edges(NodeId v) const {
    std::vector<const Edge*> out;
    for (int32_t k = adj_.out_offsets[static_cast<size_t>(v)]; k < adj_.out_offsets[static_cast<size_t>(v) + 1]; ++k)
      out.push_back(&g_.edges[static_cast<size_t>(adj_.out_edges[static_cast<size_t>(k)])]);
    return out;
  }
  bool has_edge(NodeId from, NodeId to) const {
    for (const Edge* e : out_edges(from))
      if (e->dst == to && e->kind == EdgeKind::Data) return true;
    return false;
  }

  // Cross-rank data moves only by communication: chunk-to-chunk data edges stay on one rank set.
  void edges_stay_on_ranks() {
    for (const Edge& e : g_.edges) {
      const Node &a = g_.nodes[e.src], &b = g_.nodes[e.dst];
      if (p2p_done_ && e.kind == EdgeKind::Data && is_chunk(a.op) && is_chunk(b.op) && a.ranks != b.ranks)
        say(fmt::format("data edge {} -> {} crosses ranks without a send/recv", token(a), token(b)));
      if (e.kind == EdgeKind::Temporal && a.ranks != b.ranks) say(fmt::format("temporal edge {} -> {} crosses ranks", token(a), token(b)));
    }
  }

  void index_chunks() {
    for (NodeId v = 0; v < n_; ++v)
      if (const Node& x = g_.nodes[v]; is_chunk(x.op) && !chunk_at_.emplace(std::make_tuple(x.op, x.stage, x.microbatch, x.segment), v).second) {
        // `mirror`: a copied stage has two updates, one per copy, on the copies' ranks.
        const Node& first = g_.nodes[chunk_at_.at(std::make_tuple(x.op, x.stage, x.microbatch, x.segment))];
        if (!(x.op == Op::U && g_.stage(x.stage).copied() && first.ranks != x.ranks && !second_update_.count(x.stage)))
          say(fmt::format("{} appears twice", token(x)));
        second_update_.insert(x.stage);
      }
  }

  void node(NodeId v) {
    const Node& x = g_.nodes[v];
    switch (x.op) {
      case Op::Send: send(v); break;
      case Op::Recv: {
        int sends = 0;
        for (const Edge* e : in_edges(v)) sends += g_.nodes[e->src].op == Op::Send;
        if (sends != 1) say(fmt::format("{} has {} matching sends, not 1", token(x), sends));
        break;
      }
      case Op::B:
      case Op::BI: {
        auto f = chunk_at_.find({Op::F, x.stage, x.microbatch, x.segment});
        if (f == chunk_at_.end() || !has_edge(f->second, v)) say(fmt::format("{} does not follow its forward", token(x)));
        break;
      }
      case Op::BW: {
        auto bi = chunk_at_.find({Op::BI, x.stage, x.microbatch, x.segment});
        if (bi == chunk_at_.end() || !has_edge(bi->second, v)) say(fmt::format("{} does not follow its input gradient", token(x)));
        break;
      }
      case Op::U: update(v); break;
      default: break;
    }
    if (!is_chunk(x.op) && x.op != Op::Send && x.op != Op::Recv) collective(v);
  }

  void send(NodeId v) {
    const Node& x = g_.nodes[v];
    int recvs = 0;
    for (const Edge* e : out_edges(v)) {
      const Node& r = g_.nodes[e->dst];
      if (r.op != Op::Recv) continue;
      ++recvs;
      if (r.microbatch != x.microbatch || r.payload != x.payload || r.bytes != x.bytes)
        say(fmt::format("{} is paired with a mismatched {}", token(x), token(r)));
      if (g_.ranks(r.ranks).size() != g_.ranks(x.ranks).size())
        say(fmt::format("{} and {} pair different numbers of ranks", token(x), token(r)));
    }
    if (recvs != 1) say(fmt::format("{} has {} matching recvs, not 1", token(x), recvs));
  }

  // Exactly one path for the dense gradients: straight from the backwards, or through reductions.
  void update(NodeId v) {
    bool direct = false, reduced = false;
    std::set<std::pair<int32_t, int32_t>> seen;  // (bucket, microbatch) of each reduction
    for (const Edge* e : in_edges(v)) {
      const Node& p = g_.nodes[e->src];
      // An expert piece's gradients reach its update directly even when the stage is replicated.
      const bool expert = size_t(p.stage) < g_.facts.stages.size() && g_.segment_of(p).sharded >= 0;
      if ((p.op == Op::B || p.op == Op::BW) && !expert) direct = true;
      // A tied sum adds the other copies' gradients (on top of this copy's, direct or reduced), and
      // the global norm carries none: neither is a replica reduction.
      if ((p.op == Op::AllReduce && p.payload == Payload::Grad) || p.op == Op::ReduceScatter) {
        reduced = true;
        if (!seen.insert({p.bucket, p.microbatch}).second) say(fmt::format("{} is reduced twice", token(p)));
      }
    }
    if (direct && reduced) say(fmt::format("{} gets gradients both reduced and unreduced", token(g_.nodes[v])));
  }

  // A collective runs on the ranks of the chunks it serves, along a real axis.
  void collective(NodeId v) {
    const Node& x = g_.nodes[v];
    // The global norm's all-reduce alone spans the whole mesh, not one axis.
    if ((x.axis < 0) != (x.payload == Payload::Norm)) say(fmt::format("{} has {} axis", token(x), x.axis < 0 ? "no" : "an"));
    for (const Edge* e : in_edges(v))
      if (is_chunk(g_.nodes[e->src].op) && g_.nodes[e->src].ranks != x.ranks)
        say(fmt::format("{} runs on other ranks than its input {}", token(x), token(g_.nodes[e->src])));
    for (const Edge* e : out_edges(v))
      if (is_chunk(g_.nodes[e->dst].op) && g_.nodes[e->dst].ranks != x.ranks)
        say(fmt::format("{} runs on other ranks than its consumer {}", token(x), token(g_.nodes[e->dst])));
  }

  // Every backward's gradients reach its stage's update by some path (directly, through reductions,
  // a tied sum): an update that followed one only by stream order could step without it. Walked
  // back from each update over the nodes of its ranks (no path to it leaves them).
  void backwards_reach_updates() {
    std::vector<char> seen(static_cast<size_t>(n_), 0);
    for (NodeId u = 0; u < n_; ++u) {
      if (g_.nodes[u].op != Op::U) continue;
      std::fill(seen.begin(), seen.end(), 0);
      std::vector<NodeId> frontier{u};
      seen[static_cast<size_t>(u)] = 1;
      while (!frontier.empty()) {
        const NodeId v = frontier.back();
        frontier.pop_back();
        for (const Edge* e : in_edges(v))
          if (!seen[static_cast<size_t>(e->src)] && g_.nodes[e->src].ranks == g_.nodes[u].ranks) {
            seen[static_cast<size_t>(e->src)] = 1;
            frontier.push_back(e->src);
          }
      }
      for (NodeId v = 0; v < n_; ++v) {
        const Node& x = g_.nodes[v];
        // (each `mirror` copy's update: the backwards on its ranks)
        if ((x.op == Op::B || x.op == Op::BW) && x.stage == g_.nodes[u].stage && x.ranks == g_.nodes[u].ranks &&
            !seen[static_cast<size_t>(v)])
          say(fmt::format("{} does not reach {}: the update may step without its gradients", token(x), token(g_.nodes[u])));
      }
    }
  }

  // With clipping, no update may step before its ranks' share of the global norm was summed.
  void norms_precede_updates() {
    if (std::none_of(g_.nodes.begin(), g_.nodes.end(), [](const Node& x) { return x.payload == Payload::Norm; })) return;
    for (NodeId v = 0; v < n_; ++v) {
      if (g_.nodes[v].op != Op::U) continue;
      const auto in = in_edges(v);
      if (std::none_of(in.begin(), in.end(), [&](const Edge* e) {
            return g_.nodes[e->src].payload == Payload::Norm && g_.nodes[e->src].ranks == g_.nodes[v].ranks;
          }))
        say(fmt::format("{} does not wait for the global norm", token(g_.nodes[v])));
    }
  }

  // Once laid out (the storage pass): with ZeRO the members' stepped ranges tile the layout, each
  // element stepped by exactly one member; without it every member steps all of it.
  void storage_covers_layout() {
    for (size_t s = 0; s < g_.facts.stages.size(); ++s) {
      const StageFacts& st = g_.facts.stages[s];
      if (st.storage.members.empty()) continue;
      std::vector<Range> all;
      for (const MemberStorage& m : st.storage.members) {
        if (st.storage.zero == 0 && !(m.stepped.size() == 1 && m.stepped[0] == Range{0, st.dense_elems}))
          say(fmt::format("stage {}: a member without ZeRO does not step its whole layout", s));
        if (st.storage.zero > 0) all.insert(all.end(), m.stepped.begin(), m.stepped.end());
      }
      if (st.storage.zero == 0) continue;
      std::sort(all.begin(), all.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
      int64_t at = 0;
      for (const Range& r : all) {
        if (r.size() == 0) continue;
        if (r.begin != at) say(fmt::format("stage {}: elements {}..{} are stepped by {} members", s, std::min(at, r.begin),
                                           std::max(at, r.begin), r.begin < at ? "two" : "no"));
        at = std::max(at, r.end);
      }
      if (at != st.dense_elems) say(fmt::format("stage {}: the members step {} of {} elements", s, at, st.dense_elems));
    }
  }

  const Graph& g_;
  const bool p2p_done_;
  const NodeId n_;
  Graph::Adjacency adj_;
  std::map<std::tuple<Op, int32_t, int32_t, int16_t>, NodeId> chunk_at_;
  std::set<int32_t> second_update_;  // copied stages whose copy's update was seen
  std::vector<std::string> problems_;
};
}  // namespace

std::vector<std::string> verify(const Graph& g, bool p2p_done) { return Verifier(g, p2p_done).run(); }

}  // namespace piper::ir
