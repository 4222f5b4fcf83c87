#include "scheduler/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <fstream>
#include <sstream>

#include "ir/emit.h"
#include "ir/lower.h"
#include "lang/units.h"
#include "scheduler/op_times.h"

namespace piper::sched {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// The plan's identity: every class's stream programs (tokens in order) and the sizes they run with.
uint64_t plan_hash(const ir::Graph& g, const Schedule& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& c : s.classes)
    for (const auto& st : c.streams) {
      h = fnv(h, g.streams[st.stream]);
      for (ir::NodeId v : st.ops) h = fnv(h, ir::token(g.nodes[static_cast<size_t>(v)]) + ";");
    }
  const auto& f = g.facts;
  // Tokens do not say which regions a stage runs or how ZeRO-3 cuts its units: the facts do.
  for (const auto& st : f.stages) {
    h = fnv(h, fmt::format("stage {} {} regions {};", st.coord, st.chunk, fmt::join(st.regions, ",")));
    for (const auto& u : st.replication.units) h = fnv(h, fmt::format("unit {}-{};", u.begin, u.end));
  }
  for (const auto& l : f.stream_sms) h = fnv(h, fmt::format("sms {} {};", g.streams[l.stream], l.sms));  // communicators differ
  return fnv(h, fmt::format("world={} mb={} samples={}", f.mesh.world(), f.microbatches, f.samples_per_microbatch));
}

