#include "scheduler/cost_model.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <cmath>
#include <sstream>

namespace piper::sched {

using nlohmann::json;

std::optional<Machine> parse_machine(FileId file, const SourceManager& sources, DiagnosticEngine& diags) {
  auto fail = [&](const std::string& msg) {
    diags.error(SourceLoc{file, 0, 0, 0}, "invalid machine description: " + msg);
    return std::nullopt;
  };
  json j;
  try {
    j = json::parse(sources.text(file));
  } catch (const json::parse_error& e) {
    diags.error(sources.loc_at(file, e.byte > 0 ? e.byte - 1 : 0), std::string("machine description is not valid JSON: ") + e.what());
    return std::nullopt;
  }
  auto number = [&](const json& obj, const char* key, double& out, bool required) {
    if (!obj.contains(key)) return !required;
    if (!obj[key].is_number() || obj[key].get<double>() < 0) return false;
    out = obj[key].get<double>();
    return true;
  };
  auto link = [&](const json& obj, Link& out) {
    return obj.is_object() && number(obj, "bandwidth", out.bandwidth, true) && out.bandwidth > 0 &&
           number(obj, "latency", out.latency, false);
  };
  if (!j.is_object()) return fail("expected a JSON object");
  Machine m;
  m.name = j.value("name", "");
  if (!number(j, "flops", m.flops, true) || m.flops <= 0) return fail("\"flops\" (FLOP/s per device) must be positive");
  if (!number(j, "memory_bytes", m.memory_bytes, true)) return fail("\"memory_bytes\" is required");
  if (!number(j, "memory_bandwidth", m.memory_bandwidth, true) || m.memory_bandwidth <= 0)
    return fail("\"memory_bandwidth\" (bytes/s) must be positive");
  if (!j.contains("link") || !link(j["link"], m.default_link))
    return fail("\"link\": {\"bandwidth\": bytes/s, \"latency\": s} is required");
  // Measured sections (piper-run --profile): straight lines [fixed, per].
  auto affine = [](const json& v, Affine& out) {
    if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) return false;
    out = Affine{v[0].get<double>(), v[1].get<double>()};
    return std::isfinite(out.fixed) && std::isfinite(out.per) && out.fixed >= 0 && out.per >= 0;
  };
  if (j.contains("regions")) {
    if (!j["regions"].is_object()) return fail("\"regions\" maps region names to measured times");
    for (const auto& [name, r] : j["regions"].items()) {
      RegionTimes t;
      if (!r.is_object() || !r.contains("F") || !r.contains("B") || !affine(r["F"], t.F) || !affine(r["B"], t.B) ||
          (r.contains("BI") && !affine(r["BI"], t.BI)) || (r.contains("BW") && !affine(r["BW"], t.BW)))
        return fail(fmt::format("regions.{}: expected {{\"F\": [fixed s, s per sample] (neither negative), \"B\": [...], \"BI\": [...], "
                                "\"BW\": [...]}}",
                                name));
      if (!r.contains("BI") || !r.contains("BW")) {  // unmeasured split: half each
        t.BI = Affine{t.B.fixed / 2, t.B.per / 2};
        t.BW = t.BI;
      }
      m.regions[name] = t;
    }
  }
  if (j.contains("update")) {
    Affine u;
    if (!affine(j["update"], u)) return fail("\"update\": expected [fixed s, s per parameter byte] (neither negative)");
    m.update = u;
  }
  if (j.contains("collectives")) {
    Link l;
    if (!link(j["collectives"], l)) return fail("\"collectives\": expected {\"bandwidth\": bytes/s, \"latency\": s}");
    m.collectives = l;
  }
  if (j.contains("network")) {
    Link l;
    if (!link(j["network"], l)) return fail("\"network\": the link between hosts, {\"bandwidth\": bytes/s per rank, \"latency\": s}");
    m.network = l;
  }
  if (j.contains("network_collectives")) {
    Link l;
    if (!link(j["network_collectives"], l)) return fail("\"network_collectives\": expected {\"bandwidth\": bytes/s per rank, \"latency\": s}");
    m.network_collectives = l;
  }
  auto count = [&](const char* key, int64_t& out) {  // absent, or a positive integer
    if (!j.contains(key)) return true;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) return false;
    out = j[key].get<int64_t>();
    return true;
  };
  if (!count("sms", m.sms)) return fail("\"sms\": the device's streaming multiprocessors, a positive integer");
  if (!count("ranks_per_host", m.ranks_per_host)) return fail("\"ranks_per_host\" must be a positive integer");
  if (j.contains("calibration")) {
    const json& c = j["calibration"];
    auto factor = [&](const char* k, double& out) { return !c.contains(k) || (number(c, k, out, true) && out > 0); };
    if (!c.is_object() || !factor("F", m.calibration.F) || !factor("B", m.calibration.B) || !factor("U", m.calibration.U))
      return fail("\"calibration\": expected {\"F\": factor, \"B\": factor, \"U\": factor}, each positive");
    if (c.contains("collective") && !(number(c, "collective", m.calibration.collective, true) && m.calibration.collective >= 0))
      return fail("\"calibration\": \"collective\" is the seconds added to each collective, zero or more");
  }
  if (j.contains("axes")) {
    if (!j["axes"].is_object()) return fail("\"axes\" maps mesh axis names to links");
    for (const auto& [axis, l] : j["axes"].items()) {
      Link x;
      if (!link(l, x)) return fail(fmt::format("axes.{}: expected {{\"bandwidth\": ..., \"latency\": ...}}", axis));
      m.axes[axis] = x;
    }
  }
  return m;
}

