#include "scheduler/cost_model.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <sstream>

namespace piper::sched {

using nlohmann::json;

namespace {
// "roofline": {"peak_flops": {"bf16": F, "fp32": F}, "gemm_efficiency": e, "gemm_tile": [m, n],
// "attention_efficiency": {"forward": e, "backward": e}, "memory_efficiency": e}.
// Returns what is wrong, or "".
std::string parse_roofline(const json& j, Machine& m) {
  auto fraction = [](const json& v) { return v.is_number() && v.get<double>() > 0 && v.get<double>() <= 1; };
  const char* form = "\"roofline\": expected {\"peak_flops\": {\"bf16\": FLOP/s, \"fp32\": FLOP/s}, \"gemm_efficiency\": 0..1, "
                     "\"gemm_tile\": [rows, columns], \"attention_efficiency\": {\"forward\": 0..1, \"backward\": 0..1}, "
                     "\"memory_efficiency\": 0..1} (and \"sms\" at the top level)";
  if (!j.is_object() || !j.contains("peak_flops") || !j["peak_flops"].is_object()) return form;
  Roofline r;
  const json& p = j["peak_flops"];
  for (auto [key, out] : {std::pair{"bf16", &r.peak_bf16}, std::pair{"fp32", &r.peak_fp32}}) {
    if (!p.contains(key) || !p[key].is_number() || p[key].get<double>() <= 0) return form;
    *out = p[key].get<double>();
  }
  const json& a = j.value("attention_efficiency", json::object());
  for (auto [v, out] : {std::pair{j.value("gemm_efficiency", json(1.0)), &r.gemm_efficiency},
                        std::pair{j.value("memory_efficiency", json(1.0)), &r.memory_efficiency},
                        std::pair{a.is_object() ? a.value("forward", json(1.0)) : json(), &r.attention_forward},
                        std::pair{a.is_object() ? a.value("backward", json(1.0)) : json(), &r.attention_backward}}) {
    if (!fraction(v)) return form;
    *out = v.get<double>();
  }
  if (j.contains("gemm_tile")) {
    const json& t = j["gemm_tile"];
    if (!t.is_array() || t.size() != 2 || !t[0].is_number_integer() || !t[1].is_number_integer() || t[0].get<int64_t>() < 1 ||
        t[1].get<int64_t>() < 1)
      return form;
    r.tile_m = t[0].get<int64_t>(), r.tile_n = t[1].get<int64_t>();
  }
  if (m.sms < 1) return "\"roofline\" needs \"sms\" (wave quantization spreads a product's tiles over them)";
  m.roofline = r;
  return "";
}

// Measured sections (piper-run --profile): straight lines [fixed, per].
bool parse_affine(const json& v, Affine& out) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) return false;
  out = Affine{v[0].get<double>(), v[1].get<double>()};
  return std::isfinite(out.fixed) && std::isfinite(out.per) && out.fixed >= 0 && out.per >= 0;
}

