#include "ir/lower.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/pass.h"
#include "ir/verifier.h"
#include "lang/internal_error.h"

namespace piper::ir {

namespace {
struct Pass {
  PassInfo info;
  void (*run)(LowerContext&);
  bool p2p_invariant;  // after it, data edges between chunks never cross ranks (false only between place and p2p)
};

// The order matters: hosts needs only the mesh and the stages' coordinates, and comes first so
// that every later reader (the cost model, reports) finds it; cut decides the stages build lays out; split copies what build made; place
// needs every chunk to exist; p2p needs ranks; replicate and shard rewire edges that p2p may already
// have split; tie follows replicate, whose reductions it waits for, and mirror follows both for the
// same reason (place made the copies' updates, so replicate reduces each copy's gradients); norm follows tie and shard, as
// it waits for everything the updates wait for; storage lays out what replication decided (it adds
// no nodes); order needs the final pieces of every task (and must see
// all communication to find cycles through it); recompute only marks forwards, so it can come last.
const std::vector<Pass>& passes() {
  static const std::vector<Pass> table = {
      {{"hosts", "which host each rank runs on; which mesh axes and pipeline handoffs go between hosts"},
       hosts_pass, true},
      {{"cut", "stages of balanced placements cut again by measured region costs, when every region has one"},
       cut_pass, true},
      {{"build", "single-device DAG: per stage F and B chunks (cut into pieces) and an update; stage facts"},
       build_pass, true},
      {{"split", "copy F/B per microbatch; split backwards into BI/BW where orders name them"}, split_pass, true},
      {{"place", "ranks, virtual-stage index and stream of every chunk"}, place_pass, false},
      {{"p2p", "send/recv on every data edge that crosses ranks"}, p2p_pass, true},
      {{"replicate", "data parallelism: all-reduce, or ZeRO-1/2/3 reduce-scatter and all-gathers; buckets"},
       replicate_pass, true},
      {{"tie", "tied parameters: copies in several stages summed by ALLREDUCE_T before their updates"}, tie_pass,
       true},
      {{"mirror", "`mirror`: each stage's two copies sum their gradients by ALLREDUCE_C before their updates"},
       mirror_pass, true},
      {{"shard", "expert parallelism: all-to-all dispatch and combine around sharded pieces; owners"}, shard_pass,
       true},
      {{"norm", "clipping: the global gradient norm's all-reduce after the last gradient, before every update"},
       norm_pass, true},
      {{"storage", "what each replica member holds of each stage's parameters: whole, or its ZeRO shards"},
       storage_pass, true},
      {{"order", "temporal edges, overlap groups and streams from `order`; cycles are errors"}, order_pass, true},
      {{"recompute", "mark forwards whose activations are recomputed"}, recompute_pass, true},
  };
  return table;
}
// The plan's size is the user's choice: locate the error at the split (microbatches multiply
// every task) or, without one, at the first directive.
void too_large(const CheckedStrategy& s, const char* pass, size_t limit, DiagnosticEngine& diags) {
  const Directive* at = s.directives.empty() ? nullptr : &s.directives.front();
  for (const Directive& d : s.directives)
    if (std::holds_alternative<SplitDirective>(d.body)) at = &d;
  auto& e = diags.error(at ? at->loc : SourceLoc{},
                        fmt::format("the plan has more than {} DAG nodes, the limit (lowering pass '{}' went past it)",
                                    limit, pass));
  e.note(SourceLoc{}, fmt::format("{} microbatches over {} stages; each task becomes several nodes (pieces, "
                                  "transfers, and per microbatch the ZeRO-2/3 reductions and gathers)",
                                  s.microbatches, s.stages.size()));
  e.note(SourceLoc{}, "fewer microbatches, fewer ZeRO-3 units, or fewer stages");
  if (at)
    for (const Note& n : at->used_from) e.notes.push_back(n);
}

}  // namespace

const std::vector<PassInfo>& pass_list() {
  static const std::vector<PassInfo> infos = [] {
    std::vector<PassInfo> out;
    for (const Pass& p : passes()) out.push_back(p.info);
    return out;
  }();
  return infos;
}

std::optional<Graph> lower(const CheckedStrategy& s, const Manifest& m, DiagnosticEngine& diags,
                           const LowerOptions& options) {
  LowerContext c{s, m, diags, options, Graph{}, s.stages};
  PlanFacts& f = c.graph.facts;
  f.mesh = s.mesh;
  f.pipeline_axis = s.pipeline_axis_index();
  f.microbatches = s.microbatches;
  f.samples_per_microbatch = options.samples_per_microbatch;
  for (const auto& st : s.streams) c.graph.stream(st);
  // A stream's multiprocessor limit is the checker's record by stream id: nothing to lower.
  for (const StreamSmsLimit& l : s.stream_sms) f.stream_sms.push_back(StreamSms{c.graph.stream(l.stream), l.sms, l.loc});
  c.graph.node_limit = options.max_nodes;
  for (const Pass& p : passes()) {
    try {
      p.run(c);
    } catch (const Graph::TooLarge&) {
      too_large(s, p.info.name, options.max_nodes, diags);
      return std::nullopt;
    }
    if (c.failed) return std::nullopt;
    if (options.verify_each) {
      auto problems = verify(c.graph, p.p2p_invariant);
      if (!problems.empty())
        internal_error(__FILE__, __LINE__, fmt::format("the DAG is malformed after pass '{}':\n  {}", p.info.name,
                                                       fmt::join(problems, "\n  ")));
    }
    if (options.after_pass) options.after_pass(p.info.name, c.graph);
  }
  return std::move(c.graph);
}

}  // namespace piper::ir
