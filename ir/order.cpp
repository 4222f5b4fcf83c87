// Pass 11, order: `order` directives become temporal edges — from the sinks of each group's tasks
// to the sources of the next group's — `a || b` marks a co-scheduled group, and `on stream` puts
// the tasks' exchanges (their all-to-alls) on a logical stream. An order that would make the DAG
// cyclic, or that relates tasks on different devices, is the user's error, reported at the
// directive(s) responsible.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

namespace {
Op op_for(TaskKind k, bool split) {
  switch (k) {
    case TaskKind::Fwd: return Op::F;
    case TaskKind::Bwd: return split ? Op::BI : Op::B;
    case TaskKind::BwdInput: return Op::BI;
    case TaskKind::BwdWeight: return Op::BW;
  }
  return Op::F;
}

std::string task_text(const Task& t) { return fmt::format("{}({}, {})", task_kind_name(t.kind), t.stage, t.microbatch); }
}  // namespace

namespace {
// A cycle the orders made: located at the last order on it, with the others as notes.
void report_cycle(LowerContext& c, const std::vector<const Directive*>& dirs, const std::vector<NodeId>& stuck) {
  Graph& g = c.graph;
  // Find one concrete cycle among the stuck nodes, then name the orders on it. Every stuck node
  // has a stuck predecessor (that is why it is stuck), so walking predecessors must loop.
  std::set<NodeId> stuck_set(stuck.begin(), stuck.end());
  Graph::Adjacency adj = g.adjacency();
  NodeId cur = stuck.front();
  std::vector<int32_t> path;  // edges walked backwards
  std::map<NodeId, size_t> seen;
  while (!seen.count(cur)) {
    seen[cur] = path.size();
    int32_t prev_edge = -1;
    for (int32_t k = adj.in_offsets[static_cast<size_t>(cur)]; k < adj.in_offsets[static_cast<size_t>(cur) + 1]; ++k) {
      int32_t e = adj.in_edges[static_cast<size_t>(k)];
      if (stuck_set.count(g.edges[static_cast<size_t>(e)].src)) { prev_edge = e; break; }
    }
    PIPER_INTERNAL_ASSERT(prev_edge >= 0, "a node left by the topological sort has no stuck predecessor");
    path.push_back(prev_edge);
    cur = g.edges[static_cast<size_t>(prev_edge)].src;
  }
  std::vector<int32_t> cycle(path.begin() + static_cast<long>(seen[cur]), path.end());
  std::reverse(cycle.begin(), cycle.end());  // back into forward direction
  std::vector<std::string> steps;
  std::vector<int32_t> orders;
  for (int32_t e : cycle) {
    const Edge& edge = g.edges[static_cast<size_t>(e)];
    steps.push_back(token(g.nodes[static_cast<size_t>(edge.src)]));
    if (edge.kind == EdgeKind::Temporal && edge.label >= 0 &&
        std::find(orders.begin(), orders.end(), edge.label) == orders.end())
      orders.push_back(edge.label);
  }
  steps.push_back(token(g.nodes[static_cast<size_t>(g.edges[static_cast<size_t>(cycle.front())].src)]));
  PIPER_INTERNAL_ASSERT(!orders.empty(), "a cycle made of data dependencies alone");
  const Directive& culprit = *dirs[static_cast<size_t>(orders.back())];
  auto& diag = c.diags.error(culprit.loc, fmt::format("this order creates a cycle: {}", fmt::join(steps, " -> ")));
  for (const Note& n : culprit.used_from) diag.notes.push_back(n);
  for (size_t i = 0; i + 1 < orders.size(); ++i) diag.note(dirs[static_cast<size_t>(orders[i])]->loc, "the cycle also uses this order");
  if (orders.size() == 1) diag.note(SourceLoc{}, "the rest of the cycle is data dependencies (a forward precedes its backward, stage s precedes s+1)");
}

// The all-to-alls a task's pieces exchange (expert dispatch and combine): (stage, microbatch,
// backward) -> nodes.
using Exchanges = std::map<std::tuple<int32_t, int32_t, bool>, std::vector<NodeId>>;
Exchanges task_exchanges(const Graph& g) {
  Exchanges out;
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    if (n.op == Op::AllToAll && n.microbatch >= 0) out[{n.stage, n.microbatch, (n.flags & kBackward) != 0}].push_back(v);
  }
  return out;
}

// `order ... on stream S` puts the ordered tasks' exchanges on S: one task's all-to-all can then
// run while its `||` partner computes. The pieces stay on the compute stream: moving them to S
// (as this pass once did) queued the compute behind the very exchange it was to hide.
// Returns whether it moved anything.
bool move_exchanges(Graph& g, const OrderDirective& o, const Exchanges& exchanges) {
  const StreamId st = g.stream(o.stream);
  bool moved = false;
  for (const auto& group : o.chain)
    for (const Task& t : group) {
      if (t.kind == TaskKind::BwdWeight) continue;  // a weight gradient exchanges nothing
      auto it = exchanges.find({int32_t(t.stage), int32_t(t.microbatch), t.kind != TaskKind::Fwd});
      if (it == exchanges.end()) continue;
      for (NodeId v : it->second) g.nodes[static_cast<size_t>(v)].stream = st;
      moved = true;
    }
  return moved;
}