// "regions": measured F/B (and BI/BW where the profile split them) per region; "" or why not.
std::string parse_measured_regions(const json& regions, Machine& m) {
  if (!regions.is_object()) return "\"regions\" maps region names to measured times";
  for (const auto& [name, r] : regions.items()) {
    RegionTimes t;
    if (!r.is_object() || !r.contains("F") || !r.contains("B") || !parse_affine(r["F"], t.F) || !parse_affine(r["B"], t.B) ||
        (r.contains("BI") && !parse_affine(r["BI"], t.BI)) || (r.contains("BW") && !parse_affine(r["BW"], t.BW)))
      return fmt::format("regions.{}: expected {{\"F\": [fixed s, s per sample] (neither negative), \"B\": [...], \"BI\": [...], "
                         "\"BW\": [...]}}",
                         name);
    if (!r.contains("BI") || !r.contains("BW")) {  // unmeasured split: half each
      t.BI = Affine{t.B.fixed / 2, t.B.per / 2};
      t.BW = t.BI;
    }
    m.regions[name] = t;
  }
  return "";
}
}  // namespace

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
  if (j.contains("regions"))
    if (std::string why = parse_measured_regions(j["regions"], m); !why.empty()) return fail(why);
  if (j.contains("update")) {
    Affine u;
    if (!parse_affine(j["update"], u)) return fail("\"update\": expected [fixed s, s per parameter byte] (neither negative)");
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
    if (c.contains("p2p") && !(number(c, "p2p", m.calibration.p2p, true) && m.calibration.p2p >= 0))
      return fail("\"calibration\": \"p2p\" is the seconds added to each pipeline handoff, zero or more");
  }
  if (j.contains("roofline"))
    if (std::string why = parse_roofline(j["roofline"], m); !why.empty()) return fail(why);
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
  const bool said = std::any_of(manifest.regions.begin(), manifest.regions.end(), [](const Region& r) { return !r.work.empty(); });
  if (mc.roofline && said)
    for (const Region& r : manifest.regions) m.work_.push_back({r.children, r.work, r.flops});
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
  return std::max(t, 0.0) * split_share(g, n);
}

// One piece of work on the roofline. A product [M×K]·[K×N] runs its backward as the input gradient
// [M×N]·[N×K] (BI) and the weight gradient [N×M]·[M×K] (BW). Flash attention's backward does five
// products to the forward's two (2.5×, Dao 2023), all of it BI; memory-bound work reads and writes
// its elements again in the backward (2×).
double roofline_seconds(const Machine& machine, const Work& w, ir::Op op, double rows, int64_t ways, bool bf16) {
  using ir::Op;
  const Roofline& r = *machine.roofline;
  const double peak = bf16 ? r.peak_bf16 : r.peak_fp32, elt = bf16 ? 2 : 4;
  const double bandwidth = machine.memory_bandwidth * r.memory_efficiency, t = static_cast<double>(ways);
  auto gemm = [&](double M, double N, double K) {
    const double tm = static_cast<double>(r.tile_m), tn = static_cast<double>(r.tile_n), sms = static_cast<double>(machine.sms);
    const double waves = std::ceil(std::ceil(M / tm) * std::ceil(N / tn) / sms);
    const double used = M * N / (waves * sms * tm * tn);  // of the SMs' tiles over all waves
    return std::max(2 * M * N * K / (peak * r.gemm_efficiency * used), (M * K + K * N + M * N) * elt / bandwidth);
  };
  switch (w.kind) {
    case Work::Kind::Gemm: {
      const double M = static_cast<double>(w.m) * rows, N = static_cast<double>(w.n) / (w.shard == 'n' ? t : 1),
                   K = static_cast<double>(w.k) / (w.shard == 'k' ? t : 1);
      switch (op) {
        case Op::F: return gemm(M, N, K);
        case Op::BI: return gemm(M, K, N);
        case Op::BW: return gemm(N, K, M);
        case Op::B: return gemm(M, K, N) + gemm(N, K, M);
        default: return 0;
      }
    }
    case Work::Kind::Attention: {
      const double flops = w.flops() * rows / t;
      const double bytes = rows * static_cast<double>(w.heads) / t * static_cast<double>((w.q + w.kv) * (w.head_dim + w.v_dim)) * elt;
      if (op == Op::F) return std::max(flops / (peak * r.attention_forward), bytes / bandwidth);
      if (op == Op::B || op == Op::BI) return std::max(2.5 * flops / (peak * r.attention_backward), 2 * bytes / bandwidth);
      return 0;
    }
    case Work::Kind::Memory: {
      const double bytes = static_cast<double>(w.elements) * rows / (w.shard == 'n' ? t : 1) * elt;
      return op == Op::F ? bytes / bandwidth : op == Op::BW ? 0 : 2 * bytes / bandwidth;
    }
  }
  return 0;
}

