#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "ir/emit.h"
#include "lang/internal_error.h"
#include "scheduler/schedule.h"

namespace piper::sched {

using ir::Node;
using ir::NodeId;
using ir::Op;

int32_t Schedule::class_of_rank(int32_t rank) const {
  for (size_t c = 0; c < classes.size(); ++c)
    if (std::binary_search(classes[c].ranks.begin(), classes[c].ranks.end(), rank)) return static_cast<int32_t>(c);
  return -1;
}

namespace {

int priority(Op op) {
  switch (op) {
    case Op::B:
    case Op::BI: return 1;
    case Op::F: return 2;
    case Op::BW: return 3;
    case Op::U: return 4;
    default: return 0;  // communication unblocks others
  }
}

struct Unit {  // what is scheduled at once: one node, or an overlap group's members
  std::vector<NodeId> nodes;
};

// A candidate's rank: earliest start, then priority, microbatch, stage and node (a strict order, so
// the schedule is deterministic).
struct Best {
  double est;
  int prio;
  int32_t mb, stage;
  NodeId node;
  int32_t res;
  bool operator<(const Best& o) const {
    return std::tie(est, prio, mb, stage, node) < std::tie(o.est, o.prio, o.mb, o.stage, o.node);
  }
};

// One resource's ready candidates. A plain one (no overlap partner, no just-in-time anchor) can
// start at max(free_at, its ready time), and free_at only grows: those not ready by free_at wait in
// a heap by ready time; once free_at passes it they move to a heap by (priority, microbatch, stage,
// node), where the earliest start no longer separates them. The best plain candidate is the top
// of one of the two heaps — log time instead of a scan, so scheduling grows with the DAG, not with
// the DAG times the ready list. The others are few and scanned.
class ReadyQueue {
 public:
  void push(const Best& b, bool plain) {
    if (!plain) return special_.push_back(b.node);
    waiting_.push_back(b);
    std::push_heap(waiting_.begin(), waiting_.end(), later);
  }
  // The best plain candidate if the resource is free from `free_at`.
  std::optional<Best> best(double free_at) {
    while (!waiting_.empty() && waiting_.front().est <= free_at) {
      available_.push_back(waiting_.front());
      std::pop_heap(waiting_.begin(), waiting_.end(), later);
      waiting_.pop_back();
      std::push_heap(available_.begin(), available_.end(), lower_rank);
    }
    if (!available_.empty()) {
      Best b = available_.front();
      b.est = free_at;
      return b;
    }
    if (!waiting_.empty()) return waiting_.front();
    return std::nullopt;
  }
  void remove(NodeId v) {  // v is a special candidate or the best plain one
    if (auto it = std::find(special_.begin(), special_.end(), v); it != special_.end()) {
      special_.erase(it);
    } else if (!available_.empty() && available_.front().node == v) {
      std::pop_heap(available_.begin(), available_.end(), lower_rank);
      available_.pop_back();
    } else {
      PIPER_INTERNAL_ASSERT(!waiting_.empty() && waiting_.front().node == v, "scheduler: removing a candidate not at the top");
      std::pop_heap(waiting_.begin(), waiting_.end(), later);
      waiting_.pop_back();
    }
  }
  const std::vector<NodeId>& special() const { return special_; }

