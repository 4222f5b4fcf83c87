// How much longer a pipeline handoff keeps a waiting stage than the simulator's link says: the
// point-to-point calibration of `piper-run --profile`, from executed steps.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/exec/executor.h"
#include "scheduler/plan.h"

namespace piper::runtime {

struct HandoffWaits {
  double excess = 0;  // seconds, summed: measured delay minus the simulated send's duration
  int64_t count = 0;  // handoffs a compute stream waited for
};

// Collective over every rank (each node of `plan` runs on one rank: a pipeline without replicas);
// `steps` are this rank's executed steps of `plan`. A handoff counts where the compute stream
// waited for it (the receive ended after the stream's previous op): its delay runs from the later of
// the send's start and that previous op's end to the consumer's start, so it holds the transfer,
// the progress thread's noticing and the consumer's wake-up, all of which a waiting stage pays and
// the simulator's link (latency + bytes / bandwidth, charged to the send) does not price. Returned
// summed over ranks, on every rank.
HandoffWaits handoff_waits(const sched::Plan& plan, const std::vector<StepResult>& steps, Communicator& comm);

}  // namespace piper::runtime