// A chunk on the roofline: the work of the regions it runs (an expert piece: its list's members on
// the tokens its ep group routes to them), each tp-sharded region's at its slice; a region that does
// not say its work at the machine's `flops`. Scaled by the chunk's FLOPs over the work's, so that
// what the IR says the chunk runs (an expert piece's owned members) is what is priced.
std::optional<double> CostModel::roofline_chunk(const ir::Graph& g, const ir::Node& n) const {
  using ir::Op;
  if (work_.empty() || n.stage < 0 || !ir::is_chunk(n.op) || n.op == Op::U) return std::nullopt;
  const ir::StageFacts& st = g.stage(n.stage);
  const ir::Segment& seg = g.segment_of(n);
  std::vector<RegionId> lists;  // the stage's expert lists: their own pieces
  for (const ir::Segment& s : st.segments)
    if (s.sharded >= 0) lists.push_back(s.sharded);
  auto among = [](const std::vector<RegionId>& v, RegionId r) { return std::find(v.begin(), v.end(), r) != v.end(); };
  double rows = static_cast<double>(samples_);
  std::vector<std::pair<RegionId, bool>> todo;  // region, inside a tp-sharded one
  if (seg.sharded >= 0) {
    for (const ir::ExpertShard& e : st.experts)
      if (e.list == seg.sharded) rows *= static_cast<double>(e.ways);
    for (RegionId c : work_.at(static_cast<size_t>(seg.sharded)).children) todo.push_back({c, false});
  } else {
    for (RegionId r : seg.regions) todo.push_back({r, false});
  }
  const bool bf16 = st.precision == DType::BF16;
  const double factor = n.op == Op::B ? 2 : 1;
  double t = 0, flops = 0;
  bool said = false;
  while (!todo.empty()) {
    auto [q, sharded] = todo.back();
    todo.pop_back();
    if (seg.sharded < 0 && among(lists, q)) continue;
    sharded = sharded || among(seg.tp_regions, q);
    const RegionWork& rw = work_.at(static_cast<size_t>(q));
    const int64_t ways = sharded ? std::max<int64_t>(st.tp.ways, 1) : 1;
    if (rw.work.empty()) {
      const double f = static_cast<double>(rw.flops) / static_cast<double>(ways);
      t += factor * f * rows / machine_->flops;
      flops += f;
    }
    for (const Work& w : rw.work) {
      t += roofline_seconds(*machine_, w, n.op, rows, ways, bf16);
      flops += w.flops() / static_cast<double>(w.kind == Work::Kind::Memory ? 1 : w.shard ? ways : 1);
      said = true;
    }
    for (RegionId c : rw.children) todo.push_back({c, sharded});
  }
  if (!said) return std::nullopt;
  const double mine = static_cast<double>(n.flops) * static_cast<double>(samples_);
  return flops > 0 ? t * mine / (flops * rows) : t;
}

// Regions are measured whole, on one rank: under tensor or context parallelism the share of a
// piece's work its sharded (or context) regions do, by FLOPs, splits over the axis.
double CostModel::split_share(const ir::Graph& g, const ir::Node& n) const {
  const ir::Segment& seg = g.segment_of(n);
  const ir::StageFacts& st = g.stage(n.stage);
  const bool context = !seg.context_regions.empty();
  const int64_t ways = context ? st.cp.ways : st.tp.ways;
  const std::vector<RegionId>& split = context ? seg.context_regions : seg.tp_regions;
  if (split.empty() || ways <= 1) return 1;
  double whole = 0, part = 0;
  for (RegionId r : seg.regions) whole += static_cast<double>(subtree_flops_.at(static_cast<size_t>(r)));
  for (RegionId q : split) part += static_cast<double>(subtree_flops_.at(static_cast<size_t>(q)));
  if (whole <= 0) return 1;
  return 1 - part / whole * (1 - 1.0 / static_cast<double>(ways));
}