// The machine description, read and parsed once per compile: from `machine_text` when given (the
// profiler's own, not yet written), else from the file. Nothing without one (unit costs).
std::optional<Machine> load_machine(const PlanOptions& o, SourceManager& sources, DiagnosticEngine& diags, PlanResult& r) {
  if (o.machine_path.empty() && o.machine_text.empty()) return std::nullopt;
  const std::string name = o.machine_path.empty() ? "<machine>" : o.machine_path;
  std::string text = o.machine_text;
  if (text.empty()) {
    std::ifstream in(o.machine_path);
    if (!in) {
      r.status = PlanStatus::IoError;
      r.io_error = fmt::format("{}: cannot open", o.machine_path);
      return std::nullopt;
    }
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  auto mc = parse_machine(sources.add(name, text), sources, diags);
  if (!mc) r.status = PlanStatus::Invalid;
  return mc;
}

std::optional<CostModel> cost_model(const PlanOptions& o, const std::optional<Machine>& machine, const ir::Graph& g,
                                    const Manifest& manifest, PlanResult& r) {
  if (!machine) {
    std::string error;
    auto unit = parse_unit_costs(o.cost_spec, &error);
    if (!unit) {
      r.status = PlanStatus::IoError;
      r.io_error = error;
      return std::nullopt;
    }
    return CostModel::unit(*unit);
  }
  std::vector<std::string> axes;
  for (const auto& a : g.facts.mesh.axes()) axes.push_back(a.name);
  return CostModel::machine(*machine, axes, g.facts.samples_per_microbatch, manifest);
}

// Over budget: the error names the directive that decides the most memory — replication (ZeRO) for
// model states, the split for activations — with its use chain.
void check_budget(const Plan& p, double budget, DiagnosticEngine& diags) {
  const auto worst = *std::max_element(p.memory.begin(), p.memory.end(), [](auto& a, auto& b) { return a.peak < b.peak; });
  if (double(worst.peak) <= budget) return;
  const bool states = 2 * worst.states() > worst.peak;
  const Directive* culprit = nullptr;
  for (const auto& d : p.strategy.directives)
    if ((states && std::holds_alternative<ReplicateDirective>(d.body)) ||
        (!states && std::holds_alternative<SplitDirective>(d.body)))
      culprit = &d;
  auto& d = diags.error(culprit ? culprit->loc : SourceLoc{},
                        fmt::format("the plan needs {} on its fullest device, over the budget of {}",
                                    human_bytes(double(worst.peak)), human_bytes(budget)));
  d.note(SourceLoc{}, states ? "model states dominate: shard them further (replicate ... zero 3) or use more pipeline stages"
                             : "activations dominate: recompute, fewer microbatches in flight, or more pipeline stages");
  if (culprit)
    for (const Note& n : culprit->used_from) d.notes.push_back(n);
}

// `sms N` on a stream: at most the device's multiprocessors, as the machine file states them (a
// machine that does not say is not checked, and the limit goes unpriced).
bool sms_fit(const ir::Graph& g, const Machine& machine, const PlanOptions& o, DiagnosticEngine& diags) {
  bool ok = true;
  for (const ir::StreamSms& l : g.facts.stream_sms)
    if (machine.sms > 0 && l.sms >= machine.sms) {
      diags.error(l.loc, fmt::format("stream '{}' may use {} multiprocessors, but a device of '{}' has {}{}", g.streams[l.stream],
                                     l.sms, machine.name, machine.sms, l.sms == machine.sms ? " (none left for compute)" : ""))
          .note(SourceLoc{}, fmt::format("the machine's `sms`, in {}", o.machine_path.empty() ? "its description" : o.machine_path));
      ok = false;
    }
  return ok;
}

// The machine's measured region costs for `balanced` placement (F + B at one sample), which the
// lowering's cut pass weighs.
std::map<std::string, double> region_costs(const std::optional<Machine>& machine) {
  std::map<std::string, double> out;
  if (machine)
    for (const auto& [name, t] : machine->regions) out[name] = machine->calibration.F * t.F.at(1) + machine->calibration.B * t.B.at(1);
  return out;
}

PlanResult compile_checked(PlanResult r, const PlanOptions& o, const std::optional<Machine>& machine, DiagnosticEngine& diags) {
  const CheckedStrategy& s = *r.strategy;
  ir::LowerOptions lo;
  lo.verify_each = o.verify_each;
  lo.after_pass = o.after_pass;
  lo.max_nodes = o.max_nodes;
  lo.global_norm = o.global_norm;
  lo.region_costs = region_costs(machine);
  lo.host_of = o.host_of;
  if (!lo.host_of.empty() && static_cast<int64_t>(lo.host_of.size()) != s.mesh.world()) {
    diags.error(SourceLoc{}, fmt::format("the hosts hold {} ranks, but the mesh has {}", lo.host_of.size(), s.mesh.world()));
    r.status = PlanStatus::Invalid;
    return r;
  }
  if (lo.host_of.empty() && machine && machine->ranks_per_host > 0 && s.mesh.world() > machine->ranks_per_host)
    lo.host_of = hosts_in_order(s.mesh.world(), machine->ranks_per_host);
  if (o.cmd.batch_size) lo.samples_per_microbatch = std::max<int64_t>(1, s.samples_per_microbatch(*o.cmd.batch_size));
  auto t = Clock::now();
  auto g = ir::lower(s, *r.manifest, diags, lo);
  r.timings.lower_s = since(t);
  if (!g) {
    r.status = PlanStatus::Invalid;
    return r;
  }
  if (machine && !sms_fit(*g, *machine, o, diags)) {
    r.status = PlanStatus::Invalid;
    return r;
  }
  auto costs = cost_model(o, machine, *g, *r.manifest, r);
  if (!costs) {
    if (r.status == PlanStatus::Ok) r.status = PlanStatus::Invalid;
    return r;
  }
  t = Clock::now();
  auto sch = schedule(*g, *costs, diags);
  if (sch && !o.measured_ops.empty()) {  // the programs just made (what piper-run runs), on a run's times
    costs->set_measured_ops(o.measured_ops);
    sch = retime(*g, *sch, *costs, diags);
  }
  if (sch)
    if (auto hang = find_deadlock(*g, *sch)) {
      diags.error(SourceLoc{}, *hang);
      sch.reset();
    }
  if (!sch) {
    r.status = PlanStatus::Invalid;
    return r;
  }
  // Moved, not copied: a pipeline's strategy holds one order record per task instance.
  Plan p{*r.manifest, std::move(*r.strategy), std::move(*g), std::move(*sch), *costs, {}, 0};
  r.strategy.reset();  // now plan->strategy
  // What reports show is what runs: the stages as lowered (a balanced cut by measured costs).
  p.strategy.stages.clear();
  for (const auto& st : p.dag.facts.stages) p.strategy.stages.push_back(Stage{st.regions, st.coord, st.chunk});
  p.memory = memory_use(p.dag, p.schedule, p.manifest, MemoryOptions{o.optimizer == "adamw"});
  p.hash = plan_hash(p.dag, p.schedule);
  r.timings.schedule_s = since(t);
  if (o.memory_budget) {
    const size_t before = diags.error_count();
    check_budget(p, *o.memory_budget, diags);
    if (diags.error_count() > before) {
      r.status = PlanStatus::Invalid;
      return r;
    }
  }
  r.plan = std::move(p);
  return r;
}

}  // namespace

