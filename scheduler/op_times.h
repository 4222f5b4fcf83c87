// Chunk times measured in a run (`piper-run --trace`), to simulate a plan on the run's own costs.
#pragma once
#include <map>
#include <string>

namespace piper::sched {

// Per op token on a compute stream ("0F3", "2BI1.s1", "0U"), the median of its durations in seconds
// over the steps from `first_step` on (1-based; the earlier ones warm caches and allocate) and over
// the ranks that ran it. Nothing, with the reason in *error, for text that is not a trace or holds
// no compute op at those steps.
std::map<std::string, double> op_times_from_trace(const std::string& trace_json, int first_step, std::string* error);
// The same from the file at `path` (an unreadable file: nothing, and why).
std::map<std::string, double> read_op_times(const std::string& path, int first_step, std::string* error);

}  // namespace piper::sched