// The all-reduces a tensor-parallel piece runs inside: one per sharded region, of its partial
// output in the forward and of its input gradient in the backward (none in BW), ring on the tp axis's
// link; with sequence parallelism, one all-gather more.
CostModel::PieceTraffic CostModel::piece_traffic(const ir::Graph& g, const ir::Node& n) const {
  using ir::Op;
  if (n.stage < 0 || !ir::is_chunk(n.op) || n.op == Op::U || n.op == Op::BW) return {};
  const ir::Segment& seg = g.segment_of(n);
  if (!seg.context_regions.empty()) return ring_traffic(g, n);
  const ir::TensorParallel& tp = g.stage(n.stage).tp;
  if (seg.tp_regions.empty() || tp.ways <= 1) return {};
  PieceTraffic t;
  t.calls = static_cast<int64_t>(seg.tp_regions.size());
  t.axis = tp.axis;
  t.on_network = g.facts.hosts.axis(tp.axis);
  // Partial sums travel in the compute precision (the manifest's outputs are fp32).
  t.bytes = static_cast<double>(seg.tp_reduce_bytes) * static_cast<double>(samples_) /
            (g.stage(n.stage).precision == DType::BF16 ? 2 : 1);
  const double each = t.bytes / static_cast<double>(t.calls);
  if (machine_) t.seconds = static_cast<double>(t.calls) * collective_seconds(g, Op::AllReduce, each, tp.ways, tp.axis);
  // Sequence parallelism: each all-reduce is a reduce-scatter and an all-gather of as many bytes (a
  // ring prices them alike), and a run of such regions gathers the shares once at its end (forward)
  // or where it took them (backward): one all-gather of a region's output more.
  if (!seg.sequence_regions.empty()) {
    t.calls += 1;
    t.bytes += each;
    if (machine_) t.seconds += collective_seconds(g, Op::AllGather, each, tp.ways, tp.axis);
  }
  return t;
}

// Context parallelism's exchanges inside a piece (runtime/model/ring_attention.cpp): per attention,
// forward cp-1 shifts of this rank's keys and values (kv/cp each); backward cp-1 shifts of keys,
// values and their gradients (twice that) and one of the gradients home. Each shift is a send to
// the next rank and a receive from the previous at once: latency + bytes / bandwidth on the cp
// axis's link. The shares are gathered once per run of context regions (an all-gather of a region's
// output; backward, of its input gradient).
CostModel::PieceTraffic CostModel::ring_traffic(const ir::Graph& g, const ir::Node& n) const {
  const ir::Segment& seg = g.segment_of(n);
  const ir::TensorParallel& cp = g.stage(n.stage).cp;
  if (cp.ways <= 1) return {};
  PieceTraffic t;
  t.op = "ring exchange (in pieces)";
  t.axis = cp.axis;
  t.on_network = g.facts.hosts.axis(cp.axis);
  const double k = static_cast<double>(cp.ways), x = static_cast<double>(samples_);
  // The ring computes in fp32 (keys and values travel so in bf16 too); the gather in the compute precision.
  const double kv = static_cast<double>(seg.cp_kv_bytes) * x / k;  // this rank's share, all its attentions
  const double gather = static_cast<double>(seg.cp_gather_bytes) * x / (g.stage(n.stage).precision == DType::BF16 ? 2 : 1);
  const bool back = n.op != ir::Op::F;
  const int64_t shifts = seg.cp_rings * (back ? cp.ways : cp.ways - 1);
  const double ring = back ? 2 * kv * (k - 1) + kv : kv * (k - 1);
  t.calls = shifts;
  t.bytes = ring;
  t.gathered = gather;
  if (machine_) {
    const Link& l = link_for(g.axis_name(cp.axis), t.on_network, true);
    t.gathered_seconds = collective_seconds(g, ir::Op::AllGather, gather, cp.ways, cp.axis);
    t.seconds = static_cast<double>(shifts) * l.latency + ring / l.bandwidth + t.gathered_seconds;
  }
  return t;
}

bool on_network(const ir::Graph& g, const ir::Node& n) {
  const ir::HostFacts& hosts = g.facts.hosts;
  if (n.op == ir::Op::Send || n.op == ir::Op::Recv) return hosts.handoff(n.stage, n.flags & ir::kBackward);
  return hosts.axis(n.axis);
}