 private:
  // std heaps keep the largest first: these put the best first.
  static bool later(const Best& a, const Best& b) { return b < a; }
  static bool lower_rank(const Best& a, const Best& b) {
    return std::tie(b.prio, b.mb, b.stage, b.node) < std::tie(a.prio, a.mb, a.stage, a.node);
  }
  std::vector<Best> waiting_, available_;  // est: the ready time
  std::vector<NodeId> special_;
};

// Overlap windows (see StreamProgram::window). A `||` group's members are its tasks' entry pieces;
// every chunk with a member's (op, stage, microbatch) is a piece of that task. Per node: its task's
// group, or -1. A group with two tasks that add into one stage's weight gradients (B, BW) gets none:
// their order stays fixed, so the sums do too.
std::vector<int32_t> overlap_task_groups(const ir::Graph& g) {
  using Key = std::tuple<Op, int32_t, int32_t>;
  std::map<int32_t, std::vector<Key>> tasks;
  for (const Node& x : g.nodes)
    if (x.overlap >= 0 && ir::is_chunk(x.op) && x.op != Op::U) tasks[x.overlap].push_back({x.op, x.stage, x.microbatch});
  std::map<Key, int32_t> group_of;
  for (const auto& [group, keys] : tasks) {
    std::set<int32_t> accumulating;
    bool shared = false;
    for (const auto& [op, stage, mb] : keys)
      if (op == Op::B || op == Op::BW) shared |= !accumulating.insert(stage).second;
    if (!shared)
      for (const Key& k : keys) group_of.emplace(k, group);  // a task in two groups keeps the first
  }
  std::vector<int32_t> out(g.nodes.size(), -1);
  if (group_of.empty()) return out;
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (const Node& x = g.nodes[v]; ir::is_chunk(x.op) && x.op != Op::U)
      if (auto it = group_of.find({x.op, x.stage, x.microbatch}); it != group_of.end()) out[v] = it->second;
  return out;
}

// A window: a run of two or more consecutive ops of one group (one op alone has nothing to trade
// places with).
void mark_windows(const std::vector<int32_t>& group, StreamProgram& p) {
  p.window.assign(p.ops.size(), -1);
  int32_t next = 0;
  for (size_t i = 0; i < p.ops.size();) {
    const int32_t gr = group[static_cast<size_t>(p.ops[i])];
    size_t j = i + 1;
    while (gr >= 0 && j < p.ops.size() && group[static_cast<size_t>(p.ops[j])] == gr) ++j;
    if (j - i >= 2) {
      for (size_t k = i; k < j; ++k) p.window[k] = next;
      ++next;
    }
    i = j;
  }
}

}  // namespace

std::optional<Schedule> schedule(const ir::Graph& g, const CostModel& costs, DiagnosticEngine& diags) {
  const size_t n = g.nodes.size();
  Schedule s;
  s.node_class.assign(n, -1);
  s.start.assign(n, 0);
  s.finish.assign(n, 0);
  s.waits.assign(n, {});

  // Classes: the distinct rank sets of the nodes, in order of first appearance.
  std::unordered_map<ir::GroupId, int32_t> class_of_group;
  for (size_t v = 0; v < n; ++v) {
    auto [it, fresh] = class_of_group.emplace(g.nodes[v].ranks, static_cast<int32_t>(s.classes.size()));
    if (fresh) s.classes.push_back(ClassProgram{g.ranks(g.nodes[v].ranks), {}});
    s.node_class[v] = it->second;
  }
  // Resources: one per (class, stream).
  std::map<std::pair<int32_t, ir::StreamId>, int32_t> resource_index;
  std::vector<std::pair<int32_t, ir::StreamId>> resources;
  std::vector<int32_t> resource(n);
  for (size_t v = 0; v < n; ++v) {
    auto key = std::make_pair(s.node_class[v], g.nodes[v].stream);
    auto [it, fresh] = resource_index.emplace(key, static_cast<int32_t>(resources.size()));
    if (fresh) resources.push_back(key);
    resource[v] = it->second;
  }
  // Overlap groups must share a resource: co-scheduled work runs on one device, one stream.
  std::unordered_map<int32_t, std::vector<NodeId>> overlap;
  for (size_t v = 0; v < n; ++v)
    if (g.nodes[v].overlap >= 0) overlap[g.nodes[v].overlap].push_back(static_cast<NodeId>(v));
  for (const auto& [id, members] : overlap)
    for (NodeId m : members)
      if (resource[static_cast<size_t>(m)] != resource[static_cast<size_t>(members.front())]) {
        diags.error(SourceLoc{}, fmt::format("{} and {} are ordered to overlap (`||`) but run on different devices or "
                                             "streams",
                                             ir::token(g.nodes[static_cast<size_t>(members.front())]),
                                             ir::token(g.nodes[static_cast<size_t>(m)])));
        return std::nullopt;
      }

  ir::Graph::Adjacency adj = g.adjacency();
  std::vector<int32_t> pending(n);
  std::vector<double> ready_at(n, 0);
  for (size_t v = 0; v < n; ++v) pending[v] = adj.in_offsets[v + 1] - adj.in_offsets[v];
  std::vector<double> free_at(resources.size(), 0);
  std::vector<bool> done(n, false);
  std::vector<std::vector<NodeId>> order(resources.size());
  // ZeRO-3 gathers without a predecessor (the first units of a forward or backward; later ones wait
  // for the piece two before their consumer) are issued just in time: once their task's entry piece
  // waits for nothing but gathers. Issued as soon as possible they would all start at once and hold
  // every microbatch's parameters together, which no real system does.
  std::vector<int32_t> gathers_pending(n, 0);
  for (const ir::Edge& e : g.edges)
    if (g.nodes[static_cast<size_t>(e.src)].flags & ir::kMaterialize) ++gathers_pending[static_cast<size_t>(e.dst)];
  std::map<std::tuple<int32_t, int32_t, bool>, NodeId> entry;  // (stage, microbatch, backward) -> first piece to run
  for (size_t v = 0; v < n; ++v) {
    const Node& x = g.nodes[v];
    if (x.op != Op::F && x.op != Op::B && x.op != Op::BI) continue;
    const bool back = x.op != Op::F;
    auto [it, fresh] = entry.emplace(std::make_tuple(x.stage, x.microbatch, back), static_cast<NodeId>(v));
    const int16_t cur = g.nodes[static_cast<size_t>(it->second)].segment;
    if (!fresh && (back ? x.segment > cur : x.segment < cur)) it->second = static_cast<NodeId>(v);
  }
  std::vector<NodeId> anchor(n, -1);  // a just-in-time gather's entry piece
  for (const ir::Edge& e : g.edges) {
    const Node& x = g.nodes[static_cast<size_t>(e.src)];
    if (!(x.flags & ir::kMaterialize) || adj.in_offsets[static_cast<size_t>(e.src) + 1] != adj.in_offsets[static_cast<size_t>(e.src)])
      continue;
    const Node& c = g.nodes[static_cast<size_t>(e.dst)];
    if (auto it = entry.find({c.stage, c.microbatch, c.op != Op::F}); it != entry.end()) anchor[static_cast<size_t>(e.src)] = it->second;
  }
  s.issue_after.assign(n, {});

  auto group_size = [&](const Node& x) -> int64_t {
    if (x.payload == ir::Payload::Tied)  // the ranks at the pipeline coordinates that hold copies
      for (const auto& t : g.facts.ties)
        if (t.tie == x.bucket) return static_cast<int64_t>(t.coords.size());
    return g.facts.mesh.size(x.axis);
  };
  // A chunk's share of its stage's work: its piece's FLOPs over the stage's (evenly when unknown).
  std::vector<double> share(n, 1.0);
  for (size_t v = 0; v < n; ++v) {
    const Node& x = g.nodes[v];
    if (!ir::is_chunk(x.op) || x.op == Op::U || x.segment < 0) continue;
    const auto& segs = g.stage(x.stage).segments;
    int64_t total = 0;
    for (const auto& sg : segs) total += sg.flops;
    share[v] = total > 0 ? double(segs[static_cast<size_t>(x.segment)].flops) / double(total) : 1.0 / double(segs.size());
  }
  // A recomputed piece runs its forward again before its backward (B, or BI where split): its cost
  // goes on that op.
  std::vector<NodeId> recomputed(n, -1);
  {
    std::map<std::tuple<int32_t, int32_t, int16_t>, NodeId> forwards;
    for (size_t v = 0; v < n; ++v)
      if (g.nodes[v].op == Op::F && (g.nodes[v].flags & ir::kRecompute))
        forwards[{g.nodes[v].stage, g.nodes[v].microbatch, g.nodes[v].segment}] = static_cast<NodeId>(v);
    if (!forwards.empty())
      for (size_t v = 0; v < n; ++v)
        if (const Node& x = g.nodes[v]; x.op == Op::B || x.op == Op::BI)
          if (auto it = forwards.find({x.stage, x.microbatch, x.segment}); it != forwards.end()) recomputed[v] = it->second;
  }
  std::vector<ReadyQueue> ready(resources.size());
  // A just-in-time gather is parked on its anchor until the anchor waits for nothing but gathers
  // (the condition never reverts): the candidates scanned each step stay few, not every gather of
  // the step (ZeRO-3 at 1,024 microbatches went quadratic).
  std::unordered_map<NodeId, std::vector<NodeId>> parked;
  auto anchor_waits = [&](NodeId a) { return pending[static_cast<size_t>(a)] > gathers_pending[static_cast<size_t>(a)]; };
  auto make_ready = [&](NodeId v) {
    const Node& x = g.nodes[static_cast<size_t>(v)];
    if (NodeId a = anchor[static_cast<size_t>(v)]; a >= 0 && anchor_waits(a)) {
      parked[a].push_back(v);
      return;
    }
    const int32_t r = resource[static_cast<size_t>(v)];
    ready[static_cast<size_t>(r)].push(Best{ready_at[static_cast<size_t>(v)], priority(x.op), x.microbatch, x.stage, v, r},
                                       x.overlap < 0 && anchor[static_cast<size_t>(v)] < 0);
  };
  for (size_t v = 0; v < n; ++v)
    if (pending[v] == 0) make_ready(static_cast<NodeId>(v));
  // A candidate is schedulable when it (and every overlap partner) is ready.
  auto unit_of = [&](NodeId v) -> std::optional<Unit> {
    const Node& x = g.nodes[static_cast<size_t>(v)];
    if (NodeId a = anchor[static_cast<size_t>(v)]; a >= 0 && pending[static_cast<size_t>(a)] > gathers_pending[static_cast<size_t>(a)])
      return std::nullopt;
    if (x.overlap < 0) return Unit{{v}};
    Unit u{overlap.at(x.overlap)};
    for (NodeId m : u.nodes)
      if (pending[static_cast<size_t>(m)] != 0 || done[static_cast<size_t>(m)]) return std::nullopt;
    return u;
  };

  size_t remaining = n;
  while (remaining > 0) {
    std::optional<Best> best;
    for (size_t r = 0; r < resources.size(); ++r) {
      if (auto b = ready[r].best(free_at[r]); b && (!best || *b < *best)) best = b;
      for (NodeId v : ready[r].special()) {
        auto u = unit_of(v);
        if (!u) continue;
        double t = free_at[r];
        for (NodeId m : u->nodes) {
          t = std::max(t, ready_at[static_cast<size_t>(m)]);
          if (NodeId a = anchor[static_cast<size_t>(m)]; a >= 0)  // it will wait for that op's end
            if (const auto& before = order[static_cast<size_t>(resource[static_cast<size_t>(a)])]; !before.empty())
              t = std::max(t, s.finish[static_cast<size_t>(before.back())]);
        }
        const Node& x = g.nodes[static_cast<size_t>(v)];
        Best b{t, priority(x.op), x.microbatch, x.stage, v, static_cast<int32_t>(r)};
        if (!best || b < *best) best = b;
      }
    }
    if (!best) {
      // Nothing can start although work remains: co-scheduled tasks that wait on each other.
      std::vector<std::string> stuck;
      for (size_t r = 0; r < resources.size(); ++r)
        for (NodeId v : ready[r].special())
          if (g.nodes[static_cast<size_t>(v)].overlap >= 0) {
            std::vector<std::string> partners;
            for (NodeId m : overlap.at(g.nodes[static_cast<size_t>(v)].overlap))
              partners.push_back(fmt::format("{}{}", ir::token(g.nodes[static_cast<size_t>(m)]),
                                             pending[static_cast<size_t>(m)] ? " (waiting)" : " (ready)"));
            stuck.push_back(fmt::format("{}", fmt::join(partners, " || ")));
          }
      std::sort(stuck.begin(), stuck.end());
      stuck.erase(std::unique(stuck.begin(), stuck.end()), stuck.end());
      // Locate the error at the order that asked for the first stuck overlap.
      SourceLoc at;
      for (size_t r = 0; r < resources.size() && !at.valid(); ++r)
        for (NodeId v : ready[r].special())
          if (int32_t o = g.nodes[static_cast<size_t>(v)].overlap; o >= 0 && size_t(o) < g.facts.overlap_locs.size()) {
            at = g.facts.overlap_locs[static_cast<size_t>(o)];
            break;
          }
      // Otherwise any overlap whose members never ran (all of them may still be waiting).
      for (size_t v = 0; v < g.nodes.size() && !at.valid(); ++v)
        if (int32_t o = g.nodes[v].overlap; !done[v] && o >= 0 && size_t(o) < g.facts.overlap_locs.size())
          at = g.facts.overlap_locs[static_cast<size_t>(o)];
      auto& d = diags.error(at, fmt::format("the plan deadlocks: {} of {} tasks can never start", remaining, n));
      for (size_t i = 0; i < std::min<size_t>(stuck.size(), 4); ++i)
        d.note(SourceLoc{}, "tasks ordered to overlap must start together, but one waits on the other: " + stuck[i]);
      return std::nullopt;
    }
    Unit u = *unit_of(best->node);
    std::vector<double> member;  // each member's own cost
    for (NodeId m : u.nodes) {
      double c = costs.cost(g, g.nodes[static_cast<size_t>(m)], group_size(g.nodes[static_cast<size_t>(m)]), share[static_cast<size_t>(m)]);
      if (NodeId f = recomputed[static_cast<size_t>(m)]; f >= 0)
        c += costs.cost(g, g.nodes[static_cast<size_t>(f)], group_size(g.nodes[static_cast<size_t>(f)]), share[static_cast<size_t>(f)]);
      member.push_back(c);
    }
    double dur = 0;
    for (double c : member) dur += c;
    const double sum = dur;
    if (u.nodes.size() > 1) dur = costs.overlap(dur);
    const double start = best->est, finish = start + dur;
    for (NodeId m : u.nodes)  // a just-in-time gather follows the op now last before its consumer
      if (NodeId a = anchor[static_cast<size_t>(m)]; a >= 0)
        if (const auto& before = order[static_cast<size_t>(resource[static_cast<size_t>(a)])]; !before.empty())
          s.issue_after[static_cast<size_t>(m)].push_back(before.back());
    free_at[static_cast<size_t>(best->res)] = finish;
    auto& rlist = ready[static_cast<size_t>(best->res)];
    // An overlapped group's members share its interval, each its part in turn (the executor runs
    // them in this order on the stream, so what they hold comes and goes one after another).
    double at = start;
    for (size_t k = 0; k < u.nodes.size(); ++k) {
      const NodeId m = u.nodes[k];
      const double part = sum > 0 ? dur * member[k] / sum : dur / double(u.nodes.size());
      s.start[static_cast<size_t>(m)] = at;
      s.finish[static_cast<size_t>(m)] = k + 1 == u.nodes.size() ? finish : (at += part);
      done[static_cast<size_t>(m)] = true;
      order[static_cast<size_t>(best->res)].push_back(m);
      rlist.remove(m);
      --remaining;
    }
    for (NodeId m : u.nodes)
      for (int32_t k = adj.out_offsets[static_cast<size_t>(m)]; k < adj.out_offsets[static_cast<size_t>(m) + 1]; ++k) {
        NodeId w = g.edges[static_cast<size_t>(adj.out_edges[static_cast<size_t>(k)])].dst;
        ready_at[static_cast<size_t>(w)] = std::max(ready_at[static_cast<size_t>(w)], finish);
        if (g.nodes[static_cast<size_t>(m)].flags & ir::kMaterialize) --gathers_pending[static_cast<size_t>(w)];
        if (--pending[static_cast<size_t>(w)] == 0) make_ready(w);
        if (auto it = parked.find(w); it != parked.end() && !anchor_waits(w)) {
          auto gathers = std::move(it->second);
          parked.erase(it);
          for (NodeId p : gathers) make_ready(p);
        }
      }
  }

  const std::vector<int32_t> task_group = overlap_task_groups(g);
  for (size_t r = 0; r < resources.size(); ++r) {
    StreamProgram p{resources[r].second, std::move(order[r]), {}};
    mark_windows(task_group, p);
    s.classes[static_cast<size_t>(resources[r].first)].streams.push_back(std::move(p));
  }
  for (auto& c : s.classes)
    std::sort(c.streams.begin(), c.streams.end(), [](auto& a, auto& b) { return a.stream < b.stream; });
  // Events only where a dependency crosses streams of one class.
  for (const ir::Edge& e : g.edges) {
    size_t a = static_cast<size_t>(e.src), b = static_cast<size_t>(e.dst);
    if (s.node_class[a] == s.node_class[b] && g.nodes[a].stream != g.nodes[b].stream) s.waits[b].push_back(e.src);
  }
  for (size_t v = 0; v < n; ++v) s.step_time = std::max(s.step_time, s.finish[v]);
  return s;
}

std::optional<std::string> find_deadlock(const ir::Graph& g, const Schedule& s) {
  const size_t n = g.nodes.size();
  // Each (class, stream) runs its ops in order; pointer = the op at its head.
  struct Stream {
    int32_t cls;
    const StreamProgram* prog;
    size_t head = 0;
  };
  std::vector<Stream> streams;
  std::vector<int32_t> stream_of(n, -1);
  std::vector<size_t> position(n, 0);
  for (size_t c = 0; c < s.classes.size(); ++c)
    for (const auto& p : s.classes[c].streams) {
      for (size_t i = 0; i < p.ops.size(); ++i) {
        stream_of[static_cast<size_t>(p.ops[i])] = static_cast<int32_t>(streams.size());
        position[static_cast<size_t>(p.ops[i])] = i;
      }
      streams.push_back(Stream{static_cast<int32_t>(c), &p});
    }
  ir::Graph::Adjacency adj = g.adjacency();
  std::vector<bool> done(n, false);
  auto at_head = [&](NodeId v) {
    const Stream& st = streams[static_cast<size_t>(stream_of[static_cast<size_t>(v)])];
    return st.head < st.prog->ops.size() && st.prog->ops[st.head] == v;
  };
  // What a head op is blocked on: a predecessor not done yet, or its rendezvous partner not posted.
  auto blocker = [&](NodeId v) -> std::optional<NodeId> {
    const Node& x = g.nodes[static_cast<size_t>(v)];
    for (int32_t k = adj.in_offsets[static_cast<size_t>(v)]; k < adj.in_offsets[static_cast<size_t>(v) + 1]; ++k) {
      NodeId u = g.edges[static_cast<size_t>(adj.in_edges[static_cast<size_t>(k)])].src;
      if (x.op == Op::Recv && g.nodes[static_cast<size_t>(u)].op == Op::Send) continue;  // the rendezvous, below
      if (!done[static_cast<size_t>(u)]) return u;
    }
    auto partner = [&]() -> NodeId {
      if (x.op == Op::Recv)
        for (int32_t k = adj.in_offsets[static_cast<size_t>(v)]; k < adj.in_offsets[static_cast<size_t>(v) + 1]; ++k) {
          NodeId u = g.edges[static_cast<size_t>(adj.in_edges[static_cast<size_t>(k)])].src;
          if (g.nodes[static_cast<size_t>(u)].op == Op::Send) return u;
        }
      for (int32_t k = adj.out_offsets[static_cast<size_t>(v)]; k < adj.out_offsets[static_cast<size_t>(v) + 1]; ++k) {
        NodeId w = g.edges[static_cast<size_t>(adj.out_edges[static_cast<size_t>(k)])].dst;
        if (g.nodes[static_cast<size_t>(w)].op == Op::Recv) return w;
      }
      return -1;
    };
    if (static_cast<size_t>(v) < s.issue_after.size())
      for (NodeId u : s.issue_after[static_cast<size_t>(v)])
        if (!done[static_cast<size_t>(u)]) return u;
    if (x.op == Op::Send || x.op == Op::Recv) {
      NodeId p = partner();
      if (p >= 0 && !done[static_cast<size_t>(p)] && !at_head(p)) return p;
    }
    return std::nullopt;
  };

  size_t finished = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (auto& st : streams) {
      while (st.head < st.prog->ops.size()) {
        NodeId v = st.prog->ops[st.head];
        if (blocker(v)) break;
        done[static_cast<size_t>(v)] = true;
        ++st.head;
        ++finished;
        progress = true;
      }
    }
  }
  if (finished == n) return std::nullopt;

