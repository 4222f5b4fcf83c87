// `on stream comm sms N`: communication that holds N of a device's S multiprocessors slows the
// compute running beside it. Priced as one correction of the simulated timeline: each compute op
// that overlapped such communication for o seconds gets o·N/S more (in the overlap it advances at
// (S-N)/S of its rate), and the step is scheduled again with those costs.
#include <algorithm>

#include "scheduler/schedule.h"

namespace piper::sched {

namespace {
struct Held {
  double begin, end;
  double share;  // N/S
};
}  // namespace

std::vector<double> sm_share_delay(const ir::Graph& g, const Schedule& s, int64_t device_sms) {
  if (device_sms <= 0 || g.facts.stream_sms.empty()) return {};
  const auto compute = std::find(g.streams.begin(), g.streams.end(), "compute") - g.streams.begin();
  // Per class: the intervals during which a limited stream's communication holds multiprocessors.
  std::vector<std::vector<Held>> held(s.classes.size());
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (const int64_t n = g.facts.sms_of(g.nodes[v].stream); n > 0 && !ir::is_chunk(g.nodes[v].op) && s.finish[v] > s.start[v])
      held[static_cast<size_t>(s.node_class[v])].push_back({s.start[v], s.finish[v], double(n) / double(device_sms)});
  for (auto& h : held) std::sort(h.begin(), h.end(), [](const Held& a, const Held& b) { return a.begin < b.begin; });
  std::vector<double> delay(g.nodes.size(), 0.0);
  bool any = false;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    if (g.nodes[v].stream != compute) continue;
    const auto& h = held[static_cast<size_t>(s.node_class[v])];
    const double b = s.start[v], e = s.finish[v];
    double held_share = 0;  // ∫ share dt over [b, e); overlapping limited streams add, up to the whole device
    for (auto it = h.begin(); it != h.end() && it->begin < e; ++it)
      held_share += std::max(0.0, std::min(e, it->end) - std::max(b, it->begin)) * it->share;
    delay[v] = std::min(held_share, e - b);
    any |= delay[v] > 0;
  }
  if (!any) return {};
  return delay;
}

}  // namespace piper::sched
