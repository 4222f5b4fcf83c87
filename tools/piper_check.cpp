// piper-check: checks a strategy against a model before anyone spends GPU hours (a thin CLI over the plan compiler).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <iostream>
#include <unistd.h>

#include "ir/emit.h"
#include "ir/lower.h"
#include "lang/diagnostic_verifier.h"
#include "lang/frontend.h"
#include "lang/internal_error.h"
#include "lang/report.h"
#include "lang/units.h"
#include "scheduler/emit.h"
#include "scheduler/op_times.h"
#include "scheduler/plan.h"
#include "scheduler/report.h"

namespace {

using namespace piper;

using Checked = sched::Plan;  // what a mode sees: the whole compiled plan

// What `--emit` can produce. Later stages add rows here (schedule, trace, ...), ninja-tool style.
struct EmitMode {
  const char* name;
  const char* help;
  std::function<std::string(const Checked&)> emit;
};

std::string report(const Checked& c) {
  size_t comm = std::count_if(c.dag.nodes.begin(), c.dag.nodes.end(), [](const ir::Node& n) { return !ir::is_chunk(n.op); });
  return strategy_report(c.strategy, c.manifest) +
         fmt::format("  dag        {} nodes ({} compute, {} communication), {} edges\n", c.dag.nodes.size(),
                     c.dag.nodes.size() - comm, comm, c.dag.edges.size()) +
         ir::emit_hosts(c.dag);
}

const std::vector<EmitMode>& emit_modes() {
  static const std::vector<EmitMode> modes = {
      {"report", "a summary of mesh, stages, directives and the DAG (the default)", report},
      {"ast", "the checked strategy as canonical Piper text (loops unrolled, uses inlined)",
       [](const Checked& c) { return print_strategy(c.strategy, c.manifest); }},
      {"dag", "the Global Training DAG, one node per line with its inputs (tokens like 1F0, 0SEND_F3)",
       [](const Checked& c) { return ir::emit_dag_text(c.dag); }},
      {"dag-json", "the DAG as JSON: {nodes: [...], edges: [...]}", [](const Checked& c) { return ir::emit_dag_json(c.dag); }},
      {"dot", "the DAG for Graphviz (dot -Tsvg)", [](const Checked& c) { return ir::emit_dot(c.dag); }},
      {"schedule", "per rank and stream, the ordered op tokens (with cross-stream event waits)",
       [](const Checked& c) { return sched::emit_schedule(c.dag, c.schedule); }},
      {"torch-csv", "compute order per pipeline rank in PyTorch pipelining's CSV action format",
       [](const Checked& c) { return sched::emit_torch_csv(c.dag, c.schedule); }},
      {"trace", "the simulated timeline as Chrome/Perfetto trace JSON (a track per rank and stream)",
       [](const Checked& c) { return sched::emit_trace(c.dag, c.schedule, c.costs.is_unit(), &c.manifest, &c.memory); }},
      {"svg", "a pipeline picture of the simulated timeline", [](const Checked& c) { return sched::emit_svg(c.dag, c.schedule); }},
      {"sim-json", "the simulated step as JSON: step time, per rank its peak memory by category, busy and idle",
       [](const Checked& c) { return sched::emit_sim_json(c.dag, c.schedule, c.memory); }},
  };
  return modes;
}

constexpr int kOk = 0, kInvalid = 1, kUsage = 2;

struct CheckArgs {
  std::string model, strategy, emit = "report", output;
  std::optional<int64_t> np, batch;
  std::vector<std::string> sets, include_dirs;
  bool verify = false, list_emits = false, list_passes = false, verify_each = false, simulate = false, fit = false;
  bool global_norm = false;
  std::string print_after, cost_spec, machine_path, budget_text, hosts, report;
  std::string op_times_path;  // --op-times: a run's trace, read into measured_ops
  sched::StepRange op_times_steps{4};
  std::map<std::string, double> measured_ops;
};

// --op-times TRACE: the run's chunk times, or a usage error that says why not.
bool load_op_times(CheckArgs& a) {
  if (a.op_times_path.empty()) return true;
  std::string why;
  a.measured_ops = sched::read_op_times(a.op_times_path, a.op_times_steps, &why);
  if (a.measured_ops.empty()) fmt::print(stderr, "piper-check: error: --op-times {}: {}\n", a.op_times_path, why);
  return !a.measured_ops.empty();
}

// --hosts HOSTSxRANKS ("2x4": ranks 0-3 on the first host, 4-7 on the second), as mpirun fills a
// hostfile's slots.
std::optional<std::vector<int32_t>> parse_hosts(const std::string& text) {
  int64_t hosts = 0, per = 0;
  char x = 0;
  int used = 0;
  if (std::sscanf(text.c_str(), "%ld%c%ld%n", &hosts, &x, &per, &used) != 3 || static_cast<size_t>(used) != text.size() || x != 'x' ||
      hosts < 1 || per < 1 || hosts * per > (1 << 24))
    return std::nullopt;
  return sched::hosts_in_order(hosts * per, per);
}

// The command line into `a`; an exit status when the run ends here (help, version, a usage error).
std::optional<int> parse(int argc, char** argv, CheckArgs& a) {
  CLI::App app{"piper-check: parse and check a Piper strategy against a model's region manifest"};
  app.set_version_flag("--version", std::string("piper-check ") + PIPER_VERSION);
  app.add_option("MODEL", a.model, "model.pt (TorchScript archive with piper/manifest.json) or a manifest .json");
  app.add_option("STRATEGY", a.strategy, "strategy file (.piper)");
  app.add_option("--np", a.np, "world size (number of ranks); default: the mesh's size");
  // One value per flag, so `--set a=1 MODEL STRATEGY` leaves the positionals alone.
  app.add_option("--set", a.sets, "override a parameter: NAME=VALUE (repeatable)")->allow_extra_args(false);
  app.add_option("--batch-size", a.batch, "global batch size, checked to split over replicas and microbatches");
  app.add_option("-I,--include", a.include_dirs, "extra folder to search for `use \"...\"` files (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--emit", a.emit, "what to print: report (default), ast; --list-emits lists them");
  app.add_option("-o,--output", a.output, "write the emitted text to FILE instead of stdout");
  app.add_flag("--list-emits", a.list_emits, "list the --emit modes and exit");
  app.add_flag("--list-passes", a.list_passes, "list the lowering passes and exit");
  app.add_option("--print-after", a.print_after, "print the DAG (as --emit dag) after lowering pass PASS, to stderr");
  app.add_flag("--verify-each", a.verify_each, "run the DAG verifier after every pass (a failure is a Piper bug)");
  app.add_flag("--simulate", a.simulate,
               "simulate the step: per-rank busy/idle, bubble, peak memory (exit 1 over budget); the text goes with "
               "--emit report, else to stdout beside -o FILE or to stderr");
  app.add_option("--machine", a.machine_path, "machine description for costs (machines/h100.json, a100, h200, unit)");
  app.add_option("--cost", a.cost_spec, "unit costs instead of a machine: F=1,B=2,W=1,comm=0[,FB=..] (the default; FB prices a || pair as one interval)");
  app.add_option("--op-times", a.op_times_path,
                 "simulate on a run's compute: its trace (piper-run --trace) gives each chunk its median time; "
                 "communication as the machine or units price it");
  app.add_option("--op-times-from", a.op_times_steps.first, "the first step --op-times reads (the earlier ones warm up)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--op-times-to", a.op_times_steps.last, "the last step --op-times reads (the same as --op-times-from: "
                 "that step's own times); default the trace's last")
      ->check(CLI::PositiveNumber);
  app.add_flag("--clip-grad-norm", a.global_norm,
               "plan for clipping by the global gradient norm, as piper-run --clip-grad-norm runs it (its all-reduce)");
  app.add_option("--hosts", a.hosts, "HOSTSxRANKS: the ranks on hosts in order (2x4: ranks 0-3 on one, 4-7 on the next); "
                 "the report says what crosses them, the simulation prices it on the machine file's network");
  app.add_option("--memory-budget", a.budget_text, "per-device memory budget for --simulate and --report, e.g. 80GiB");
  app.add_option("--report", a.report,
                 "also write the plan as one self-contained HTML page: timeline per rank and stream, memory against "
                 "the budget, communication per link tier, the mesh");
  app.add_flag("--fit", a.fit, "with --memory-budget: the largest microbatch (samples) whose plan fits the budget");
  app.add_flag("--verify-diagnostics", a.verify,
               "test mode: check the diagnostics against `# expected-error {{...}}` comments in the sources");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kOk : kUsage;
  }
  if (a.list_emits) {
    for (const auto& m : emit_modes()) fmt::print("{:<10} {}\n", m.name, m.help);
    return kOk;
  }
  if (a.list_passes) {
    for (const auto& p : ir::pass_list()) fmt::print("{:<10} {}\n", p.name, p.help);
    return kOk;
  }
  if (!a.print_after.empty() && std::none_of(ir::pass_list().begin(), ir::pass_list().end(),
                                             [&](auto& p) { return a.print_after == p.name; })) {
    fmt::print(stderr, "piper-check: error: unknown pass '{}' (see --list-passes)\n", a.print_after);
    return kUsage;
  }
  if (!a.hosts.empty() && !parse_hosts(a.hosts)) {
    fmt::print(stderr, "piper-check: error: --hosts '{}': expected HOSTSxRANKS, e.g. 2x4\n", a.hosts);
    return kUsage;
  }
  if (!load_op_times(a)) return kUsage;
  if (!a.budget_text.empty() && !parse_size(a.budget_text)) {
    fmt::print(stderr, "piper-check: error: --memory-budget: '{}' is not a size like 80GiB\n", a.budget_text);
    return kUsage;
  }
  if (a.model.empty() || a.strategy.empty()) {
    std::cerr << app.help() << "\npiper-check: error: MODEL and STRATEGY are required\n";
    return kUsage;
  }
  return std::nullopt;
}