// A collective of k ranks along `axis`, `b` bytes each. Inside a host: a ring on the host's link
// (k - 1 steps, each moving b/k; twice for an all-reduce). Across H hosts with r = k/H members on
// each (ir::HostFacts): NCCL runs a ring per NIC, so a ring's network hop carries what an inside
// hop does and the group's r NICs share the crossing traffic: per rank min(inside, r × network).
// Each ring step waits for its slowest hop (the network's latency); a tree's log2 k steps where
// fewer (NCCL picks trees for latency-bound sizes). All-to-all: what a rank sends to other hosts
// leaves through its own NIC. A link the machine names for the axis is a flat ring, as it says.
double CostModel::collective_seconds(const ir::Graph& g, ir::Op op, double b, int64_t group, int32_t axis) const {
  using ir::Op;
  const std::string& name = g.axis_name(axis);
  const double k = static_cast<double>(std::max<int64_t>(group, 1)), f = op == Op::AllReduce ? 2 : 1;
  const bool crosses = g.facts.hosts.axis(axis);
  const Link& in = link_for(name, false, true);
  if (!crosses || machine_->axes.count(name)) {
    const Link& l = link_for(name, crosses, true);
    return f * (k - 1) * l.latency + f * (k - 1) / k * b / l.bandwidth;
  }
  const Link& net = link_for(name, true, true);
  const double hosts = std::min(k, static_cast<double>(g.facts.hosts.hosts_along(axis)));
  const double r = std::max(1.0, std::floor(k / hosts));
  const double steps = std::min(k - 1, std::ceil(std::log2(k)));
  if (op == Op::AllToAll)
    return (k - 1) * net.latency + std::max((r - 1) / k * b / in.bandwidth, (k - r) / k * b / net.bandwidth);
  return f * steps * net.latency + f * (k - 1) / k * b / std::min(in.bandwidth, r * net.bandwidth);
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
  if (!measured_ops_.empty() && ir::is_chunk(n.op))
    if (auto it = measured_ops_.find(ir::token(n)); it != measured_ops_.end()) return it->second;
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
  if (auto t = measured_chunk(g, n)) return *t + piece_traffic(g, n).seconds;
  if (auto t = roofline_chunk(g, n)) return *t + piece_traffic(g, n).seconds;
  if (n.op == Op::U && m.roofline) {
    // Adam over fp32 state: parameter, gradient and two moments read, three written (28 bytes a
    // parameter, 7× its fp32 bytes), and a bf16 copy written where the stage computes in bf16.
    const bool bf16 = g.stage(n.stage).precision == DType::BF16;
    return (bf16 ? 7.5 : 7.0) * static_cast<double>(n.bytes) / (m.memory_bandwidth * m.roofline->memory_efficiency);
  }
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
    case Op::F: return fwd + piece_traffic(g, n).seconds;
    case Op::B: return 2 * fwd + piece_traffic(g, n).seconds;
    case Op::BI: return fwd + piece_traffic(g, n).seconds;
    case Op::BW: return fwd;
    case Op::U: return 16.0 * static_cast<double>(n.bytes) / m.memory_bandwidth;  // read/write params, grads, 2 moments
    case Op::Recv: return 0;
    default: break;
  }
  const double b = static_cast<double>(n.bytes);
  if (n.op == Op::Send || n.op == Op::Broadcast) {
    const Link& l = link_for(g.axis_name(n.axis), on_network(g, n), false);
    // A handoff's calibrated seconds: what a stage waiting for one measured beyond the link.
    return (n.op == Op::Send ? m.calibration.p2p : 0) + l.latency + b / l.bandwidth;
  }
  switch (n.op) {
    case Op::AllReduce:
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllToAll:  // the calibrated seconds: measured inside a step, beyond the formula
      return m.calibration.collective + collective_seconds(g, n.op, b, group_size, n.axis);
    default: return 0;
  }
}

}  // namespace piper::sched
