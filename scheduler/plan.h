// The plan compiler: model + strategy + settings -> the one plan every tool reads (checked strategy,
// DAG with its facts, schedule, costs, memory, hash), or located errors. LibTorch-free.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/lower.h"
#include "lang/frontend.h"
#include "lang/manifest.h"
#include "lang/strategy.h"
#include "scheduler/cost_model.h"
#include "scheduler/memory.h"
#include "scheduler/schedule.h"

namespace piper::sched {

struct PlanOptions {
  CommandLine cmd;                      // --np, --set, --batch-size, search path
  std::string machine_path;             // costs from a machine description; empty: unit costs
  std::string machine_text;             // the description itself, instead of reading machine_path (the profiler's)
  std::string cost_spec;                // unit costs, F=1,B=2,W=1,comm=0 (when no machine)
  // Chunk times measured in a run, by op token (piper-check --op-times): they replace the costs of
  // the chunks they name, so the simulation runs on that run's compute (op_times.h).
  std::map<std::string, double> measured_ops;
  std::optional<double> memory_budget;  // bytes per device; exceeding it is an error at the directive that decides
  bool verify_each = false;             // the DAG verifier after every lowering pass
  std::string optimizer = "adamw";      // what the executor will step (its state is part of memory)
  bool global_norm = false;             // gradients clipped by their global norm (its all-reduce is in the plan)
  std::function<void(const char* pass, const ir::Graph&)> after_pass;  // --print-after
  size_t max_nodes = ir::kMaxDagNodes;  // a larger plan is refused (benchmarks lift it)
  // The host of each rank (the launcher's, or piper-check --hosts); empty: the machine file's
  // ranks_per_host fills hosts in rank order, or, without one, every rank is on one host.
  std::vector<int32_t> host_of;
};

// Ranks 0..world-1 on hosts of `per_host` ranks each, in order (how mpirun fills a hostfile's slots).
std::vector<int32_t> hosts_in_order(int64_t world, int64_t per_host);

struct Plan {
  Manifest manifest;
  CheckedStrategy strategy;  // for reports and --emit ast; everything downstream reads dag.facts
  ir::Graph dag;
  Schedule schedule;
  CostModel costs;
  std::vector<MemoryUse> memory;  // per rank
  uint64_t hash = 0;              // of every rank's programs and the facts: ranks compare it before step 1

  int64_t samples_per_microbatch() const { return dag.facts.samples_per_microbatch; }
};

// Where the time went, for benches.
struct PlanTimings {
  double check_s = 0, lower_s = 0, schedule_s = 0;
};

enum class PlanStatus { Ok, Invalid, IoError };

struct PlanResult {
  PlanStatus status = PlanStatus::Ok;
  std::string io_error;             // IoError: what could not be read (a file, an option's value)
  std::optional<Manifest> manifest;  // as far as it got
  std::optional<CheckedStrategy> strategy;  // until a plan is made; then plan->strategy
  std::optional<Plan> plan;         // Ok only
  PlanTimings timings;
};

// Reads MODEL (manifest .json or model.pt) and STRATEGY, and compiles them.
PlanResult compile_plan(const std::string& model_path, const std::string& strategy_path, const PlanOptions& options,
                        SourceManager& sources, DiagnosticEngine& diags);
// The same for strategy text already in `sources` against a parsed manifest (tests, benches, the fuzzer).
PlanResult compile_plan(FileId strategy, const Manifest& manifest, const PlanOptions& options, SourceManager& sources,
                        DiagnosticEngine& diags);

// The rendered diagnostics (and an I/O error) of a failed compilation, for tools that print one message.
std::string render_errors(const PlanResult& r, const DiagnosticEngine& diags);

// The most samples per microbatch whose plan's fullest rank stays within `budget` bytes (the global
// batch follows: samples × replicas × microbatches), searched up to `limit`; 0 when not even one
// sample fits; nothing (and the rendered errors) when the plan does not compile.
struct Fit {
  int64_t samples = 0;      // the largest that fits
  int64_t peak = 0;         // its predicted peak (fullest rank)
  int64_t next_peak = 0;    // the peak one sample more would need
};
std::optional<Fit> largest_microbatch(const std::string& model_path, const std::string& strategy_path,
                                      PlanOptions options, double budget, std::string* errors, int64_t limit = 4096);

// Compiles, or returns nothing with the rendered errors in `errors` (piper-run, tests, benches).
std::optional<Plan> compile_plan(const std::string& model_path, const std::string& strategy_path,
                                 const PlanOptions& options, std::string* errors);

}  // namespace piper::sched