std::vector<int32_t> hosts_in_order(int64_t world, int64_t per_host) {
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(world, 0)));
  for (size_t r = 0; r < out.size(); ++r) out[r] = static_cast<int32_t>(static_cast<int64_t>(r) / std::max<int64_t>(per_host, 1));
  return out;
}

PlanResult compile_plan(FileId strategy, const Manifest& manifest, const PlanOptions& options, SourceManager& sources,
                        DiagnosticEngine& diags) {
  PlanResult r;
  r.manifest = manifest;
  const auto machine = load_machine(options, sources, diags, r);
  if (r.status != PlanStatus::Ok) return r;
  auto t = Clock::now();
  r.strategy = check_text(strategy, manifest, options.cmd, sources, diags);
  r.timings.check_s = since(t);
  if (!r.strategy) {
    r.status = PlanStatus::Invalid;
    return r;
  }
  return compile_checked(std::move(r), options, machine, diags);
}

PlanResult compile_plan(const std::string& model_path, const std::string& strategy_path, const PlanOptions& options,
                        SourceManager& sources, DiagnosticEngine& diags) {
  PlanResult r;
  const auto machine = load_machine(options, sources, diags, r);
  if (r.status != PlanStatus::Ok) return r;
  auto t = Clock::now();
  FrontendResult f = run_frontend(model_path, strategy_path, options.cmd, sources, diags);
  r.timings.check_s = since(t);
  r.manifest = std::move(f.manifest);
  r.strategy = std::move(f.strategy);
  r.io_error = f.io_error;
  r.status = f.status == FrontendStatus::Ok ? PlanStatus::Ok
           : f.status == FrontendStatus::IoError ? PlanStatus::IoError : PlanStatus::Invalid;
  if (r.status != PlanStatus::Ok) return r;
  return compile_checked(std::move(r), options, machine, diags);
}

std::string render_errors(const PlanResult& r, const DiagnosticEngine& diags) {
  std::ostringstream out;
  diags.print_all(out);
  if (!r.io_error.empty()) out << r.io_error << "\n";
  return out.str();
}

std::optional<Fit> largest_microbatch(const std::string& model_path, const std::string& strategy_path,
                                      PlanOptions options, double budget, std::string* errors, int64_t limit) {
  options.memory_budget.reset();
  // Peaks grow with the samples per microbatch: find the last that fits by doubling, then bisection.
  std::map<int64_t, int64_t> peaks;
  options.cmd.batch_size.reset();  // first without a batch: how many replicas and microbatches share one
  auto shape = compile_plan(model_path, strategy_path, options, errors);
  if (!shape) return std::nullopt;
  const int64_t per_sample = shape->dag.facts.mesh.replicas(shape->dag.facts.pipeline_axis) * shape->dag.facts.microbatches;
  auto peak = [&](int64_t samples) -> std::optional<int64_t> {
    if (auto it = peaks.find(samples); it != peaks.end()) return it->second;
    options.cmd.batch_size = samples * per_sample;
    auto p = compile_plan(model_path, strategy_path, options, errors);
    if (!p) return std::nullopt;
    int64_t worst = 0;
    for (const auto& m : p->memory) worst = std::max(worst, m.peak);
    return peaks[samples] = worst;
  };
  int64_t lo = 0, hi = 1;  // lo fits (0 trivially), hi is the next to try
  for (;;) {
    auto p = peak(hi);
    if (!p) return std::nullopt;
    if (double(*p) > budget) break;
    lo = hi;
    if (hi >= limit) break;
    hi = std::min(limit, hi * 2);
  }
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    auto p = peak(mid);
    if (!p) return std::nullopt;
    (double(*p) > budget ? hi : lo) = mid;
  }
  Fit f;
  f.samples = lo;
  if (lo > 0) f.peak = *peak(lo);
  if (auto n = peak(lo + 1)) f.next_peak = *n;
  return f;
}

std::optional<Plan> compile_plan(const std::string& model_path, const std::string& strategy_path,
                                 const PlanOptions& options, std::string* errors) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  PlanResult r = compile_plan(model_path, strategy_path, options, sources, diags);
  if (r.plan) return std::move(r.plan);
  *errors = render_errors(r, diags);
  return std::nullopt;
}

}  // namespace piper::sched
