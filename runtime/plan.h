// Compiles model + strategy into the plan every rank executes: checked strategy, DAG, schedule.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "ir/graph.h"
#include "lang/frontend.h"
#include "lang/manifest.h"
#include "lang/strategy.h"
#include "scheduler/schedule.h"

namespace piper::runtime {

struct Plan {
  Manifest manifest;
  CheckedStrategy strategy;
  ir::Graph dag;
  sched::Schedule schedule;
  int64_t samples_per_microbatch = 1;
  uint64_t hash = 0;  // of every rank's programs: ranks compare it before the first step
};

// `errors` receives the rendered diagnostics when the plan cannot be compiled.
std::optional<Plan> compile_plan(const std::string& model, const std::string& strategy, const CommandLine& cmd,
                                 std::string* errors);

}  // namespace piper::runtime
