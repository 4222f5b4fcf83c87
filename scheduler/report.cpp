#include "scheduler/report.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ir/emit.h"
#include "scheduler/emit.h"

namespace piper::sched {

extern const char* const kReportPage;  // report_page.html, compiled in (see CMakeLists.txt)

namespace {

using nlohmann::json;

// What each mesh axis does in the plan (an axis may do two things: ep also replicates dense weights).
std::vector<std::string> axis_roles(const ir::PlanFacts& f, int32_t a) {
  std::vector<std::string> roles;
  auto add = [&](const char* r) {
    if (std::find(roles.begin(), roles.end(), r) == roles.end()) roles.push_back(r);
  };
  if (a == f.pipeline_axis) add("pipeline");
  if (f.mesh.axes()[static_cast<size_t>(a)].model) add("tensor");
  for (const ir::StageFacts& st : f.stages) {
    if (st.replication.axis == a) add(st.replication.zero ? "data (ZeRO)" : "data");
    for (const ir::ExpertShard& e : st.experts)
      if (e.axis == a) add("expert");
  }
  return roles;
}

// The mesh and where each axis lives: ranks are row-major over the axes, so an axis's group is
// `size` ranks `stride` apart, and the hosts pass says how many hosts one such group spans.
json mesh_data(const ir::Graph& g) {
  const ir::PlanFacts& f = g.facts;
  json axes = json::array();
  int64_t stride = 1;
  std::vector<int64_t> strides(f.mesh.axes().size());
  for (size_t a = f.mesh.axes().size(); a-- > 0;) {
    strides[a] = stride;
    stride *= f.mesh.axes()[a].size;
  }
  for (size_t a = 0; a < f.mesh.axes().size(); ++a) {
    const int32_t ai = static_cast<int32_t>(a);
    axes.push_back({{"name", f.mesh.axes()[a].name}, {"size", f.mesh.axes()[a].size}, {"stride", strides[a]},
                    {"roles", axis_roles(f, ai)}, {"hosts", f.hosts.hosts_along(ai)}, {"crosses", f.hosts.axis(ai)}});
  }
  // The first hosts' ranks (16 at most each), for the picture of what a host holds.
  std::map<int32_t, int64_t> per_host;
  json first_hosts = json::array({json::array(), json::array()});
  for (int64_t r = 0; r < f.mesh.world(); ++r) {
    const int32_t h = f.hosts.host(r);
    if (h < 2 && first_hosts[static_cast<size_t>(h)].size() < 16) first_hosts[static_cast<size_t>(h)].push_back(r);
    ++per_host[h];
  }
  int64_t most = 0;
  for (const auto& [h, n] : per_host) most = std::max(most, n);
  json handoffs = json::array();
  for (uint8_t c : f.hosts.next_crosses) handoffs.push_back(c != 0);
  return {{"world", f.mesh.world()}, {"hosts", f.hosts.count}, {"ranks_per_host", most}, {"axes", axes},
          {"first_hosts", first_hosts}, {"pipeline_handoffs_cross", handoffs}};
}

// A class's ops per stream, and its communication summed per (tier, axis, op): what one of its
// ranks moves in a step. A receive's transfer is the send's, so receives are not counted.
json class_streams(const Plan& p, size_t c, json& comm) {
  const ir::Graph& g = p.dag;
  const Schedule& s = p.schedule;
  json streams = json::array();
  std::map<std::tuple<bool, std::string, std::string>, std::tuple<int64_t, double, double>> traffic;
  for (const StreamProgram& prog : s.classes[c].streams) {
    json ops = json::array();
    for (ir::NodeId v : prog.ops) {
      const ir::Node& n = g.nodes[static_cast<size_t>(v)];
      const double a = s.start[static_cast<size_t>(v)], d = s.finish[static_cast<size_t>(v)] - a;
      ops.push_back({a, d, ir::op_name(n.op), ir::token(n), n.microbatch, n.stage,
                     static_cast<size_t>(v) < s.paired.size() ? s.paired[static_cast<size_t>(v)] : -1});
      if (ir::is_chunk(n.op)) {
        const CostModel::PieceTraffic tp = p.costs.piece_traffic(g, n);
        if (tp.calls == 0) continue;
        auto& [calls, bytes, secs] = traffic[{tp.on_network, g.axis_name(tp.axis), tp.op}];
        calls += tp.calls, bytes += tp.bytes, secs += tp.seconds - tp.gathered_seconds;
        if (tp.gathered > 0) {
          auto& [gcalls, gbytes, gsecs] = traffic[{tp.on_network, g.axis_name(tp.axis), "all_gather (in pieces)"}];
          gcalls += 1, gbytes += tp.gathered, gsecs += tp.gathered_seconds;
        }
      } else if (n.op != ir::Op::Recv) {
        auto& [calls, bytes, secs] = traffic[{on_network(g, n), g.axis_name(n.axis), ir::op_name(n.op)}];
        calls += 1, bytes += static_cast<double>(n.bytes), secs += d;
      }
    }
    streams.push_back({{"name", g.streams[prog.stream]}, {"ops", ops}});
  }
  comm = json::array();
  for (const auto& [key, value] : traffic)
    comm.push_back({{"tier", std::get<0>(key) ? "across hosts" : "inside a host"}, {"axis", std::get<1>(key)},
                    {"op", std::get<2>(key)}, {"calls", std::get<0>(value)}, {"bytes", std::get<1>(value)},
                    {"seconds", std::get<2>(value)}});
  return streams;
}

// Memory over the step on the class's fullest rank: resident state plus what is live, at each change
// (at most `kPoints`, each the largest of the changes it stands for, so the peak survives).
json memory_curve(const std::vector<std::pair<double, int64_t>>& live, int64_t resident) {
  constexpr size_t kPoints = 4000;
  json out = json::array();
  const size_t per = std::max<size_t>(1, (live.size() + kPoints - 1) / kPoints);
  for (size_t i = 0; i < live.size(); i += per) {
    int64_t most = 0;
    for (size_t j = i; j < std::min(live.size(), i + per); ++j) most = std::max(most, live[j].second);
    out.push_back({live[i].first, resident + most});
  }
  return out;
}

json classes_data(const Plan& p) {
  const auto stats = rank_stats(p.dag, p.schedule);
  const auto live = memory_timeline(p.dag, p.schedule, p.manifest);
  json classes = json::array();
  for (size_t c : class_order(p.schedule)) {
    const ClassProgram& cls = p.schedule.classes[c];
    const int32_t shown = fullest_rank(p.schedule, p.memory, c);
    const MemoryUse& m = p.memory[static_cast<size_t>(shown)];
    json by;
    for (int k = 0; k < kMemCategories; ++k) by[mem_category_name(static_cast<MemCategory>(k))] = m.at_peak[static_cast<size_t>(k)];
    json comm;
    json streams = class_streams(p, c, comm);
    classes.push_back({{"ranks", ir::rank_list(cls.ranks)}, {"rank_count", cls.ranks.size()}, {"shown_rank", shown},
                       {"busy", stats[c].busy}, {"idle", stats[c].idle}, {"bubble", stats[c].bubble()},
                       {"peak_bytes", m.peak}, {"by_category", by}, {"streams", streams}, {"comm", comm},
                       {"memory", c < live.size() ? memory_curve(live[c], m.resident_total()) : json::array()}});
  }
  return classes;
}

json report_data(const Plan& p, const ReportContext& ctx) {
  const ir::PlanFacts& f = p.dag.facts;
  return {{"strategy", ctx.strategy},
          {"model", ctx.model},
          {"machine", p.costs.is_unit() ? "unit costs" : ctx.machine},
          {"unit_costs", p.costs.is_unit()},
          {"budget", ctx.budget},
          {"batch", ctx.batch},
          {"microbatches", f.microbatches},
          {"samples_per_microbatch", f.samples_per_microbatch},
          {"step_time", p.schedule.step_time},
          {"eval_step_time", forward_only_time(p.dag, p.schedule)},
          {"sms_delay", p.schedule.sms_delay},
          {"mesh", mesh_data(p.dag)},
          {"classes", classes_data(p)}};
}

}  // namespace

std::string report_json(const Plan& p, const ReportContext& ctx) { return report_data(p, ctx).dump(); }

std::string emit_report_html(const Plan& p, const ReportContext& ctx) {
  std::string data = report_data(p, ctx).dump();
  // Inside <script>, "</" could close the element; "<\/" is the same JSON string.
  for (size_t at = 0; (at = data.find("</", at)) != std::string::npos; at += 3) data.replace(at, 2, "<\\/");
  std::string page = kReportPage;
  const std::string slot = "{{PLAN_DATA}}";
  page.replace(page.find(slot), slot.size(), data);
  return page;
}

}  // namespace piper::sched
