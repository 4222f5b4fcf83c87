// Pass 5, p2p: every data edge whose ends run on different ranks becomes send -> recv. Rank k of
// the sending stage pairs with rank k of the receiving one (same coordinates on the other axes).
#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

void p2p_pass(LowerContext& c) {
  Graph& g = c.graph;
  // P2P gets streams of its own, as in the paper: it never blocks compute, and sends and receives
  // are separate FIFOs, so a rank's send can never wait behind its own receive (the classic 1F1B
  // deadlock with blocking send/recv on one channel).
  StreamId send_stream = g.stream("p2p_send"), recv_stream = g.stream("p2p_recv");
  const int32_t axis = g.facts.pipeline_axis;
  const size_t n_edges = g.edges.size();
  for (size_t e = 0; e < n_edges; ++e) {
    const Edge edge = g.edges[e];
    const Node src = g.nodes[edge.src], dst = g.nodes[edge.dst];
    if (edge.kind != EdgeKind::Data || src.ranks == dst.ranks) continue;
    PIPER_INTERNAL_ASSERT(g.ranks(src.ranks).size() == g.ranks(dst.ranks).size(),
                          "p2p: stages on different numbers of ranks");
    const bool backward = src.op != Op::F;
    const Payload what = backward ? Payload::ActGrad : Payload::Act;
    const uint8_t flags = backward ? kBackward : 0;
    NodeId s = g.add(Node{.op = Op::Send, .payload = what, .flags = flags, .stream = send_stream, .segment = src.segment,
                          .stage = src.stage, .microbatch = src.microbatch, .chunk = src.chunk, .ranks = src.ranks,
                          .axis = axis, .bytes = edge.bytes});
    NodeId r = g.add(Node{.op = Op::Recv, .payload = what, .flags = flags, .stream = recv_stream, .segment = dst.segment,
                          .stage = dst.stage, .microbatch = dst.microbatch, .chunk = dst.chunk, .ranks = dst.ranks,
                          .axis = axis, .bytes = edge.bytes});
    g.edges[e].kind = EdgeKind::Dead;
    g.connect(edge.src, s, EdgeKind::Data, edge.bytes, edge.label);
    g.connect(s, r, EdgeKind::Data, edge.bytes, edge.label);
    g.connect(r, edge.dst, EdgeKind::Data, edge.bytes, edge.label);
  }
  g.remove_dead_edges();
}

}  // namespace piper::ir