sched::PlanOptions plan_options(const CheckArgs& a) {
  sched::PlanOptions opt;
  opt.cmd = CommandLine{a.np, a.sets, a.batch, a.include_dirs};
  for (auto& d : default_search_path()) opt.cmd.search_path.push_back(d);
  opt.machine_path = a.machine_path;
  opt.cost_spec = a.cost_spec;
  opt.verify_each = a.verify_each;
  opt.global_norm = a.global_norm;
  opt.measured_ops = a.measured_ops;
  if (auto h = parse_hosts(a.hosts)) opt.host_of = *h;
  return opt;
}

// --fit: a search over plans; prints what fits, nothing else.
int fit(const CheckArgs& a) {
  auto b = parse_size(a.budget_text);
  if (!b) {
    fmt::print(stderr, "piper-check: error: --fit needs --memory-budget SIZE (e.g. 2GiB)\n");
    return kUsage;
  }
  sched::PlanOptions opt = plan_options(a);
  opt.cmd.batch_size.reset();
  std::string errors;
  auto f = sched::largest_microbatch(a.model, a.strategy, opt, *b, &errors);
  if (!f) {
    std::cerr << errors;
    return kInvalid;
  }
  if (f->samples == 0)
    fmt::print("{}: not even one sample per microbatch fits {}: it needs {} on the fullest rank\n", a.strategy,
               human_bytes(*b), human_bytes(double(f->next_peak)));
  else
    fmt::print("{}: the largest microbatch that fits {} is {} sample{} (peak {} on the fullest rank); {} would need {}\n",
               a.strategy, human_bytes(*b), f->samples, f->samples == 1 ? "" : "s", human_bytes(double(f->peak)),
               f->samples + 1, human_bytes(double(f->next_peak)));
  return kOk;
}