std::optional<UnitCosts> parse_unit_costs(const std::string& spec, std::string* error) {
  UnitCosts c;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    double v = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument("");
      size_t used = 0;
      v = std::stod(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1 || v < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      *error = fmt::format("--cost: '{}' is not NAME=NUMBER (a non-negative number)", item);
      return std::nullopt;
    }
    std::string k = item.substr(0, eq);
    if (k == "F") c.F = v;
    else if (k == "B") c.B = v;
    else if (k == "W") c.W = v;
    else if (k == "comm") c.comm = v;
    else if (k == "U") c.update = v;
    else if (k == "FB") c.FB = v;
    else {
      *error = fmt::format("--cost: unknown cost '{}' (known: F, B, W, FB, comm, U)", k);
      return std::nullopt;
    }
  }
  if (c.W > c.B) {
    *error = "--cost: W (the weight half of a backward) cannot exceed B (the whole backward)";
    return std::nullopt;
  }
  return c;
}

CostModel CostModel::machine(Machine mc, const std::vector<std::string>& axes, int64_t samples, const Manifest& manifest) {
  CostModel m;
  m.region_times_.resize(manifest.regions.size());
  for (size_t r = 0; r < manifest.regions.size(); ++r)
    if (auto it = mc.regions.find(manifest.regions[r].name); it != mc.regions.end()) m.region_times_[r] = it->second;
  m.first_region_ = manifest.sequence.empty() ? -1 : manifest.sequence.front();
  for (size_t r = 0; r < manifest.regions.size(); ++r) m.subtree_flops_.push_back(manifest.flops(RegionId(r)));
  m.machine_ = std::move(mc);
  m.axes_ = axes;
  m.samples_ = samples;
  return m;
}

std::optional<double> CostModel::measured_chunk(const ir::Graph& g, const ir::Node& n) const {
  using ir::Op;
  if (region_times_.empty() || n.stage < 0 || n.op == Op::U) return std::nullopt;
  const ir::Segment& seg = g.segment_of(n);
  // A region is measured whole; a stage with experts runs its MoE blocks in pieces (attention and
  // router, then the experts on their tokens), which FLOPs price instead.
  if (seg.regions.empty() || !g.stage(n.stage).experts.empty()) return std::nullopt;
  const double x = static_cast<double>(samples_);
  // The first region takes tokens: a piece that starts with it has no input gradient, so its BI is
  // empty and its BW is the whole backward (runtime/exec/chunk_runner.cpp).
  const bool first = seg.regions.front() == first_region_;
  double t = 0;
  for (RegionId r : seg.regions) {
    const auto& rt = region_times_.at(static_cast<size_t>(r));
    if (!rt) return std::nullopt;
    const auto& cal = machine_->calibration;
    double rt_x = 0;
    switch (n.op) {
      case Op::F: rt_x = cal.F * rt->F.at(x); break;
      case Op::B: rt_x = cal.B * rt->B.at(x); break;
      case Op::BI: rt_x = first ? 0 : cal.B * rt->BI.at(x); break;
      case Op::BW: rt_x = cal.B * (first ? rt->B.at(x) : rt->BW.at(x)); break;
      default: return std::nullopt;
    }
    t += rt_x;
  }
  return std::max(t, 0.0) * tp_share(g, n);
}

// Regions are measured whole, on one rank: under tensor parallelism the share of a piece's work its
// sharded regions do (by FLOPs) splits over the axis.
double CostModel::tp_share(const ir::Graph& g, const ir::Node& n) const {
  const ir::Segment& seg = g.segment_of(n);
  const int64_t ways = g.stage(n.stage).tp.ways;
  if (seg.tp_regions.empty() || ways <= 1) return 1;
  double whole = 0, sharded = 0;
  for (RegionId r : seg.regions) whole += static_cast<double>(subtree_flops_.at(static_cast<size_t>(r)));
  for (RegionId q : seg.tp_regions) sharded += static_cast<double>(subtree_flops_.at(static_cast<size_t>(q)));
  if (whole <= 0) return 1;
  return 1 - sharded / whole * (1 - 1.0 / static_cast<double>(ways));
}

