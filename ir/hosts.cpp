// Pass 0, hosts: where the mesh lands on hosts. Ranks are the launcher's (mpirun fills a host's
// slots before the next: ranks 0..k-1 on the first), so the mesh's last axes, which vary fastest,
// stay inside a host and the first cross. The plan does not move ranks; it records what crosses,
// so that a collective or a handoff is priced on the tier it uses and reports can say which go
// over the network. Nothing here changes what runs.
#include <fmt/format.h>

#include <algorithm>

#include "ir/pass.h"
#include "lang/internal_error.h"

namespace piper::ir {

namespace {

// How many hosts `ranks` are on.
int32_t hosts_spanned(const std::vector<int32_t>& ranks, const HostFacts& h) {
  std::vector<int32_t> seen;
  for (int32_t r : ranks)
    if (std::find(seen.begin(), seen.end(), h.host(r)) == seen.end()) seen.push_back(h.host(r));
  return static_cast<int32_t>(seen.size());
}

}  // namespace

void hosts_pass(LowerContext& c) {
  HostFacts& h = c.graph.facts.hosts;
  const Mesh& mesh = c.graph.facts.mesh;
  const std::vector<int32_t>& host_of = c.options.host_of;
  if (host_of.empty()) return;  // one host: nothing crosses
  PIPER_INTERNAL_ASSERT(static_cast<int64_t>(host_of.size()) == mesh.world(),
                        fmt::format("hosts: {} ranks placed on hosts, the mesh has {}", host_of.size(), mesh.world()));
  h.host_of = host_of;
  int32_t hosts = 0;
  for (int32_t x : host_of) hosts = std::max(hosts, x + 1);
  h.count = hosts;
  for (size_t a = 0; a < mesh.axes().size(); ++a) {
    // Each group once: the ranks at the axis's first coordinate lead them.
    int32_t most = 1;
    for (int64_t r = 0; r < mesh.world(); ++r)
      if (mesh.coord(r, static_cast<int>(a)) == 0) most = std::max(most, hosts_spanned(mesh.group_along(r, static_cast<int>(a)), h));
    h.axis_crosses.push_back(most > 1);
    h.axis_hosts.push_back(most);
  }
  // Rank k of a stage hands off to rank k of the next (ir/p2p.cpp pairs them so).
  const int32_t pp = c.graph.facts.pipeline_axis;
  for (size_t s = 0; s + 1 < c.stages.size(); ++s) {
    const auto from = mesh.ranks_at(pp, c.stages[s].coord), to = mesh.ranks_at(pp, c.stages[s + 1].coord);
    bool crosses = false;
    for (size_t k = 0; k < from.size() && k < to.size(); ++k) crosses |= h.host(from[k]) != h.host(to[k]);
    h.next_crosses.push_back(crosses);
  }
}

}  // namespace piper::ir