// An order statement's `on stream` that moved nothing in any of its instances (its tasks exchange
// no all-to-alls: a dense model, or no experts sharded) says nothing: a warning, once per statement.
using StreamedOrders = std::map<std::tuple<FileId, uint32_t, uint32_t>, std::pair<const Directive*, bool>>;
void warn_unmoved(LowerContext& c, const StreamedOrders& streamed) {
  for (const auto& [loc, entry] : streamed) {
    if (entry.second) continue;
    auto& w = c.diags.warning(entry.first->loc, fmt::format("`on stream {}` moves nothing here: an order's stream takes its "
                                                             "tasks' all-to-alls, and these tasks exchange none",
                                                             std::get<OrderDirective>(entry.first->body).stream));
    w.note(SourceLoc{}, "a task's compute stays on the compute stream; put communication on a stream where it is "
                        "made (`replicate ... on stream`, `shard ... on stream`)");
    for (const Note& n : entry.first->used_from) w.notes.push_back(n);
  }
}
}  // namespace

void order_pass(LowerContext& c) {
  Graph& g = c.graph;
  const Exchanges exchanges = task_exchanges(g);
  StreamedOrders streamed;
  // The pieces of each task: (op, stage, microbatch) -> nodes in segment order.
  std::map<std::tuple<Op, int32_t, int32_t>, std::vector<NodeId>> pieces;
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[v];
    if (is_chunk(n.op) && n.op != Op::U) pieces[{n.op, n.stage, n.microbatch}].push_back(v);
  }
  auto task_nodes = [&](const Task& t) -> const std::vector<NodeId>& {
    auto it = pieces.find({op_for(t.kind, false), int32_t(t.stage), int32_t(t.microbatch)});
    if (it == pieces.end()) it = pieces.find({op_for(t.kind, true), int32_t(t.stage), int32_t(t.microbatch)});
    PIPER_INTERNAL_ASSERT(it != pieces.end(), "order names a task the DAG does not have: " + task_text(t));
    return it->second;
  };
  // Forward pieces run in segment order; backward pieces in reverse.
  auto first = [&](const Task& t) { const auto& v = task_nodes(t); return t.kind == TaskKind::Fwd ? v.front() : v.back(); };
  auto last = [&](const Task& t) { const auto& v = task_nodes(t); return t.kind == TaskKind::Fwd ? v.back() : v.front(); };

  std::vector<const Directive*> dirs;  // temporal edge label -> its directive
  int32_t overlap = 0;
  bool ok = true;
  for (const auto& d : c.strategy.directives) {
    const auto* o = std::get_if<OrderDirective>(&d.body);
    if (!o) continue;
    int32_t label = static_cast<int32_t>(dirs.size());
    dirs.push_back(&d);
    if (!o->stream.empty()) {
      auto& [first_instance, moved] = streamed[{d.loc.file, d.loc.line, d.loc.col}];
      first_instance = first_instance ? first_instance : &d;
      moved = move_exchanges(g, *o, exchanges) || moved;
    }
    // Co-scheduled tasks start together: their entry pieces form the group. Later pieces of a task
    // cut at sharded regions follow as their data allows, interleaving with the partner's (their
    // all-to-alls then hide behind the partner's compute, as in DualPipe).
    for (const auto& group : o->chain) {
      if (group.size() < 2) continue;
      for (const Task& t : group) g.nodes[static_cast<size_t>(first(t))].overlap = overlap;
      g.facts.overlap_locs.push_back(d.loc);
      ++overlap;
    }
    for (size_t k = 0; k + 1 < o->chain.size(); ++k)
      for (const Task& a : o->chain[k])
        for (const Task& b : o->chain[k + 1]) {
          NodeId src = last(a), dst = first(b);
          GroupId ra = g.nodes[static_cast<size_t>(src)].ranks, rb = g.nodes[static_cast<size_t>(dst)].ranks;
          if (ra != rb) {
            auto ranks = [&](GroupId grp) { return fmt::format("{}", fmt::join(g.ranks(grp), ",")); };
            auto& diag = c.diags.error(d.loc, fmt::format("this order relates tasks on different devices: {} runs on "
                                                          "ranks {{{}}} but {} on ranks {{{}}}",
                                                          task_text(a), ranks(ra), task_text(b), ranks(rb)));
            diag.note(SourceLoc{}, "an order sequences work on one device; across devices, data dependencies do that");
            for (const Note& n : d.used_from) diag.notes.push_back(n);
            ok = false;
            continue;
          }
          g.connect(src, dst, EdgeKind::Temporal, 0, label);
        }
  }
  if (!ok) {
    c.failed = true;
    return;
  }
  warn_unmoved(c, streamed);

  std::vector<NodeId> stuck;
  if (g.topological_order(&stuck)) return;
  c.failed = true;
  report_cycle(c, dirs, stuck);
}

}  // namespace piper::ir
