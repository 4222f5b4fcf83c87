// piper-check: checks a strategy against a model before anyone spends GPU hours (a thin CLI over the plan compiler).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <functional>
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
#include "scheduler/plan.h"

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
                     c.dag.nodes.size() - comm, comm, c.dag.edges.size());
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"piper-check: parse and check a Piper strategy against a model's region manifest"};
  app.set_version_flag("--version", std::string("piper-check ") + PIPER_VERSION);
  std::string model, strategy, emit = "report", output;
  std::optional<int64_t> np, batch;
  std::vector<std::string> sets, include_dirs;
  bool verify = false, list_emits = false, list_passes = false, verify_each = false, simulate = false;
  std::string print_after, cost_spec, machine_path, budget_text;
  app.add_option("MODEL", model, "model.pt (TorchScript archive with piper/manifest.json) or a manifest .json");
  app.add_option("STRATEGY", strategy, "strategy file (.piper)");
  app.add_option("--np", np, "world size (number of ranks); default: the mesh's size");
  // One value per flag, so `--set a=1 MODEL STRATEGY` leaves the positionals alone.
  app.add_option("--set", sets, "override a parameter: NAME=VALUE (repeatable)")->allow_extra_args(false);
  app.add_option("--batch-size", batch, "global batch size, checked to split over replicas and microbatches");
  app.add_option("-I,--include", include_dirs, "extra folder to search for `use \"...\"` files (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--emit", emit, "what to print: report (default), ast; --list-emits lists them");
  app.add_option("-o,--output", output, "write the emitted text to FILE instead of stdout");
  app.add_flag("--list-emits", list_emits, "list the --emit modes and exit");
  app.add_flag("--list-passes", list_passes, "list the lowering passes and exit");
  app.add_option("--print-after", print_after, "print the DAG (as --emit dag) after lowering pass PASS, to stderr");
  app.add_flag("--verify-each", verify_each, "run the DAG verifier after every pass (a failure is a Piper bug)");
  app.add_flag("--simulate", simulate, "simulate the step: per-rank busy/idle, bubble, peak memory (exit 1 over budget)");
  app.add_option("--machine", machine_path, "machine description for costs (machines/h100.json, a100, h200, unit)");
  app.add_option("--cost", cost_spec, "unit costs instead of a machine: F=1,B=2,W=1,comm=0[,FB=..] (the default)");
  app.add_option("--memory-budget", budget_text, "per-device memory budget for --simulate, e.g. 80GiB");
  bool fit = false;
  app.add_flag("--fit", fit, "with --memory-budget: the largest microbatch (samples) whose plan fits the budget");
  app.add_flag("--verify-diagnostics", verify,
               "test mode: check the diagnostics against `# expected-error {{...}}` comments in the sources");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kOk : kUsage;
  }
  if (list_emits) {
    for (const auto& m : emit_modes()) fmt::print("{:<10} {}\n", m.name, m.help);
    return kOk;
  }
  if (list_passes) {
    for (const auto& p : ir::pass_list()) fmt::print("{:<10} {}\n", p.name, p.help);
    return kOk;
  }
  if (!print_after.empty() && std::none_of(ir::pass_list().begin(), ir::pass_list().end(),
                                           [&](auto& p) { return print_after == p.name; })) {
    fmt::print(stderr, "piper-check: error: unknown pass '{}' (see --list-passes)\n", print_after);
    return kUsage;
  }
  if (model.empty() || strategy.empty()) {
    std::cerr << app.help() << "\npiper-check: error: MODEL and STRATEGY are required\n";
    return kUsage;
  }
  auto mode = std::find_if(emit_modes().begin(), emit_modes().end(), [&](auto& m) { return emit == m.name; });
  if (mode == emit_modes().end()) {
    fmt::print(stderr, "piper-check: error: unknown --emit '{}' (see --list-emits)\n", emit);
    return kUsage;
  }

  if (fit) {  // a search over plans: print what fits, nothing else
    auto b = parse_size(budget_text);
    if (!b) {
      fmt::print(stderr, "piper-check: error: --fit needs --memory-budget SIZE (e.g. 2GiB)\n");
      return kUsage;
    }
    sched::PlanOptions opt;
    opt.cmd = CommandLine{np, sets, std::nullopt, include_dirs, {}};
    for (auto& d : default_search_path()) opt.cmd.search_path.push_back(d);
    opt.machine_path = machine_path;
    opt.cost_spec = cost_spec;
    std::string errors;
    auto f = sched::largest_microbatch(model, strategy, opt, *b, &errors);
    if (!f) {
      std::cerr << errors;
      return kInvalid;
    }
    if (f->samples == 0)
      fmt::print("{}: not even one sample per microbatch fits {}: it needs {} on the fullest rank\n", strategy,
                 human_bytes(*b), human_bytes(double(f->next_peak)));
    else
      fmt::print("{}: the largest microbatch that fits {} is {} sample{} (peak {} on the fullest rank); {} would need {}\n",
                 strategy, human_bytes(*b), f->samples, f->samples == 1 ? "" : "s", human_bytes(double(f->peak)),
                 f->samples + 1, human_bytes(double(f->next_peak)));
    return kOk;
  }
  try {
    SourceManager sources;
    DiagnosticEngine diags(sources);
    sched::PlanOptions opt;
    opt.cmd = CommandLine{np, sets, batch, include_dirs, {}};
    for (auto& d : default_search_path()) opt.cmd.search_path.push_back(d);
    opt.machine_path = machine_path;
    opt.cost_spec = cost_spec;
    opt.verify_each = verify_each;
    if (!print_after.empty())
      opt.after_pass = [&](const char* pass, const ir::Graph& g) {
        if (print_after == pass) std::cerr << "# after " << pass << "\n" << ir::emit_dag_text(g);
      };
    if (simulate && !budget_text.empty()) {
      auto b = parse_size(budget_text);
      if (!b) {
        fmt::print(stderr, "piper-check: error: --memory-budget: '{}' is not a size like 80GiB\n", budget_text);
        return kUsage;
      }
      opt.memory_budget = *b;
    }
    sched::PlanResult r = sched::compile_plan(model, strategy, opt, sources, diags);
    if (verify) {
      if (r.status == sched::PlanStatus::IoError) {
        fmt::print(stderr, "piper-check: error: {}\n", r.io_error);
        return kUsage;
      }
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
    const sched::Plan& plan = *r.plan;
    std::string text = mode->emit(plan);
    if (emit == "report") text = fmt::format("{}: ok\n{}", strategy, text);
    if (simulate) {
      bool over = false;
      const char* priced = plan.costs.is_unit()          ? ""
                           : plan.costs.measured(plan.dag) ? "; every chunk from measured region times"
                                                           : "; chunks by FLOPs where the file has no region times";
      text += fmt::format("simulated step ({}{}):\n{}", plan.costs.is_unit() ? "unit costs" : machine_path, priced,
                          sched::simulate_report(plan.dag, plan.schedule, plan.memory, opt.memory_budget.value_or(0),
                                                 plan.costs.is_unit(), &over));
    }
    if (output.empty()) {
      std::cout << text;
    } else {
      std::ofstream out(output);
      if (!(out << text)) {
        fmt::print(stderr, "piper-check: error: cannot write {}\n", output);
        return kUsage;
      }
    }
    return kOk;
  } catch (const InternalError& e) {
    fmt::print(stderr, "piper-check: {}\n", e.what());
    return 3;
  }
}
