// piper-tune: the fastest plan that fits, searched over the strategy library with the simulator.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "lang/units.h"
#include "scheduler/report.h"
#include "scheduler/tune.h"

using namespace piper;

namespace {
struct TuneArgs {
  std::string model, budget_text, output, report;
  sched::TuneOptions o;
  size_t top = 10;
  bool json = false;
};

// The command line into `a`; an exit status when the run ends here (help, version, a usage error).
std::optional<int> parse(int argc, char** argv, TuneArgs& a) {
  CLI::App app{"piper-tune: search the strategy library for the fastest plan of MODEL on N ranks that fits"};
  app.set_version_flag("--version", std::string("piper-tune ") + PIPER_VERSION);
  sched::TuneOptions& o = a.o;
  int64_t batch = 0;
  std::vector<std::string> include, library;
  bool no_recompute = false;
  app.add_option("MODEL", a.model, "model.pt or a manifest .json")->required();
  app.add_option("--np", o.np, "ranks")->required()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--batch-size", batch, "global batch (samples per step)");
  app.add_option("--memory-budget", a.budget_text, "per-device memory, e.g. 80GiB: plans over it are rejected");
  app.add_option("--machine", o.machine_path, "costs from a machine file (piper-run --profile, machines/*.json)");
  app.add_option("--cost", o.cost_spec, "unit costs instead: F=1,B=2,W=1,comm=0 (the default)");
  app.add_option("--top", a.top, "rows of the table")->capture_default_str();
  app.add_option("-o,--output", a.output, "write the best plan as a .piper file that uses the library");
  app.add_option("--report", a.report, "write the best plan's report, one self-contained HTML page (as piper-check --report)");
  app.add_option("--strategy", library, "search only these library files (repeatable)");
  app.add_option("-I,--include", include, "extra folder for the library and `use`");
  app.add_flag("--json", a.json, "every candidate as JSON on stdout, for scripts");
  app.add_flag("--no-recompute", no_recompute, "do not also try each plan with its blocks' activations recomputed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (batch > 0) o.batch_size = batch;
  o.recompute = !no_recompute;
  if (!a.budget_text.empty()) {
    auto b = parse_size(a.budget_text);
    if (!b) {
      fmt::print(stderr, "piper-tune: error: --memory-budget '{}' is not a size (e.g. 80GiB)\n", a.budget_text);
      return 2;
    }
    o.memory_budget = *b;
  }
  o.library = library;
  o.search_path = include;
  for (auto& d : default_search_path()) o.search_path.push_back(d);
  return std::nullopt;
}

void print_json(const TuneArgs& a, const sched::TuneResult& r) {
  nlohmann::json out = {{"np", a.o.np}, {"unit_costs", r.unit_costs}, {"plans", r.plans()}, {"twins", r.twins},
                        {"ranked", nlohmann::json::array()}, {"rejected", nlohmann::json::array()}};
  for (const auto* list : {&r.ranked, &r.rejected})
    for (const auto& c : *list) {
      nlohmann::json j = {{"plan", c.label()}, {"strategy", c.strategy}, {"params", nlohmann::json::object()}};
      for (const auto& p : c.sets) j["params"][p.name] = p.boolean ? nlohmann::json(p.value != 0) : nlohmann::json(p.value);
      j["recompute"] = c.recompute;
      if (c.rejected.empty()) {
        j["step_time"] = c.step_time;
        j["bubble"] = c.bubble;
        j["peak_bytes"] = c.peak_bytes;
        if (c.model_flops > 0) j["model_tflops_per_device"] = c.tflops_per_device(a.o.np);
        if (c.peak_flops > 0 && c.model_flops > 0) j["mfu"] = c.mfu(a.o.np);
        out["ranked"].push_back(j);
      } else {
        j["rejected"] = c.rejected;
        out["rejected"].push_back(j);
      }
    }
  fmt::print("{}\n", out.dump(1));
}

void print_table(const TuneArgs& a, const sched::TuneResult& r, const Manifest& m, double seconds) {
  const sched::TuneOptions& o = a.o;
  fmt::print("{} plans for {} on {} ranks: {} valid, {} rejected{} ({}); searched in {:.2f} s, {:.0f} plans/min\n",
             r.plans(), a.model, o.np, r.ranked.size(), r.rejected.size(),
             r.twins ? fmt::format(", {} the same as a plainer twin", r.twins) : "", r.unit_costs ? "unit costs" : o.machine_path,
             seconds, seconds > 0 ? 60 * double(r.plans()) / seconds : 0.0);
  if (r.unit_costs)
    fmt::print("unit costs price every microbatch alike whatever its size: pass --machine for a ranking of real plans\n");
  fmt::print("{:>4}  {:<44} {:>12} {:>12} {:>11} {:>6} {:>7} {:>12}\n", "rank", "plan",
             fmt::format("step ({})", r.unit_costs ? "units" : "s"), r.unit_costs ? "" : "tokens/s", r.unit_costs ? "" : "TFLOP/s/dev",
             r.unit_costs ? "" : "MFU", "bubble", "peak/rank");
  const auto& in = m.regions[static_cast<size_t>(m.sequence.front())].input;
  const int64_t seq = in && !in->shape.empty() ? in->shape[0] : 0;
  for (size_t i = 0; i < std::min(a.top, r.ranked.size()); ++i) {
    const auto& c = r.ranked[i];
    std::string tps = !r.unit_costs && o.batch_size && c.step_time > 0 ? fmt::format("{:.0f}", double(*o.batch_size * seq) / c.step_time)
                                                                        : "";
    const std::string tflops = !r.unit_costs && c.model_flops > 0 ? fmt::format("{:.1f}", c.tflops_per_device(o.np)) : "";
    const std::string mfu = !r.unit_costs && c.model_flops > 0 && c.peak_flops > 0 ? fmt::format("{:.1f}%", 100 * c.mfu(o.np)) : "";
    fmt::print("{:>4}  {:<44} {:>12.6g} {:>12} {:>11} {:>6} {:>6.1f}% {:>12}\n", i + 1, c.label(), c.step_time, tps, tflops, mfu,
               100 * c.bubble, human_bytes(double(c.peak_bytes)));
  }
  // The near misses: rejected plans of the library files that also had valid ones, first reasons.
  size_t shown = 0;
  for (const auto& c : r.rejected) {
    if (shown == 5) break;
    if (c.rejected.find("over the budget") == std::string::npos && c.rejected.find("deadlock") == std::string::npos) continue;
    if (shown++ == 0) fmt::print("rejected (near misses):\n");
    fmt::print("      {:<44} {}\n", c.label(), c.rejected);
  }
}
}  // namespace

// --report FILE: the winner compiled again and drawn.
static int write_report(const TuneArgs& a, const sched::Candidate& best, const Manifest& m) {
  std::string errors;
  const auto plan = sched::candidate_plan(best, m, a.o, &errors);
  if (!plan) {  // it compiled in the search: this would be Piper's bug
    fmt::print(stderr, "piper-tune: internal error: the best plan no longer compiles: {}\n", errors);
    return 3;
  }
  sched::ReportContext ctx{best.label(), a.model, a.o.machine_path, a.o.memory_budget.value_or(0), a.o.batch_size.value_or(0)};
  std::ofstream out(a.report);
  if (!(out << sched::emit_report_html(*plan, ctx))) {
    fmt::print(stderr, "piper-tune: error: cannot write {}\n", a.report);
    return 2;
  }
  if (!a.json) fmt::print("wrote {}: the report of {}\n", a.report, best.label());
  return 0;
}

int main(int argc, char** argv) {
  TuneArgs a;
  if (auto rc = parse(argc, argv, a)) return *rc;
  SourceManager sm;
  DiagnosticEngine diags(sm);
  auto loaded = load_model(a.model, sm, diags);
  if (!loaded.manifest) {
    diags.print_all(std::cerr);
    if (!loaded.io_error.empty()) fmt::print(stderr, "piper-tune: error: {}\n", loaded.io_error);
    return loaded.status == FrontendStatus::IoError ? 2 : 1;
  }
  if (isatty(STDERR_FILENO) && !a.json)
    a.o.progress = [](size_t done, size_t total) {
      const size_t w = 40, filled = total ? w * done / total : w;
      fmt::print(stderr, "\r[{}{}] {}/{} plans", std::string(filled, '#'), std::string(w - filled, ' '), done, total);
      if (done == total) fmt::print(stderr, "\n");
    };
  const auto t0 = std::chrono::steady_clock::now();
  const sched::TuneResult r = sched::tune(*loaded.manifest, a.o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) print_json(a, r);
  else print_table(a, r, *loaded.manifest, seconds);
  if (r.ranked.empty()) {
    fmt::print(stderr, "piper-tune: error: no plan is valid{}\n", a.o.memory_budget ? " within the memory budget" : "");
    return 1;
  }
  if (!a.output.empty()) {
    std::ofstream(a.output) << sched::candidate_text(r.ranked.front(), a.model, a.o);
    if (!a.json) fmt::print("wrote {}: {}\n", a.output, r.ranked.front().label());
  }
  return a.report.empty() ? 0 : write_report(a, r.ranked.front(), *loaded.manifest);
}
