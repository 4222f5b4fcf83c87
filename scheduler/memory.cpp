#include "scheduler/memory.h"

#include <algorithm>
#include <map>

namespace piper::sched {

using ir::Node;
using ir::Op;

namespace {
// Saved activations of one region per sample: its own output and its sub-regions' outputs.
int64_t saved_bytes(const Manifest& m, RegionId r) {
  int64_t b = 0;
  if (const auto& out = m.regions[static_cast<size_t>(r)].output) {
    int64_t n = dtype_bytes(out->dtype);
    for (int64_t d : out->shape) n *= d;
    b += n;
  }
  for (RegionId c : m.regions[static_cast<size_t>(r)].children) b += saved_bytes(m, c);
  return b;
}
int64_t input_bytes(const Manifest& m, RegionId r) {
  const auto& in = m.regions[static_cast<size_t>(r)].input;
  if (!in) return 0;
  int64_t n = dtype_bytes(in->dtype);
  for (int64_t d : in->shape) n *= d;
  return n;
}
}  // namespace

std::vector<MemoryUse> memory_use(const ir::Graph& g, const Schedule& s, const Manifest& m) {
  const auto& facts = g.facts.stages;
  const size_t stages = facts.size();
  const int64_t samples = g.facts.samples_per_microbatch;
  // Per stage: parameter bytes on one rank (its pieces), ZeRO stage and degree.
  std::vector<int64_t> params(stages, 0);
  std::vector<int> zero(stages, 0);
  std::vector<int64_t> ways(stages, 1);
  for (size_t st = 0; st < stages; ++st) {
    for (const auto& seg : facts[st].segments) params[st] += seg.param_bytes;
    zero[st] = facts[st].replication.zero;
    ways[st] = facts[st].replication.ways;
  }
  // Per stage: activations one microbatch keeps between its forward and backward.
  std::vector<int64_t> act(stages, 0), recomputed(stages, 0);
  for (size_t st = 0; st < stages; ++st)
    for (RegionId r : facts[st].regions) act[st] += saved_bytes(m, r) * samples;
  for (size_t st = 0; st < stages; ++st) recomputed[st] = input_bytes(m, facts[st].regions.front()) * samples;

  std::vector<int32_t> stage_class(stages, -1);
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (g.nodes[v].op == Op::F) stage_class[static_cast<size_t>(g.nodes[v].stage)] = s.node_class[v];
  std::vector<MemoryUse> out(s.classes.size());
  std::vector<std::vector<std::pair<double, int64_t>>> events(s.classes.size());
  for (size_t st = 0; st < stages; ++st) {
    int32_t cls = stage_class[st];
    if (cls < 0) continue;
    MemoryUse& u = out[static_cast<size_t>(cls)];
    const int64_t p = params[st], w = ways[st];
    u.params += zero[st] >= 3 ? p / w : p;
    u.grads += zero[st] >= 2 ? p / w : p;
    u.optimizer += zero[st] >= 1 ? 2 * p / w : 2 * p;  // two moments, in the parameters' dtype
  }
  // Activations: held from a microbatch's first forward piece until its last backward piece of
  // the stage (BW included: the weight gradient needs them too).
  std::map<std::pair<int32_t, int32_t>, std::pair<double, double>> live;  // (stage, mb) -> [from, to]
  std::map<std::pair<int32_t, int32_t>, bool> recompute;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& n = g.nodes[v];
    if (!ir::is_chunk(n.op) || n.op == Op::U) continue;
    auto key = std::make_pair(n.stage, n.microbatch);
    auto [it, fresh] = live.emplace(key, std::make_pair(s.finish[v], s.finish[v]));
    if (n.op == Op::F) it->second.first = fresh ? s.finish[v] : std::min(it->second.first, s.finish[v]);
    else it->second.second = std::max(it->second.second, s.finish[v]);
    if (n.op == Op::F && (n.flags & ir::kRecompute)) recompute[key] = true;
  }
  for (const auto& [key, span] : live) {
    size_t st = static_cast<size_t>(key.first);
    int32_t cls = stage_class[st];
    int64_t bytes = recompute.count(key) ? recomputed[st] : act[st];
    events[static_cast<size_t>(cls)].push_back({span.first, bytes});
    events[static_cast<size_t>(cls)].push_back({span.second, -bytes});
  }
  // ZeRO-3: a gathered bucket holds the full (not sharded) parameters until its consumers finish.
  std::vector<double> consumed(g.nodes.size(), 0);
  for (const ir::Edge& e : g.edges)
    consumed[static_cast<size_t>(e.src)] = std::max(consumed[static_cast<size_t>(e.src)], s.finish[static_cast<size_t>(e.dst)]);
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& n = g.nodes[v];
    if (n.op != Op::AllGather || !(n.flags & ir::kMaterialize)) continue;
    double until = std::max(s.finish[v], consumed[v]);
    events[static_cast<size_t>(s.node_class[v])].push_back({s.start[v], n.bytes});
    events[static_cast<size_t>(s.node_class[v])].push_back({until, -n.bytes});
  }
  for (size_t c = 0; c < events.size(); ++c) {
    auto& ev = events[c];
    // Frees before allocations at the same instant: a buffer released as another is taken.
    std::sort(ev.begin(), ev.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second < b.second; });
    int64_t cur = 0;
    for (auto [t, d] : ev) out[c].peak_dynamic = std::max(out[c].peak_dynamic, cur += d);
  }
  return out;
}

}  // namespace piper::sched
