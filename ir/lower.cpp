#include "ir/lower.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/pass.h"
#include "ir/verifier.h"
#include "lang/internal_error.h"

namespace piper::ir {

const std::vector<PassInfo>& pass_list() {
  static const std::vector<PassInfo> passes = {
      {"build", "single-device DAG: per stage F and B chunks (cut at sharded regions) and an update"},
      {"split", "copy F/B per microbatch; split backwards into BI/BW where orders name them"},
      {"place", "ranks, virtual-stage index and stream of every chunk"},
      {"p2p", "send/recv on every data edge that crosses ranks"},
      {"replicate", "data parallelism: all-reduce, or ZeRO-1/2/3 reduce-scatter and all-gathers"},
      {"shard", "expert parallelism: all-to-all dispatch and combine around sharded pieces"},
      {"order", "temporal edges, overlap groups and streams from `order`; cycles are errors"},
      {"recompute", "mark forwards whose activations are recomputed"},
  };
  return passes;
}

std::optional<Graph> lower(const CheckedStrategy& s, const Manifest& m, DiagnosticEngine& diags,
                           const LowerOptions& options) {
  LowerContext c{s, m, diags, options, Graph{}, {}, {}};
  for (const auto& axis : s.mesh) c.graph.mesh_axes.push_back(axis.name);
  for (const auto& st : s.streams) c.graph.stream(st);

  bool p2p_done = false;
  auto after = [&](const char* pass) {
    p2p_done = p2p_done || std::string_view(pass) == "p2p";
    if (options.verify_each) {
      auto problems = verify(c.graph, p2p_done || std::string_view(pass) == "build" || std::string_view(pass) == "split");
      if (!problems.empty())
        internal_error(__FILE__, __LINE__, fmt::format("the DAG is malformed after pass '{}':\n  {}", pass,
                                                       fmt::join(problems, "\n  ")));
    }
    if (options.after_pass) options.after_pass(pass, c.graph);
  };
  // The order matters: split copies what build made; place needs every chunk to exist; p2p needs
  // ranks; replicate and shard rewire edges that p2p may already have split; order needs the final
  // pieces of every task (and must see all communication to find cycles through it).
  build_pass(c);
  for (const auto& segs : c.segments) {  // the runtime runs pieces; it needs to know what is in them
    c.graph.piece_regions.emplace_back();
    c.graph.piece_sharded.emplace_back();
    for (const auto& seg : segs) {
      c.graph.piece_regions.back().push_back(seg.regions);
      c.graph.piece_sharded.back().push_back(seg.sharded);
    }
  }
  after("build");
  split_pass(c);
  after("split");
  place_pass(c);
  after("place");
  p2p_pass(c);
  after("p2p");
  replicate_pass(c);
  after("replicate");
  shard_pass(c);
  after("shard");
  if (!order_pass(c)) return std::nullopt;
  after("order");
  recompute_pass(c);
  after("recompute");
  return std::move(c.graph);
}

}  // namespace piper::ir
