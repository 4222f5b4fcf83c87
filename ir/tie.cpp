// Pass 7, tie: a tied parameter (one tensor under several regions, the manifest's `ties`) that lands
// in several stages has a copy in each. The copies stay equal because each is stepped with the same
// gradient, the sum of all copies' gradients: per tie and pipeline coordinate holding copies, one
// ALLREDUCE_T sums them — between stages on one rank locally, then with the ranks at the other
// coordinates (the rest of their mesh coordinates equal) — once each copy's gradient is final here
// and before those stages' updates. Megatron keeps its embedding group (first and last pipeline
// stage) in sync the same way. Sums commute with the data-parallel mean, so the tie may follow the
// bucket's data-parallel reduction; with ZeRO the tied parameter is a bucket of its own (build), so
// its shards are the same elements in every copy and the tie sums shards.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "ir/pass.h"

namespace piper::ir {

namespace {
bool overlaps(const Range& a, const Range& b) { return a.begin < b.end && b.begin < a.end; }

const TiedSlot* tied_slot(const StageFacts& st, int32_t tie) {
  for (const TiedSlot& t : st.tied)
    if (t.tie == tie) return &t;
  return nullptr;
}

std::string describe(const Replication& r, const Graph& g) {
  if (r.axis < 0) return "not replicated";
  return r.zero == 0 ? fmt::format("replicated over '{}'", g.axis_name(r.axis))
                     : fmt::format("replicated over '{}' with zero({})", g.axis_name(r.axis), r.zero);
}

// The copies are summed element for element, so their stages must hold the same elements of them.
bool same_replication(LowerContext& c, const TieFacts& tf) {
  const Graph& g = c.graph;
  const Replication& a = g.stage(tf.stages.front()).replication;
  for (int32_t s : tf.stages) {
    const Replication& b = g.stage(s).replication;
    if (a.axis == b.axis && a.ways == b.ways && a.zero == b.zero) continue;
    const Tie& tie = c.manifest.ties[static_cast<size_t>(tf.tie)];
    auto name = [&](const TiedParam& p) {
      const Region& r = c.manifest.regions[static_cast<size_t>(p.region)];
      return fmt::format("{}.{}", r.name, r.params[static_cast<size_t>(p.index)].name);
    };
    // Point at the replicate statement that covers one copy but differs from the other.
    SourceLoc loc{};
    const Directive* where = nullptr;
    for (const auto& d : c.strategy.directives)
      if (const auto* rep = std::get_if<ReplicateDirective>(&d.body))
        for (RegionId sel : rep->regions)
          for (const TiedParam& p : tie.members)
            if (!where && c.manifest.is_ancestor(sel, p.region)) where = &d;
    if (where) loc = where->loc;
    auto& e = c.diags.error(loc, fmt::format("{} and {} are one tensor (tied in the manifest), but the stage holding "
                                             "the first is {} and stage {} is {}; tied copies must be replicated alike",
                                             name(tie.members.front()), name(tie.members.back()), describe(a, g), s,
                                             describe(b, g)));
    if (where)
      for (const Note& n : where->used_from) e.notes.push_back(n);
    return false;
  }
  return true;
}
}  // namespace

namespace {
// What the tie pass reads of the graph, per stage and the ranks holding it (a `mirror` copy's own).
struct Holders {
  std::map<std::pair<int32_t, GroupId>, NodeId> update;
  std::map<std::pair<int32_t, GroupId>, std::vector<NodeId>> producers, reductions;
  explicit Holders(const Graph& g) {
    for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
      const Node& n = g.nodes[static_cast<size_t>(v)];
      if (n.stage < 0) continue;
      const auto key = std::make_pair(n.stage, n.ranks);
      if (n.op == Op::U) update[key] = v;
      if (n.op == Op::B || n.op == Op::BW) producers[key].push_back(v);
      if (n.payload == Payload::Grad) reductions[key].push_back(v);
    }
  }
};

// The pipeline coordinates holding a stage: its own and, under `mirror`, its copy's.
std::vector<int64_t> coords_of(const StageFacts& st) {
  if (st.copied()) return {st.coord, st.copy_coord};
  return {st.coord};
}

// One tie's sum at one pipeline coordinate: the copies in the stages held there (`here`), each
// final after its reductions or backwards on these ranks, summed before each of their updates.
NodeId sum_at(LowerContext& c, const Holders& h, int32_t t, int64_t coord, const std::vector<int32_t>& here) {
  Graph& g = c.graph;
  const GroupId ranks = g.group(g.facts.mesh.ranks_at(g.facts.pipeline_axis, coord));
  const int32_t grads = g.tensor("param_grads");
  const StageFacts& first = g.stage(here.front());
  const Replication& rep = first.replication;
  const Range range = tied_slot(first, t)->range;
  const TiedParam& canon = c.manifest.ties[static_cast<size_t>(t)].members.front();
  const int64_t elem =
      dtype_bytes(c.manifest.regions[static_cast<size_t>(canon.region)].params[static_cast<size_t>(canon.index)].dtype);
  // With ZeRO each rank sums only its shard of the tied bucket.
  const int64_t elems = rep.axis >= 0 && rep.zero >= 1 ? (range.size() + rep.ways - 1) / rep.ways : range.size();
  const Node& u = g.nodes[static_cast<size_t>(h.update.at({here.front(), ranks}))];
  const NodeId tie = g.add(Node{.op = Op::AllReduce, .payload = Payload::Tied, .flags = kBackward,
                                .stream = g.stream("tie"), .stage = here.front(), .microbatch = -1, .chunk = u.chunk,
                                .bucket = t, .ranks = ranks, .axis = g.facts.pipeline_axis, .bytes = elems * elem});
  auto at = [&](const auto& m, int32_t s) {
    static const std::vector<NodeId> none;
    const auto it = m.find(std::make_pair(s, ranks));
    return it == m.end() ? none : it->second;
  };
  for (int32_t s : here) {
    const StageFacts& st = g.stage(s);
    const Range r = tied_slot(st, t)->range;
    // The copy's gradient is final here after its bucket's reductions, or (not replicated)
    // after every backward that writes it.
    if (st.replication.axis >= 0) {
      for (NodeId v : at(h.reductions, s))
        if (overlaps(st.replication.buckets[static_cast<size_t>(g.nodes[static_cast<size_t>(v)].bucket)], r))
          g.connect(v, tie, EdgeKind::Data, 0, grads);
    } else {
      for (NodeId v : at(h.producers, s))
        if (g.segment_of(g.nodes[static_cast<size_t>(v)]).touches(r)) g.connect(v, tie, EdgeKind::Data, 0, grads);
    }
    g.connect(tie, h.update.at({s, ranks}), EdgeKind::Data, elems * elem, grads);
  }
  return tie;
}
}  // namespace

