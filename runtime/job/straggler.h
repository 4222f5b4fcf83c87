// Which host computes slower than the plan says: each rank's compute time per step against the schedule's.
#pragma once
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace piper::sched {
struct Plan;
}

namespace piper::runtime {

// Each rank's planned compute per step (the simulated durations of its chunks: F, B, W, U), seconds.
std::vector<double> planned_compute(const sched::Plan& plan, int world);

// A host is a straggler when its ranks' compute takes `threshold` times longer, against the plan,
// than the other hosts' do: its ranks' compute over the last `window` steps (one noisy step is not a
// straggler) divided by the plan's for them (which cancels stages that differ).
// It is told when it starts and when it ends (below half the threshold), not every step; one host,
// or a plan without compute, tells nothing.
class StragglerWatch {
 public:
  StragglerWatch(std::vector<double> planned, HostMap hosts, double threshold = 1.5, size_t window = 8);
  // The line to print after a step with these compute seconds per rank ("" when nothing changed).
  std::string step(const std::vector<double>& compute_by_rank);

 private:
  std::vector<double> planned_;
  HostMap hosts_;
  double threshold_;
  size_t window_;
  std::vector<std::vector<double>> recent_;  // per rank, the last `window` steps' compute seconds
  int slow_ = -1;  // the host last told to be slow
};

}  // namespace piper::runtime
