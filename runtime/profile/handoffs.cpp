#include "runtime/profile/handoffs.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "ir/graph.h"
#include "runtime/profile/clock_offset.h"

namespace piper::runtime {

namespace {
constexpr int kChannel = 7;  // the profiler's sequence of collectives (profiler.cpp)

// Per Recv node: the Send it pairs with, and the chunk that consumes what it receives.
struct Handoff {
  ir::NodeId send = -1, consumer = -1;
};

std::unordered_map<ir::NodeId, Handoff> handoffs_of(const ir::Graph& g) {
  std::unordered_map<ir::NodeId, Handoff> out;
  for (const ir::Edge& e : g.edges) {
    if (e.kind != ir::EdgeKind::Data) continue;
    const ir::Node &src = g.nodes[static_cast<size_t>(e.src)], &dst = g.nodes[static_cast<size_t>(e.dst)];
    if (src.op == ir::Op::Send && dst.op == ir::Op::Recv) out[e.dst].send = e.src;
    if (src.op == ir::Op::Recv && ir::is_chunk(dst.op) && out[e.src].consumer < 0) out[e.src].consumer = e.dst;
  }
  return out;
}
}  // namespace

HandoffWaits handoff_waits(const sched::Plan& plan, const std::vector<StepResult>& steps, Communicator& comm) {
  const ir::Graph& g = plan.dag;
  const size_t nodes = g.nodes.size();
  const int32_t cls = plan.schedule.class_of_rank(comm.rank());
  std::unordered_map<std::string, ir::NodeId> node_of;  // this rank's nodes by token
  for (size_t v = 0; v < nodes; ++v)
    if (plan.schedule.node_class[v] == cls) node_of[ir::token(g.nodes[v])] = static_cast<ir::NodeId>(v);
  // Every send's start, on rank 0's clock, from the rank that ran it to all (a node runs on one rank).
  const std::vector<int> all = everyone(comm);
  comm.prepare_group(all, kChannel);
  const double offset = clock_offsets(comm, comm.hosts())[static_cast<size_t>(comm.rank())];
  std::vector<double> send_start(steps.size() * nodes, 0.0);
  for (size_t s = 0; s < steps.size(); ++s)
    for (const OpSpan& op : steps[s].ops)
      if (auto it = node_of.find(op.token); it != node_of.end() && g.nodes[static_cast<size_t>(it->second)].op == ir::Op::Send)
        send_start[s * nodes + static_cast<size_t>(it->second)] = steps[s].ops_began - offset + op.start;
  comm.all_reduce_sum(send_start.data(), send_start.size(), all, kChannel);

  const auto pairs = handoffs_of(g);
  std::vector<double> out{0, 0};  // excess seconds, handoffs waited for
  for (size_t s = 0; s < steps.size(); ++s) {
    const double origin = steps[s].ops_began - offset;  // this step's op times + origin: rank 0's clock
    std::vector<const OpSpan*> compute;
    std::unordered_map<ir::NodeId, const OpSpan*> span_of;
    for (const OpSpan& op : steps[s].ops) {
      if (op.compute) compute.push_back(&op);
      if (auto it = node_of.find(op.token); it != node_of.end()) span_of[it->second] = &op;
    }
    std::sort(compute.begin(), compute.end(), [](const OpSpan* a, const OpSpan* b) { return a->start < b->start; });
    for (const auto& [recv, h] : pairs) {
      auto r = span_of.find(recv), c = span_of.find(h.consumer);
      if (h.send < 0 || r == span_of.end() || c == span_of.end()) continue;
      auto at = std::find(compute.begin(), compute.end(), c->second);
      if (at == compute.begin() || at == compute.end()) continue;
      const double ready = (*(at - 1))->end;  // the stream's previous op ended
      if (r->second->end <= ready) continue;  // it arrived before the stream could use it: no wait
      const double sent = send_start[s * nodes + static_cast<size_t>(h.send)] - origin;
      const size_t sv = static_cast<size_t>(h.send);
      out[0] += c->second->start - std::max(sent, ready) - (plan.schedule.finish[sv] - plan.schedule.start[sv]);
      out[1] += 1;
    }
  }
  comm.all_reduce_sum(out.data(), out.size(), all, kChannel);
  return HandoffWaits{out[0], static_cast<int64_t>(out[1])};
}

}  // namespace piper::runtime