// The all-reduces a tensor-parallel piece runs inside: one per sharded region, of its partial
// output in the forward and of its input gradient in the backward (none in BW), ring on the tp axis's link.
double CostModel::tp_comm(const ir::Graph& g, const ir::Node& n) const {
  using ir::Op;
  if (n.stage < 0 || n.op == Op::U || n.op == Op::BW) return 0;
  const ir::Segment& seg = g.segment_of(n);
  const ir::TensorParallel& tp = g.stage(n.stage).tp;
  if (seg.tp_regions.empty() || tp.ways <= 1) return 0;
  const Link& l = link_for(g.axis_name(tp.axis), g.facts.hosts.axis(tp.axis), true);
  const double k = static_cast<double>(tp.ways), calls = static_cast<double>(seg.tp_regions.size());
  const double b = static_cast<double>(seg.tp_reduce_bytes) * static_cast<double>(samples_);
  return calls * 2 * (k - 1) * l.latency + 2 * (k - 1) / k * b / l.bandwidth;
}

// A link the machine file names for the axis wins (it says what that axis runs on); otherwise the
// network between hosts (collectives' own where measured), then collectives' own fitted link inside
// a host, then the link inside a host.
const Link& CostModel::link_for(const std::string& axis, bool crosses, bool collective) const {
  const Machine& m = *machine_;
  if (auto it = m.axes.find(axis); it != m.axes.end()) return it->second;
  if (crosses && collective && m.network_collectives) return *m.network_collectives;
  if (crosses && m.network) return *m.network;
  if (collective && m.collectives) return *m.collectives;
  return m.default_link;
}

bool CostModel::measured(const ir::Graph& g) const {
  for (const ir::Node& n : g.nodes)
    if (ir::is_chunk(n.op) && n.op != ir::Op::U && !measured_chunk(g, n)) return false;
  return machine_.has_value();
}

double CostModel::cost(const ir::Graph& g, const ir::Node& n, int64_t group_size, double share) const {
  using ir::Op;
  if (unit_) {
    switch (n.op) {
      case Op::F: return unit_->F * share;
      case Op::B: return unit_->B * share;
      case Op::BI: return (unit_->B - unit_->W) * share;
      case Op::BW: return unit_->W * share;
      case Op::U: return unit_->update;
      case Op::Recv: return 0;  // the transfer is charged to the send
      default: return unit_->comm;
    }
  }
  const Machine& m = *machine_;
  if (auto t = measured_chunk(g, n)) return *t + tp_comm(g, n);
  if (n.op == Op::U && m.update) {
    // The optimizer steps the parameters this rank updates: a stage's, a ZeRO shard of them.
    const ir::StageFacts& st = g.stage(n.stage);
    int64_t bytes = 0;
    for (const auto& sg : st.segments) bytes += sg.param_bytes;
    if (st.replication.zero >= 1 && st.replication.ways > 1) bytes /= st.replication.ways;
    return m.calibration.U * m.update->at(static_cast<double>(bytes));
  }
  const double fwd = static_cast<double>(n.flops) * static_cast<double>(samples_) / m.flops;
  // Backward = input gradient + weight gradient, each about one forward.
  switch (n.op) {
    case Op::F: return fwd + tp_comm(g, n);
    case Op::B: return 2 * fwd + tp_comm(g, n);
    case Op::BI: return fwd + tp_comm(g, n);
    case Op::BW: return fwd;
    case Op::U: return 16.0 * static_cast<double>(n.bytes) / m.memory_bandwidth;  // read/write params, grads, 2 moments
    case Op::Recv: return 0;
    default: break;
  }
  const bool collective = n.op != Op::Send && n.op != Op::Broadcast;
  const ir::HostFacts& hosts = g.facts.hosts;
  const bool crosses = n.op == Op::Send ? hosts.handoff(n.stage, n.flags & ir::kBackward) : hosts.axis(n.axis);
  const Link& l = link_for(g.axis_name(n.axis), crosses, collective);
  const double b = static_cast<double>(n.bytes), k = static_cast<double>(std::max<int64_t>(group_size, 1));
  const double issued = m.calibration.collective;  // measured inside a step, beyond the formula
  switch (n.op) {
    case Op::Send: return l.latency + b / l.bandwidth;
    case Op::AllReduce: return issued + 2 * (k - 1) * l.latency + 2 * (k - 1) / k * b / l.bandwidth;  // ring
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllToAll: return issued + (k - 1) * l.latency + (k - 1) / k * b / l.bandwidth;
    case Op::Broadcast: return l.latency + b / l.bandwidth;
    default: return 0;
  }
}

}  // namespace piper::sched
