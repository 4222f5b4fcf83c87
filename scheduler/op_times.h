// Chunk times measured in a run (`piper-run --trace`), to simulate a plan on the run's own costs.
#pragma once
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "scheduler/schedule.h"

namespace piper::sched {

// The steps of a trace to read, 1-based and inclusive (the first ones warm caches and allocate).
struct StepRange {
  int first = 1, last = std::numeric_limits<int>::max();
};

// Per op token on a compute stream ("0F3", "2BI1.s1", "0U"), the median of its durations in seconds
// over the steps in `steps` and over the ranks that ran it (one step: that step's own times).
// Nothing, with the reason in *error, for text that is not a trace or holds no compute op there.
std::map<std::string, double> op_times_from_trace(const std::string& trace_json, StepRange steps, std::string* error);
// The same from the file at `path` (an unreadable file: nothing, and why).
std::map<std::string, double> read_op_times(const std::string& path, StepRange steps, std::string* error);

// The plan's own programs timed on `measured` costs: every (class, stream) runs the ops `planned`
// orders, in that order, as the executor does (an overlap window's pieces excepted: the executor
// runs whichever is ready first, and so does this). Scheduling afresh on the new costs could pick
// another order than the one that ran (a backward ready before a forward it followed), and then
// the simulation would not be of the run.
std::optional<Schedule> retime(const ir::Graph& g, const Schedule& planned, const CostModel& measured,
                               DiagnosticEngine& diags);

}  // namespace piper::sched
