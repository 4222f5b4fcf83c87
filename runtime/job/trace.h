// `piper-run --trace`: every rank's executed ops as one Perfetto/Chrome trace, on one time axis.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/exec/executor.h"

namespace piper::runtime {

// Collective over every rank: rank 0 gathers the steps' spans and writes `path` (a process per rank,
// a thread per stream, a counter track of tensor memory).
void write_trace(Communicator& comm, const std::vector<std::pair<int64_t, StepResult>>& steps, const std::string& path);

}  // namespace piper::runtime
