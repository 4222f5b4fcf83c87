#include "ir/verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace piper::ir {

std::vector<std::string> verify(const Graph& g, bool p2p_done) {
  std::vector<std::string> problems;
  auto say = [&](std::string s) {
    if (problems.size() < 20) problems.push_back(std::move(s));
  };
  const auto n = static_cast<NodeId>(g.nodes.size());
  // Before place no node has ranks; after it, every node must.
  const bool placed = std::any_of(g.nodes.begin(), g.nodes.end(), [](const Node& x) { return x.ranks >= 0; });
  for (NodeId v = 0; v < n; ++v) {
    const Node& x = g.nodes[v];
    if (placed && (x.ranks < 0 || static_cast<size_t>(x.ranks) >= g.group_count()))
      say(fmt::format("{} has no ranks", token(x)));
    if (x.stream >= g.streams.size()) say(fmt::format("{} is on an unknown stream", token(x)));
  }
  for (const Edge& e : g.edges) {
    if (e.src < 0 || e.src >= n || e.dst < 0 || e.dst >= n) {
      say("an edge points outside the graph");
      return problems;
    }
    if (e.kind == EdgeKind::Dead) say("a retired edge was left in the graph");
  }
  if (!problems.empty()) return problems;

  std::vector<NodeId> cycle;
  if (!g.topological_order(&cycle)) say(fmt::format("the graph has a cycle through {} nodes", cycle.size()));

  Graph::Adjacency adj = g.adjacency();
  auto in_edges = [&](NodeId v) {
    std::vector<const Edge*> out;
    for (int32_t k = adj.in_offsets[static_cast<size_t>(v)]; k < adj.in_offsets[static_cast<size_t>(v) + 1]; ++k)
      out.push_back(&g.edges[static_cast<size_t>(adj.in_edges[static_cast<size_t>(k)])]);
    return out;
  };
  auto out_edges = [&](NodeId v) {
    std::vector<const Edge*> out;
    for (int32_t k = adj.out_offsets[static_cast<size_t>(v)]; k < adj.out_offsets[static_cast<size_t>(v) + 1]; ++k)
      out.push_back(&g.edges[static_cast<size_t>(adj.out_edges[static_cast<size_t>(k)])]);
    return out;
  };

  // Cross-rank data moves only by communication: chunk-to-chunk data edges stay on one rank set.
  for (const Edge& e : g.edges) {
    const Node &a = g.nodes[e.src], &b = g.nodes[e.dst];
    if (p2p_done && e.kind == EdgeKind::Data && is_chunk(a.op) && is_chunk(b.op) && a.ranks != b.ranks)
      say(fmt::format("data edge {} -> {} crosses ranks without a send/recv", token(a), token(b)));
    if (e.kind == EdgeKind::Temporal && a.ranks != b.ranks)
      say(fmt::format("temporal edge {} -> {} crosses ranks", token(a), token(b)));
  }

  std::map<std::tuple<Op, int32_t, int32_t, int16_t>, NodeId> chunk_at;
  for (NodeId v = 0; v < n; ++v) {
    const Node& x = g.nodes[v];
    if (is_chunk(x.op)) {
      if (!chunk_at.emplace(std::make_tuple(x.op, x.stage, x.microbatch, x.segment), v).second)
        say(fmt::format("{} appears twice", token(x)));
    }
  }
  auto has_edge = [&](NodeId from, NodeId to) {
    for (const Edge* e : out_edges(from))
      if (e->dst == to && e->kind == EdgeKind::Data) return true;
    return false;
  };
  for (NodeId v = 0; v < n; ++v) {
    const Node& x = g.nodes[v];
    switch (x.op) {
      case Op::Send: {
        auto outs = out_edges(v);
        int recvs = 0;
        for (const Edge* e : outs) {
          const Node& r = g.nodes[e->dst];
          if (r.op != Op::Recv) continue;
          ++recvs;
          if (r.microbatch != x.microbatch || r.payload != x.payload || r.bytes != x.bytes)
            say(fmt::format("{} is paired with a mismatched {}", token(x), token(r)));
          if (g.ranks(r.ranks).size() != g.ranks(x.ranks).size())
            say(fmt::format("{} and {} pair different numbers of ranks", token(x), token(r)));
        }
        if (recvs != 1) say(fmt::format("{} has {} matching recvs, not 1", token(x), recvs));
        break;
      }
      case Op::Recv: {
        int sends = 0;
        for (const Edge* e : in_edges(v)) sends += g.nodes[e->src].op == Op::Send;
        if (sends != 1) say(fmt::format("{} has {} matching sends, not 1", token(x), sends));
        break;
      }
      case Op::B:
      case Op::BI: {
        auto f = chunk_at.find({Op::F, x.stage, x.microbatch, x.segment});
        if (f == chunk_at.end() || !has_edge(f->second, v))
          say(fmt::format("{} does not follow its forward", token(x)));
        break;
      }
      case Op::BW: {
        auto bi = chunk_at.find({Op::BI, x.stage, x.microbatch, x.segment});
        if (bi == chunk_at.end() || !has_edge(bi->second, v))
          say(fmt::format("{} does not follow its input gradient", token(x)));
        break;
      }
      case Op::U: {
        // Exactly one path for the gradients: straight from the backwards, or through reductions.
        bool direct = false, reduced = false;
        std::set<std::pair<int32_t, int32_t>> seen;  // (bucket, microbatch) of each reduction
        for (const Edge* e : in_edges(v)) {
          const Node& p = g.nodes[e->src];
          if (p.op == Op::B || p.op == Op::BW) direct = true;
          if (p.op == Op::AllReduce || p.op == Op::ReduceScatter) {
            reduced = true;
            if (!seen.insert({p.bucket, p.microbatch}).second) say(fmt::format("{} is reduced twice", token(p)));
          }
        }
        if (direct && reduced) say(fmt::format("{} gets gradients both reduced and unreduced", token(x)));
        break;
      }
      default:
        break;
    }
    if (!is_chunk(x.op) && x.op != Op::Send && x.op != Op::Recv) {
      // A collective runs on the ranks of the chunks it serves, along a real axis.
      if (x.axis < 0) say(fmt::format("{} has no axis", token(x)));
      for (const Edge* e : in_edges(v))
        if (is_chunk(g.nodes[e->src].op) && g.nodes[e->src].ranks != x.ranks)
          say(fmt::format("{} runs on other ranks than its input {}", token(x), token(g.nodes[e->src])));
      for (const Edge* e : out_edges(v))
        if (is_chunk(g.nodes[e->dst].op) && g.nodes[e->dst].ranks != x.ranks)
          say(fmt::format("{} runs on other ranks than its consumer {}", token(x), token(g.nodes[e->dst])));
    }
  }
  return problems;
}

}  // namespace piper::ir