void tie_pass(LowerContext& c) {
  Graph& g = c.graph;
  // Its own stream, because the sum waits for ranks at other pipeline coordinates: on the stream of
  // the stage's reductions it would hold back the gathers and reductions queued behind it there,
  // which those very ranks may be waiting for (ZeRO-3 under 1F1B deadlocks so). And on that stream
  // one rank's ties run in tie order, as every rank's calls on a group must match.
  g.stream("tie");  // interned here, tie or not: stream ids stay those of plans without ties
  std::map<int64_t, NodeId> last_at;  // per pipeline coordinate: the previous tie's node
  const Holders h(g);
  const size_t stages = g.facts.stages.size();
  for (int32_t t = 0; t < int32_t(c.manifest.ties.size()); ++t) {
    TieFacts tf;
    tf.tie = t;
    std::set<int64_t> coords;
    for (size_t s = 0; s < stages; ++s)
      if (tied_slot(g.facts.stages[s], t)) {
        tf.stages.push_back(static_cast<int32_t>(s));
        for (int64_t k : coords_of(g.facts.stages[s])) coords.insert(k);
      }
    if (tf.stages.size() < 2) continue;  // one stage lays the tensor out once: nothing to keep in sync
    if (!same_replication(c, tf)) {
      c.failed = true;
      return;
    }
    tf.coords.assign(coords.begin(), coords.end());
    for (int64_t coord : tf.coords) {
      std::vector<int32_t> here;  // the stages holding a copy at this coordinate (their own or `mirror`'s)
      for (int32_t s : tf.stages) {
        const auto held = coords_of(g.stage(s));
        if (std::find(held.begin(), held.end(), coord) != held.end()) here.push_back(s);
      }
      const NodeId tie = sum_at(c, h, t, coord, here);
      if (auto prev = last_at.find(coord); prev != last_at.end()) g.connect(prev->second, tie, EdgeKind::Temporal);
      last_at[coord] = tie;
    }
    g.facts.ties.push_back(std::move(tf));
  }
}

}  // namespace piper::ir
