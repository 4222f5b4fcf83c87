// The list scheduler: per-rank stream programs from the DAG, simulated as they are made.
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

// A candidate's rank: earliest start, then turn, priority, microbatch, stage and node (a strict
// order, so the schedule is deterministic). `turn` is 1 for a piece of a `||` window's task whose
// task also ran last on the resource: of two tasks' pieces ready together the other goes first.
struct Best {
  double est;
  int prio;
  int32_t mb, stage;
  NodeId node;
  int32_t res;
  int turn = 0;
  bool operator<(const Best& o) const {
    return std::tie(est, turn, prio, mb, stage, node) < std::tie(o.est, o.turn, o.prio, o.mb, o.stage, o.node);
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

// The list scheduler: it simulates as it goes, always starting next the candidate that can start
// earliest on its resource (one per class of identical ranks and stream), ties broken by priority,
// microbatch, stage and node. Phases: resources, just-in-time gathers, pricing, the loop, emission.
class ListScheduler {
 public:
  // `delay`: seconds added to each node's cost (sm_share_delay), or empty.
  ListScheduler(const ir::Graph& g, const CostModel& costs, DiagnosticEngine& diags, std::vector<double> delay = {})
      : g_(g), costs_(costs), diags_(diags), n_(g.nodes.size()), adj_(g.adjacency()), delay_(std::move(delay)) {}

  std::optional<Schedule> run() {
    assign_resources();
    if (!overlaps_share_resources()) return std::nullopt;
    number_window_tasks();
    anchor_gathers();
    price_pieces();
    for (size_t v = 0; v < n_; ++v) pending_[v] = adj_.in_offsets[v + 1] - adj_.in_offsets[v];
    ready_.resize(resources_.size());
    for (size_t v = 0; v < n_; ++v)
      if (pending_[v] == 0) make_ready(static_cast<NodeId>(v));
    for (size_t remaining = n_; remaining > 0;) {
      const std::optional<Best> best = pick();
      if (!best) {
        report_deadlock(remaining);
        return std::nullopt;
      }
      remaining -= start(*best);
    }
    emit();
    return std::move(s_);
  }

 private:
  size_t at(NodeId v) const { return static_cast<size_t>(v); }

  // Classes: the distinct rank sets of the nodes, in order of first appearance. Resources: one per
  // (class, stream).
  void assign_resources() {
    s_.node_class.assign(n_, -1);
    s_.start.assign(n_, 0);
    s_.finish.assign(n_, 0);
    s_.paired.assign(n_, -1);
    s_.waits.assign(n_, {});
    s_.issue_after.assign(n_, {});
    std::unordered_map<ir::GroupId, int32_t> class_of_group;
    std::map<std::pair<int32_t, ir::StreamId>, int32_t> resource_index;
    resource_.resize(n_);
    for (size_t v = 0; v < n_; ++v) {
      auto [it, fresh] = class_of_group.emplace(g_.nodes[v].ranks, static_cast<int32_t>(s_.classes.size()));
      if (fresh) s_.classes.push_back(ClassProgram{g_.ranks(g_.nodes[v].ranks), {}});
      s_.node_class[v] = it->second;
      auto key = std::make_pair(s_.node_class[v], g_.nodes[v].stream);
      auto [r, new_resource] = resource_index.emplace(key, static_cast<int32_t>(resources_.size()));
      if (new_resource) resources_.push_back(key);
      resource_[v] = r->second;
    }
    free_at_.assign(resources_.size(), 0);
    order_.resize(resources_.size());
    pending_.resize(n_);
    ready_at_.assign(n_, 0);
    done_.assign(n_, false);
  }

  void collect_rendezvous() {
    rendezvous_sets_ = cross_class_collectives(g_);
    rendezvous_.assign(n_, -1);
    for (size_t k = 0; k < rendezvous_sets_.size(); ++k)
      for (NodeId m : rendezvous_sets_[k]) rendezvous_[at(m)] = static_cast<int32_t>(k);
  }

  // Overlap groups must share a resource: co-scheduled work runs on one device, one stream.
  bool overlaps_share_resources() {
    for (size_t v = 0; v < n_; ++v) {
      if (g_.nodes[v].overlap >= 0) overlap_[g_.nodes[v].overlap].push_back(static_cast<NodeId>(v));
    }
    collect_rendezvous();
    for (const auto& [id, members] : overlap_)
      for (NodeId m : members)
        if (resource_[at(m)] != resource_[at(members.front())]) {
          diags_.error(SourceLoc{}, fmt::format("{} and {} are ordered to overlap (`||`) but run on different devices or "
                                                "streams",
                                                ir::token(g_.nodes[at(members.front())]), ir::token(g_.nodes[at(m)])));
          return false;
        }
    return true;
  }

  // ZeRO-3 gathers without a predecessor (the first units of a forward or backward; later ones wait
  // for the piece two before their consumer) are issued just in time: once their task's entry piece
  // waits for nothing but gathers. Issued as soon as possible they would all start at once and hold
  // every microbatch's parameters together, which no real system does.
  void anchor_gathers() {
    gathers_pending_.assign(n_, 0);
    for (const ir::Edge& e : g_.edges)
      if (g_.nodes[at(e.src)].flags & ir::kMaterialize) ++gathers_pending_[at(e.dst)];
    std::map<std::tuple<int32_t, int32_t, bool>, NodeId> entry;  // (stage, microbatch, backward) -> first piece to run
    for (size_t v = 0; v < n_; ++v) {
      const Node& x = g_.nodes[v];
      if (x.op != Op::F && x.op != Op::B && x.op != Op::BI) continue;
      const bool back = x.op != Op::F;
      auto [it, fresh] = entry.emplace(std::make_tuple(x.stage, x.microbatch, back), static_cast<NodeId>(v));
      const int16_t cur = g_.nodes[at(it->second)].segment;
      if (!fresh && (back ? x.segment > cur : x.segment < cur)) it->second = static_cast<NodeId>(v);
    }
    anchor_.assign(n_, -1);
    for (const ir::Edge& e : g_.edges) {
      const Node& x = g_.nodes[at(e.src)];
      if (!(x.flags & ir::kMaterialize) || adj_.in_offsets[at(e.src) + 1] != adj_.in_offsets[at(e.src)]) continue;
      const Node& c = g_.nodes[at(e.dst)];
      if (auto it = entry.find({c.stage, c.microbatch, c.op != Op::F}); it != entry.end()) anchor_[at(e.src)] = it->second;
    }
  }

  // A chunk's share of its stage's work: its piece's FLOPs over the stage's (evenly when unknown). A
  // recomputed piece runs its forward again before its backward (B, or BI where split): its cost goes
  // on that op.
  void price_pieces() {
    share_.assign(n_, 1.0);
    for (size_t v = 0; v < n_; ++v) {
      const Node& x = g_.nodes[v];
      if (!ir::is_chunk(x.op) || x.op == Op::U || x.segment < 0) continue;
      const auto& segs = g_.stage(x.stage).segments;
      int64_t total = 0;
      for (const auto& sg : segs) total += sg.flops;
      share_[v] = total > 0 ? double(segs[static_cast<size_t>(x.segment)].flops) / double(total) : 1.0 / double(segs.size());
    }
    recomputed_.assign(n_, -1);
    std::map<std::tuple<int32_t, int32_t, int16_t>, NodeId> forwards;
    for (size_t v = 0; v < n_; ++v)
      if (g_.nodes[v].op == Op::F && (g_.nodes[v].flags & ir::kRecompute))
        forwards[{g_.nodes[v].stage, g_.nodes[v].microbatch, g_.nodes[v].segment}] = static_cast<NodeId>(v);
    if (forwards.empty()) return;
    for (size_t v = 0; v < n_; ++v)
      if (const Node& x = g_.nodes[v]; x.op == Op::B || x.op == Op::BI)
        if (auto it = forwards.find({x.stage, x.microbatch, x.segment}); it != forwards.end()) recomputed_[v] = it->second;
  }

  // The pieces of a `||` pair's tasks take turns when both are ready, as DualPipe's overlapped
  // chunk alternates them: one task's piece computes while the other's exchange (issued in that
  // same alternating order on its stream) is in flight. Left to priority, a backward's pieces would
  // all run first and queue the forward's exchanges behind the backward's on a shared stream, with
  // nothing left to compute beside them. Per node: its task's number, or -1 outside windows.
  void number_window_tasks() {
    const std::vector<int32_t> group = overlap_task_groups(g_);
    std::map<std::tuple<Op, int32_t, int32_t>, int32_t> number;
    window_task_.assign(n_, -1);
    for (size_t v = 0; v < n_; ++v)
      if (const Node& x = g_.nodes[v]; group[v] >= 0)
        window_task_[v] = number.emplace(std::make_tuple(x.op, x.stage, x.microbatch), int32_t(number.size())).first->second;
    last_task_.assign(resources_.size(), -1);
  }

  int64_t group_size(const Node& x) const {
    if (x.payload == ir::Payload::Tied)  // the ranks at the pipeline coordinates that hold copies
      for (const auto& t : g_.facts.ties)
        if (t.tie == x.bucket) return static_cast<int64_t>(t.coords.size());
    if (x.payload == ir::Payload::Norm) return g_.facts.mesh.world();  // every rank
    if (x.payload == ir::Payload::Copy) return 2;  // a stage's two copies (`mirror`)
    return g_.facts.mesh.size(x.axis);
  }
  double cost_of(NodeId m) const {
    double c = costs_.cost(g_, g_.nodes[at(m)], group_size(g_.nodes[at(m)]), share_[at(m)]);
    if (NodeId f = recomputed_[at(m)]; f >= 0) c += costs_.cost(g_, g_.nodes[at(f)], group_size(g_.nodes[at(f)]), share_[at(f)]);
    return delay_.empty() ? c : c + delay_[at(m)];
  }

  bool anchor_waits(NodeId a) const { return pending_[at(a)] > gathers_pending_[at(a)]; }

  // A just-in-time gather is parked on its anchor until the anchor waits for nothing but gathers
  // (the condition never reverts): the candidates scanned each step stay few, not every gather of
  // the step (ZeRO-3 at 1,024 microbatches went quadratic).
  void make_ready(NodeId v) {
    const Node& x = g_.nodes[at(v)];
    if (NodeId a = anchor_[at(v)]; a >= 0 && anchor_waits(a)) {
      parked_[a].push_back(v);
      return;
    }
    const int32_t r = resource_[at(v)];
    ready_[static_cast<size_t>(r)].push(Best{ready_at_[at(v)], priority(x.op), x.microbatch, x.stage, v, r},
                                        x.overlap < 0 && anchor_[at(v)] < 0 && rendezvous_[at(v)] < 0 &&
                                            window_task_[at(v)] < 0);
  }

  // A candidate is schedulable when it (and every overlap partner) is ready.
  std::optional<Unit> unit_of(NodeId v) const {
    const Node& x = g_.nodes[at(v)];
    if (NodeId a = anchor_[at(v)]; a >= 0 && anchor_waits(a)) return std::nullopt;
    if (int32_t k = rendezvous_[at(v)]; k >= 0)  // every member's share is ready
      for (NodeId m : rendezvous_sets_[static_cast<size_t>(k)])
        if (pending_[at(m)] != 0) return std::nullopt;
    if (x.overlap < 0) return Unit{{v}};
    Unit u{overlap_.at(x.overlap)};
    for (NodeId m : u.nodes)
      if (pending_[at(m)] != 0 || done_[at(m)]) return std::nullopt;
    return u;
  }

  // The best candidate over all resources: each queue's best plain one, and every special one scanned.
  std::optional<Best> pick() {
    std::optional<Best> best;
    for (size_t r = 0; r < resources_.size(); ++r) {
      if (auto b = ready_[r].best(free_at_[r]); b && (!best || *b < *best)) best = b;
      for (NodeId v : ready_[r].special()) {
        auto u = unit_of(v);
        if (!u) continue;
        double t = std::max(free_at_[r], unit_ready(*u));
        if (int32_t k = rendezvous_[at(v)]; k >= 0)  // it runs once the last member's input is final
          for (NodeId m : rendezvous_sets_[static_cast<size_t>(k)]) t = std::max(t, ready_at_[at(m)]);
        for (NodeId m : u->nodes) {
          if (NodeId a = anchor_[at(m)]; a >= 0)  // it will wait for that op's end
            if (const auto& before = order_[static_cast<size_t>(resource_[at(a)])]; !before.empty())
              t = std::max(t, s_.finish[at(before.back())]);
        }
        const Node& x = g_.nodes[at(v)];
        const int turn = window_task_[at(v)] >= 0 && window_task_[at(v)] == last_task_[r] && x.overlap < 0;
        Best b{t, priority(x.op), x.microbatch, x.stage, v, static_cast<int32_t>(r), turn};
        if (!best || b < *best) best = b;
      }
    }
    return best;
  }

  // When a unit can begin: when its node is ready; for an overlap group priced as one interval, when
  // every member is; otherwise when the first is (the executor's window runs whichever is ready).
  double unit_ready(const Unit& u) const {
    double first = ready_at_[at(u.nodes.front())], last = first;
    for (NodeId m : u.nodes) {
      first = std::min(first, ready_at_[at(m)]);
      last = std::max(last, ready_at_[at(m)]);
    }
    return costs_.prices_pairs() ? last : first;
  }

  // Starts `best`'s unit: its interval, each member's part, its successors released. Returns how
  // many nodes it scheduled.
  size_t start(const Best& best) {
    Unit u = *unit_of(best.node);
    if (u.nodes.size() > 1 && !costs_.prices_pairs()) return start_in_turn(best, u);
    std::vector<double> member;  // each member's own cost
    for (NodeId m : u.nodes) member.push_back(cost_of(m));
    double dur = 0;
    for (double c : member) dur += c;
    const double sum = dur;
    if (u.nodes.size() > 1) dur = costs_.overlap(dur);
    const double begin = best.est, finish = begin + dur;
    for (NodeId m : u.nodes)  // a just-in-time gather follows the op now last before its consumer
      if (NodeId a = anchor_[at(m)]; a >= 0)
        if (const auto& before = order_[static_cast<size_t>(resource_[at(a)])]; !before.empty())
          s_.issue_after[at(m)].push_back(before.back());
    free_at_[static_cast<size_t>(best.res)] = finish;
    auto& rlist = ready_[static_cast<size_t>(best.res)];
    // An overlapped group's members share its interval, each its part in turn (the executor runs
    // them in this order on the stream, so what they hold comes and goes one after another).
    double t = begin;
    for (size_t k = 0; k < u.nodes.size(); ++k) {
      const NodeId m = u.nodes[k];
      const double part = sum > 0 ? dur * member[k] / sum : dur / double(u.nodes.size());
      s_.start[at(m)] = t;
      s_.finish[at(m)] = k + 1 == u.nodes.size() ? finish : (t += part);
      if (u.nodes.size() > 1) s_.paired[at(m)] = g_.nodes[at(m)].overlap;
      done_[at(m)] = true;
      order_[static_cast<size_t>(best.res)].push_back(m);
      rlist.remove(m);
      if (window_task_[at(m)] >= 0) last_task_[static_cast<size_t>(best.res)] = window_task_[at(m)];
    }
    for (NodeId m : u.nodes) release_successors(m, finish);
    return u.nodes.size();
  }

  // An overlap group not priced as one interval, as the executor's window runs it on a thread: each
  // member whole, the next when the one before it has ended and its own input has come. The window
  // opens when the stream reaches it: members whose input has come by then run in the group's
  // order (the design card's backward piece before the forward's, so the exchanges alternate as
  // planned), the rest as their inputs come. Nothing else runs on the stream between them.
  size_t start_in_turn(const Best& best, Unit u) {
    auto opens = [&](NodeId m) { return std::max(ready_at_[at(m)], best.est); };
    std::stable_sort(u.nodes.begin(), u.nodes.end(), [&](NodeId a, NodeId b) { return opens(a) < opens(b); });
    auto& rlist = ready_[static_cast<size_t>(best.res)];
    double t = best.est;
    for (NodeId m : u.nodes) {
      s_.start[at(m)] = std::max(t, ready_at_[at(m)]);
      s_.finish[at(m)] = t = s_.start[at(m)] + cost_of(m);
      done_[at(m)] = true;
      order_[static_cast<size_t>(best.res)].push_back(m);
      rlist.remove(m);
      if (window_task_[at(m)] >= 0) last_task_[static_cast<size_t>(best.res)] = window_task_[at(m)];
    }
    free_at_[static_cast<size_t>(best.res)] = t;
    for (NodeId m : u.nodes) release_successors(m, s_.finish[at(m)]);
    return u.nodes.size();
  }

  void release_successors(NodeId m, double finish) {
    for (int32_t k = adj_.out_offsets[at(m)]; k < adj_.out_offsets[at(m) + 1]; ++k) {
      NodeId w = g_.edges[static_cast<size_t>(adj_.out_edges[static_cast<size_t>(k)])].dst;
      ready_at_[at(w)] = std::max(ready_at_[at(w)], finish);
      if (g_.nodes[at(m)].flags & ir::kMaterialize) --gathers_pending_[at(w)];
      if (--pending_[at(w)] == 0) make_ready(w);
      if (auto it = parked_.find(w); it != parked_.end() && !anchor_waits(w)) {
        auto gathers = std::move(it->second);
        parked_.erase(it);
        for (NodeId p : gathers) make_ready(p);
      }
    }
  }

  // Nothing can start although work remains: co-scheduled tasks that wait on each other.
  void report_deadlock(size_t remaining) {
    std::vector<std::string> stuck;
    for (size_t r = 0; r < resources_.size(); ++r)
      for (NodeId v : ready_[r].special())
        if (g_.nodes[at(v)].overlap >= 0) {
          std::vector<std::string> partners;
          for (NodeId m : overlap_.at(g_.nodes[at(v)].overlap))
            partners.push_back(fmt::format("{}{}", ir::token(g_.nodes[at(m)]), pending_[at(m)] ? " (waiting)" : " (ready)"));
          stuck.push_back(fmt::format("{}", fmt::join(partners, " || ")));
        }
    std::sort(stuck.begin(), stuck.end());
    stuck.erase(std::unique(stuck.begin(), stuck.end()), stuck.end());
    // Locate the error at the order that asked for the first stuck overlap.
    SourceLoc loc;
    for (size_t r = 0; r < resources_.size() && !loc.valid(); ++r)
      for (NodeId v : ready_[r].special())
        if (int32_t o = g_.nodes[at(v)].overlap; o >= 0 && size_t(o) < g_.facts.overlap_locs.size()) {
          loc = g_.facts.overlap_locs[static_cast<size_t>(o)];
          break;
        }
    // Otherwise any overlap whose members never ran (all of them may still be waiting).
    for (size_t v = 0; v < n_ && !loc.valid(); ++v)
      if (int32_t o = g_.nodes[v].overlap; !done_[v] && o >= 0 && size_t(o) < g_.facts.overlap_locs.size())
        loc = g_.facts.overlap_locs[static_cast<size_t>(o)];
    auto& d = diags_.error(loc, fmt::format("the plan deadlocks: {} of {} tasks can never start", remaining, n_));
    for (size_t i = 0; i < std::min<size_t>(stuck.size(), 4); ++i)
      d.note(SourceLoc{}, "tasks ordered to overlap run once both are ready, but one waits on the other: " + stuck[i]);
  }

  // The programs: each resource's order as a stream of its class, overlap windows marked, events
  // only where a dependency crosses streams of one class.
  void emit() {
    const std::vector<int32_t> task_group = overlap_task_groups(g_);
    for (size_t r = 0; r < resources_.size(); ++r) {
      StreamProgram p{resources_[r].second, std::move(order_[r]), {}};
      mark_windows(task_group, p);
      s_.classes[static_cast<size_t>(resources_[r].first)].streams.push_back(std::move(p));
    }
    for (auto& c : s_.classes)
      std::sort(c.streams.begin(), c.streams.end(), [](auto& a, auto& b) { return a.stream < b.stream; });
    for (const ir::Edge& e : g_.edges) {
      size_t a = at(e.src), b = at(e.dst);
      if (s_.node_class[a] == s_.node_class[b] && g_.nodes[a].stream != g_.nodes[b].stream) s_.waits[b].push_back(e.src);
    }
    for (size_t v = 0; v < n_; ++v) s_.step_time = std::max(s_.step_time, s_.finish[v]);
    std::vector<double> per_class(s_.classes.size(), 0.0);
    for (size_t v = 0; v < delay_.size(); ++v) per_class[static_cast<size_t>(s_.node_class[v])] += delay_[v];
    for (double d : per_class) s_.sms_delay = std::max(s_.sms_delay, d);
  }

  const ir::Graph& g_;
  const CostModel& costs_;
  DiagnosticEngine& diags_;
  const size_t n_;
  const ir::Graph::Adjacency adj_;
  const std::vector<double> delay_;
  Schedule s_;
  std::vector<std::pair<int32_t, ir::StreamId>> resources_;  // (class, stream)
  std::vector<int32_t> resource_;                            // per node
  std::unordered_map<int32_t, std::vector<NodeId>> overlap_;  // group -> members
  std::vector<int32_t> pending_, gathers_pending_;           // predecessors (and gathers) not done
  std::vector<double> ready_at_, free_at_, share_;
  std::vector<bool> done_;
  std::vector<std::vector<NodeId>> order_;                   // per resource, as scheduled
  std::vector<NodeId> anchor_, recomputed_;                  // a gather's entry piece; a B's recomputed F
  std::vector<int32_t> window_task_, last_task_;             // per node its `||` task; per resource the last run
  // cross_class_collectives: a member starts no earlier than the last one's inputs are final (the
  // two copies of a DualPipe stage finish their backwards apart).
  std::vector<std::vector<NodeId>> rendezvous_sets_;
  std::vector<int32_t> rendezvous_;  // per node: its set, or -1
  std::vector<ReadyQueue> ready_;                            // per resource
  std::unordered_map<NodeId, std::vector<NodeId>> parked_;   // anchor -> gathers parked on it
};

}  // namespace

std::vector<std::vector<NodeId>> cross_class_collectives(const ir::Graph& g) {
  std::map<std::pair<ir::Payload, int32_t>, std::vector<NodeId>> sets;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& x = g.nodes[v];
    if (x.op != Op::AllReduce) continue;
    if (x.payload == ir::Payload::Norm) sets[{x.payload, 0}].push_back(static_cast<NodeId>(v));
    if (x.payload == ir::Payload::Tied) sets[{x.payload, x.bucket}].push_back(static_cast<NodeId>(v));
    if (x.payload == ir::Payload::Copy) sets[{x.payload, x.stage}].push_back(static_cast<NodeId>(v));
  }
  std::vector<std::vector<NodeId>> out;
  for (auto& [key, members] : sets)
    if (members.size() > 1) out.push_back(std::move(members));
  return out;
}

std::optional<Schedule> schedule(const ir::Graph& g, const CostModel& costs, DiagnosticEngine& diags) {
  auto s = ListScheduler(g, costs, diags).run();
  // `sms` limits: the compute that ran beside limited communication, slowed, and scheduled again
  // (the same DAG, so the second run cannot fail where the first did not).
  const int64_t device_sms = costs.machine_desc() ? costs.machine_desc()->sms : 0;
  if (!s) return s;
  auto delay = sm_share_delay(g, *s, device_sms);
  if (delay.empty()) return s;
  return ListScheduler(g, costs, diags, std::move(delay)).run();
}

}  // namespace piper::sched