  // Follow "blocked by" from one stuck stream until a stream repeats: that is the cycle of waits.
  std::vector<std::string> cycle;
  std::map<int32_t, size_t> seen;
  int32_t cur = -1;
  for (size_t i = 0; i < streams.size(); ++i)
    if (streams[i].head < streams[i].prog->ops.size()) {
      cur = static_cast<int32_t>(i);
      break;
    }
  std::vector<int32_t> path;
  while (cur >= 0 && !seen.count(cur)) {
    seen[cur] = path.size();
    path.push_back(cur);
    const Stream& st = streams[static_cast<size_t>(cur)];
    NodeId head = st.prog->ops[st.head];
    auto b = blocker(head);
    cur = b ? stream_of[static_cast<size_t>(*b)] : -1;
  }
  auto name = [&](int32_t si) {
    const Stream& st = streams[static_cast<size_t>(si)];
    return fmt::format("rank {} {}", ir::rank_list(s.classes[static_cast<size_t>(st.cls)].ranks), g.streams[st.prog->stream]);
  };
  std::string out = "the per-rank programs deadlock (blocking send/recv and events):\n";
  for (size_t i = 0; i < streams.size(); ++i) {
    const Stream& st = streams[i];
    out += fmt::format("  {:<24}", name(static_cast<int32_t>(i)) + ":");
    for (size_t k = 0; k < st.prog->ops.size(); ++k) {
      out += " " + ir::token(g.nodes[static_cast<size_t>(st.prog->ops[k])]);
      if (k == st.head) {
        out += "  <-- ERROR HERE";
        break;
      }
    }
    out += "\n";
  }
  if (cur >= 0) {
    out += "  cycle of waits:";
    for (size_t i = seen[cur]; i < path.size(); ++i) {
      const Stream& st = streams[static_cast<size_t>(path[i])];
      out += fmt::format(" {} [{}] ->", name(path[i]), ir::token(g.nodes[static_cast<size_t>(st.prog->ops[st.head])]));
    }
    out += fmt::format(" {}\n", name(cur));
  }
  return out;
}

}  // namespace piper::sched