std::string simulation_text(const CheckArgs& a, const sched::Plan& plan, double budget) {
  bool over = false;
  const char* priced = plan.costs.is_unit()          ? ""
                       : plan.costs.measured(plan.dag) ? "; every chunk from measured region times"
                       : plan.costs.roofline()         ? "; chunks on the roofline from the manifest's work"
                                                       : "; chunks by FLOPs where the file has no region times";
  return fmt::format("simulated step ({}{}):\n{}", plan.costs.is_unit() ? "unit costs" : a.machine_path, priced,
                     sched::simulate_report(plan.dag, plan.schedule, plan.memory, budget, plan.costs.is_unit(), &over));
}

// The emitted text to -o FILE or stdout. With --simulate, the simulation's text joins the report;
// any other mode is a format of its own (JSON, CSV, SVG...), so the text goes beside it: to stdout
// when the format goes to a file, else to stderr.
int write_output(const CheckArgs& a, const sched::Plan& plan, const EmitMode& mode, std::optional<double> budget) {
  std::string text = mode.emit(plan);
  std::string beside;
  if (a.emit == "report") text = fmt::format("{}: ok\n{}", a.strategy, text);
  if (a.simulate) (a.emit == "report" ? text : beside) += simulation_text(a, plan, budget.value_or(0));
  if (a.output.empty()) {
    std::cout << text;
    std::cerr << beside;
    return kOk;
  }
  std::ofstream out(a.output);
  if (!(out << text)) {
    fmt::print(stderr, "piper-check: error: cannot write {}\n", a.output);
    return kUsage;
  }
  std::cout << beside;
  return kOk;
}

