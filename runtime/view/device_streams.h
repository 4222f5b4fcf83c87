// A rank's stream programs as a GPU runs them: one device stream per logical stream, and CUDA
// events only where an op needs another stream's op that earlier waits do not already imply.
// Pure data, read from the plan and the rank's view, so it is tested without a GPU.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/view/rank_view.h"

namespace piper::runtime {

struct DeviceStreamPlan {
  struct Step {
    ir::NodeId op = -1;
    std::vector<int32_t> wait;  // events to wait for before the op (cudaStreamWaitEvent)
    int32_t record = -1;        // event to record after it (cudaEventRecord), -1 for none
  };
  std::vector<ir::StreamId> streams;        // device stream k runs logical stream streams[k]
  std::vector<std::vector<Step>> programs;  // per device stream, in the schedule's order
  int32_t events = 0;
  int64_t cross_stream_deps = 0;  // the rank's dependencies between different streams
  int64_t waits = 0;              // the event waits kept for them (implied ones dropped)
};

// Every cross-stream dependency is covered: the consumer's stream waits for the producer, or for a
// later op of the producer's stream, or for an op that itself waited for it (vector clocks over the
// streams, so the waits kept are the transitive reduction in stream order).
DeviceStreamPlan plan_device_streams(const sched::Plan& p, const RankView& v);

}  // namespace piper::runtime
