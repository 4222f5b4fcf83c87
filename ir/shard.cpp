// Pass 8, shard: expert parallelism. Each sharded list (a layer's experts) was cut into a piece of
// its own by build; now every microbatch's tokens reach it by an all-to-all dispatch and leave by
// an all-to-all combine, in the forward and (mirrored) in the backward. Which rank holds which
// members build recorded in the stage facts (contiguous blocks over the axis).
#include "ir/pass.h"

namespace piper::ir {

void shard_pass(LowerContext& c) {
  Graph& g = c.graph;
  int32_t act = g.tensor("activation"), grad = g.tensor("activation_grad");
  for (const auto& d : c.strategy.directives) {
    const auto* sh = std::get_if<ShardDirective>(&d.body);
    if (!sh) continue;
    const int32_t axis = c.axis_index(sh->axis);
    const StreamId stream = g.stream(sh->stream.empty() ? "comm" : sh->stream);
    auto is_expert_piece = [&](const Node& n) {
      if (n.segment < 0) return false;
      RegionId list = g.segment_of(n).sharded;
      return list >= 0 && std::find(sh->regions.begin(), sh->regions.end(), list) != sh->regions.end();
    };
    auto a2a_bytes = [&](const Node& n) {
      RegionId list = g.segment_of(n).sharded;
      const Region& first = c.manifest.regions[static_cast<size_t>(c.manifest.regions[static_cast<size_t>(list)].children.front())];
      return c.activation_bytes(first.input);
    };
    // Activations into an expert piece are dispatched; activations out of it are combined. The
    // backward mirrors it: gradients into the piece come back through the combine's transpose.
    const size_t n_edges = g.edges.size();
    for (size_t e = 0; e < n_edges; ++e) {
      const Edge edge = g.edges[e];
      if (edge.kind != EdgeKind::Data || (edge.label != act && edge.label != grad)) continue;
      const Node src = g.nodes[edge.src], dst = g.nodes[edge.dst];
      bool into = is_chunk(dst.op) && is_expert_piece(dst) && !(is_chunk(src.op) && is_expert_piece(src));
      bool out_of = is_chunk(src.op) && is_expert_piece(src) && !(is_chunk(dst.op) && is_expert_piece(dst));
      if (!into && !out_of) continue;
      const Node& piece = into ? dst : src;
      bool backward = edge.label == grad;
      // Forward: dispatch in, combine out. Backward: combine's transpose in, dispatch's out.
      Payload what = (into != backward) ? Payload::Dispatch : Payload::Combine;
      NodeId x = g.add(Node{.op = Op::AllToAll, .payload = what, .flags = uint8_t(backward ? kBackward : 0),
                            .stream = stream, .segment = piece.segment, .stage = piece.stage,
                            .microbatch = piece.microbatch, .chunk = piece.chunk, .ranks = piece.ranks, .axis = axis,
                            .bytes = a2a_bytes(piece)});
      g.edges[e].kind = EdgeKind::Dead;
      g.connect(edge.src, x, EdgeKind::Data, edge.bytes, edge.label);
      g.connect(x, edge.dst, EdgeKind::Data, edge.bytes, edge.label);
    }
  }
  g.remove_dead_edges();
}

}  // namespace piper::ir
