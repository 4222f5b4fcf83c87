// piper-check's and piper-run's account of the plan's hosts: what stays inside one, what crosses.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ir/emit.h"

namespace piper::ir {

namespace {

std::string mib(int64_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// Whether a communication node goes between hosts: a handoff by its stages, a collective by its axis.
bool crosses(const Graph& g, const Node& n) {
  const HostFacts& h = g.facts.hosts;
  if (n.op == Op::Send) return h.handoff(n.stage, n.flags & kBackward);
  return h.axis(n.axis);
}

// Every axis's groups with their hosts: "dp 0-1 (h0) 2-3 (h1); pp 0,2 (h0, h1) 1,3 (h0, h1)". At
// most four groups an axis (then how many more), eight members and three host names a group (then
// counts): a plan of thousands of ranks stays a line.
std::string groups_on_hosts(const Graph& g, const std::vector<std::string>& names) {
  constexpr size_t kGroups = 4, kHosts = 3;
  const HostFacts& h = g.facts.hosts;
  const Mesh& mesh = g.facts.mesh;
  auto name = [&](int32_t x) { return static_cast<size_t>(x) < names.size() ? names[static_cast<size_t>(x)] : fmt::format("host {}", x); };
  std::vector<std::string> per_axis;
  for (int a = 0; a < static_cast<int>(mesh.axes().size()); ++a) {
    const int64_t count = mesh.world() / std::max<int64_t>(1, mesh.size(a));
    std::vector<std::vector<int32_t>> seen;
    std::vector<std::string> groups;
    for (int64_t r = 0; r < mesh.world() && seen.size() < kGroups; ++r) {
      auto grp = mesh.group_along(r, a);
      if (std::find(seen.begin(), seen.end(), grp) != seen.end()) continue;
      std::vector<int32_t> on;
      for (int32_t m : grp)
        if (std::find(on.begin(), on.end(), h.host(m)) == on.end()) on.push_back(h.host(m));
      std::vector<std::string> on_names;
      for (size_t i = 0; i < std::min(on.size(), kHosts); ++i) on_names.push_back(name(on[i]));
      const std::string hosts = on.size() <= kHosts ? fmt::format("{}", fmt::join(on_names, ", "))
                                                    : fmt::format("{}, ... {} hosts", fmt::join(on_names, ", "), on.size());
      const std::string members = grp.size() <= 8 ? rank_list(grp)
                                                  : fmt::format("{},{},{},... {} ranks", grp[0], grp[1], grp[2], grp.size());
      groups.push_back(fmt::format("{} ({})", members, hosts));
      seen.push_back(std::move(grp));
    }
    if (count > static_cast<int64_t>(seen.size())) groups.push_back(fmt::format("... {} more", count - static_cast<int64_t>(seen.size())));
    per_axis.push_back(fmt::format("{} {}", mesh.axes()[static_cast<size_t>(a)].name, fmt::join(groups, " ")));
  }
  return fmt::format("{}", fmt::join(per_axis, "; "));
}

}  // namespace

std::string emit_hosts(const Graph& g, const std::vector<std::string>& names) {
  const HostFacts& h = g.facts.hosts;
  if (!h.any()) return "";
  std::vector<std::vector<int32_t>> ranks(static_cast<size_t>(h.count));
  for (size_t r = 0; r < h.host_of.size(); ++r) ranks[static_cast<size_t>(h.host_of[r])].push_back(static_cast<int32_t>(r));
  std::vector<std::string> where, inside, across;
  // The first three hosts and the last (a plan of thousands of ranks stays a line).
  for (size_t x = 0; x < ranks.size(); ++x) {
    if (ranks.size() > 4 && x == 3) where.push_back(fmt::format("... {} more", ranks.size() - 4));
    if (ranks.size() > 4 && x >= 3 && x + 1 < ranks.size()) continue;
    where.push_back(fmt::format("{}: ranks {}", x < names.size() ? names[x] : fmt::format("host {}", x), rank_list(ranks[x])));
  }
  const auto& axes = g.facts.mesh.axes();
  for (size_t a = 0; a < axes.size(); ++a) (h.axis(static_cast<int32_t>(a)) ? across : inside).push_back(axes[a].name);
  // Per step, over every rank that runs each node (a node stands for all the ranks of its group).
  int64_t sends[2] = {0, 0}, send_bytes[2] = {0, 0}, colls[2] = {0, 0}, coll_bytes[2] = {0, 0};
  for (const Node& n : g.nodes) {
    if (is_chunk(n.op) || n.op == Op::Recv) continue;
    const int k = crosses(g, n) ? 1 : 0;
    const auto members = static_cast<int64_t>(g.ranks(n.ranks).size());
    (n.op == Op::Send ? sends : colls)[k] += members;
    (n.op == Op::Send ? send_bytes : coll_bytes)[k] += members * n.bytes;
  }
  auto none = [](const std::vector<std::string>& v) { return v.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(v, ", ")); };
  std::string out = fmt::format("  hosts      {} ({})\n", h.count, fmt::join(where, "; "));
  out += fmt::format("             axes inside a host: {}; across hosts: {}\n", none(inside), none(across));
  out += fmt::format("             groups: {}\n", groups_on_hosts(g, names));
  out += fmt::format("             per step across hosts: {} sends ({}), {} collective calls ({}); inside: {} sends, {} collective calls\n",
                     sends[1], mib(send_bytes[1]), colls[1], mib(coll_bytes[1]), sends[0], colls[0]);
  return out;
}

}  // namespace piper::ir
