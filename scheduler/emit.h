// What piper-check shows of a schedule: stream programs, PyTorch's schedule CSV, a Perfetto trace,
// an SVG pipeline picture, and the --simulate table.
#pragma once
#include <optional>
#include <string>

#include "ir/graph.h"
#include "scheduler/memory.h"
#include "scheduler/schedule.h"

namespace piper::sched {

// Classes in the order of their first rank, so output reads rank 0 first.
std::vector<size_t> class_order(const Schedule& s);
// The class's fullest rank (ranks of a class differ only by a shard's rounding): the one reports show.
int32_t fullest_rank(const Schedule& s, const std::vector<MemoryUse>& mem, size_t c);

std::string emit_schedule(const ir::Graph& g, const Schedule& s);
std::string emit_torch_csv(const ir::Graph& g, const Schedule& s);
// With the manifest and memory: a counter track of each rank's simulated tensor memory too.
std::string emit_trace(const ir::Graph& g, const Schedule& s, bool unit_costs, const Manifest* m = nullptr,
                       const std::vector<MemoryUse>* memory = nullptr);
std::string emit_svg(const ir::Graph& g, const Schedule& s);

struct RankStats {
  double busy = 0, idle = 0;  // compute-stream time, and the rest of the step
  double bubble() const { return busy + idle > 0 ? idle / (busy + idle) : 0; }
};
std::vector<RankStats> rank_stats(const ir::Graph& g, const Schedule& s);

// The simulated step for scripts: {"step_time", "ranks": [{"rank", "peak_bytes", "busy", "idle", "by_category"}]}.
std::string emit_sim_json(const ir::Graph& g, const Schedule& s, const std::vector<MemoryUse>& mem);

// The --simulate table; `budget` in bytes (0: none). `over_budget` is set when a class exceeds it.
std::string simulate_report(const ir::Graph& g, const Schedule& s, const std::vector<MemoryUse>& mem, double budget,
                            bool unit_costs, bool* over_budget);

}  // namespace piper::sched