// --report FILE: the page, with the budget shown whether or not --simulate checks against it.
bool write_report(const CheckArgs& a, const sched::Plan& plan) {
  sched::ReportContext ctx{a.strategy, a.model, a.machine_path, a.budget_text.empty() ? 0 : parse_size(a.budget_text).value_or(0),
                           a.batch.value_or(0)};
  std::ofstream out(a.report);
  if (!(out << sched::emit_report_html(plan, ctx))) {
    fmt::print(stderr, "piper-check: error: cannot write {}\n", a.report);
    return false;
  }
  return true;
}

int check(const CheckArgs& a, const EmitMode& mode) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  sched::PlanOptions opt = plan_options(a);
  if (!a.print_after.empty())
    opt.after_pass = [&](const char* pass, const ir::Graph& g) {
      if (a.print_after == pass) std::cerr << "# after " << pass << "\n" << ir::emit_dag_text(g);
    };
  if (a.simulate && !a.budget_text.empty()) opt.memory_budget = parse_size(a.budget_text);
  sched::PlanResult r = sched::compile_plan(a.model, a.strategy, opt, sources, diags);
  if (r.status == sched::PlanStatus::IoError && a.verify) {
    fmt::print(stderr, "piper-check: error: {}\n", r.io_error);
    return kUsage;
  }
  if (a.verify) {
    auto problems = verify_diagnostics(diags);
    for (const auto& p : problems) std::cerr << p << (p.ends_with('\n') ? "" : "\n");
    return problems.empty() ? kOk : kInvalid;
  }
  diags.print_all(std::cerr, isatty(2));
  if (r.status == sched::PlanStatus::IoError) {
    fmt::print(stderr, "piper-check: error: {}\n", r.io_error);
    return kUsage;
  }
  if (r.status != sched::PlanStatus::Ok) return kInvalid;
  if (!a.report.empty() && !write_report(a, *r.plan)) return kUsage;
  return write_output(a, *r.plan, mode, opt.memory_budget);
}

}  // namespace

int main(int argc, char** argv) {
  CheckArgs a;
  if (auto rc = parse(argc, argv, a)) return *rc;
  auto mode = std::find_if(emit_modes().begin(), emit_modes().end(), [&](auto& m) { return a.emit == m.name; });
  if (mode == emit_modes().end()) {
    fmt::print(stderr, "piper-check: error: unknown --emit '{}' (see --list-emits)\n", a.emit);
    return kUsage;
  }
  try {
    return a.fit ? fit(a) : check(a, *mode);
  } catch (const InternalError& e) {
    fmt::print(stderr, "piper-check: {}\n", e.what());
    return 3;
  }
}
