// The simulated validation step: the planned programs without backwards, updates and their
// communication, replayed in order. Each op takes what it took in the step's timeline; an op starts
// when its stream is free and its kept predecessors (a receive's send included) are done.
#include <algorithm>
#include <vector>

#include "scheduler/schedule.h"

namespace piper::sched {

double forward_only_time(const ir::Graph& g, const Schedule& s) {
  const size_t n = g.nodes.size();
  const auto adj = g.adjacency();
  struct Stream {
    std::vector<ir::NodeId> ops;
    size_t head = 0;
    double free = 0;
  };
  std::vector<Stream> streams;
  std::vector<bool> kept(n, false), done(n, false);
  std::vector<double> finish(n, 0);
  for (const auto& c : s.classes)
    for (const auto& p : c.streams) {
      Stream st;
      for (ir::NodeId v : p.ops)
        if (ir::forward_only(g.nodes[static_cast<size_t>(v)])) {
          st.ops.push_back(v);
          kept[static_cast<size_t>(v)] = true;
        }
      streams.push_back(std::move(st));
    }
  double end = 0;
  for (bool progress = true; progress;) {  // a subset of programs that complete completes
    progress = false;
    for (Stream& st : streams)
      while (st.head < st.ops.size()) {
        const size_t v = static_cast<size_t>(st.ops[st.head]);
        double ready = st.free;
        bool blocked = false;
        for (int32_t k = adj.in_offsets[v]; k < adj.in_offsets[v + 1] && !blocked; ++k) {
          const size_t u = static_cast<size_t>(g.edges[static_cast<size_t>(adj.in_edges[static_cast<size_t>(k)])].src);
          if (!kept[u]) continue;
          if (!done[u]) blocked = true;
          ready = std::max(ready, finish[u]);
        }
        if (blocked) break;
        finish[v] = ready + (s.finish[v] - s.start[v]);
        done[v] = true;
        st.free = finish[v];
        end = std::max(end, finish[v]);
        ++st.head;
        progress = true;
      }
  }
  return end;
}

}  // namespace piper::sched
