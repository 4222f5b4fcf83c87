#include "runtime/view/device_streams.h"

#include <fmt/format.h>

#include <stdexcept>

namespace piper::runtime {

DeviceStreamPlan plan_device_streams(const sched::Plan& p, const RankView& v) {
  const auto& prog = v.program(p);
  const size_t k = prog.streams.size();
  DeviceStreamPlan out;
  out.programs.resize(k);
  // Where each op of this rank runs: (stream, position).
  std::vector<std::pair<int32_t, int32_t>> at(p.dag.nodes.size(), {-1, -1});
  for (size_t s = 0; s < k; ++s) {
    out.streams.push_back(prog.streams[s].stream);
    const auto& ops = prog.streams[s].ops;
    for (size_t i = 0; i < ops.size(); ++i) at[static_cast<size_t>(ops[i])] = {int32_t(s), int32_t(i)};
  }
  // clock[op][t]: the last position of stream t known finished once op has finished (-1: none).
  std::vector<std::vector<int32_t>> clock(p.dag.nodes.size());
  std::vector<int32_t> event_of(p.dag.nodes.size(), -1);
  std::vector<size_t> head(k, 0);
  std::vector<std::vector<int32_t>> known(k, std::vector<int32_t>(k, -1));  // per stream: what it has waited for
  // Visit ops in an order that respects every dependency: advance any stream whose head's
  // predecessors have all been visited (the plan is deadlock-free, so one always can).
  size_t left = 0;
  for (const auto& s : prog.streams) left += s.ops.size();
  while (left > 0) {
    bool moved = false;
    for (size_t s = 0; s < k; ++s) {
      while (head[s] < prog.streams[s].ops.size()) {
        const ir::NodeId op = prog.streams[s].ops[head[s]];
        const auto& preds = v.local_preds[static_cast<size_t>(op)];
        bool ready = true;
        for (ir::NodeId q : preds) ready &= !clock[static_cast<size_t>(q)].empty();
        if (!ready) break;
        DeviceStreamPlan::Step step{op, {}, -1};
        auto& mine = known[s];
        mine[s] = int32_t(head[s]) - 1;
        for (ir::NodeId q : preds) {
          auto [qs, qi] = at[static_cast<size_t>(q)];
          if (qs < 0) throw std::logic_error(fmt::format("op {} waits for op {}, which this rank does not run", op, q));
          if (size_t(qs) == s) continue;
          ++out.cross_stream_deps;
          if (mine[static_cast<size_t>(qs)] >= qi) continue;  // implied by an earlier wait
          int32_t& e = event_of[static_cast<size_t>(q)];
          if (e < 0) e = out.events++;
          step.wait.push_back(e);
          ++out.waits;
          const auto& c = clock[static_cast<size_t>(q)];
          for (size_t t = 0; t < k; ++t) mine[t] = std::max(mine[t], c[t]);
        }
        auto& c = clock[static_cast<size_t>(op)];
        c = mine;
        c[s] = int32_t(head[s]);
        out.programs[s].push_back(std::move(step));
        ++head[s];
        --left;
        moved = true;
      }
    }
    if (!moved) throw std::logic_error("the rank's stream programs wait on each other: no op can start");
  }
  // Record after each op that some wait names.
  for (auto& steps : out.programs)
    for (auto& st : steps) st.record = event_of[static_cast<size_t>(st.op)];
  return out;
}

}  // namespace piper::runtime
