// Per-rank stream programs and the simulated timeline they were scheduled from.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "lang/diagnostic.h"
#include "scheduler/cost_model.h"

namespace piper::sched {

// Ranks that hold the same stages run the same program (data- and expert-parallel replicas), so
// programs are computed once per class and shared by its ranks.
struct StreamProgram {
  ir::StreamId stream = 0;
  std::vector<ir::NodeId> ops;  // the total order this stream runs
  // Per op: its overlap window, or -1. A window is a run of consecutive ops that are pieces of one
  // `a || b` group's tasks (compute only, never communication, whose order peers must match).
  // Inside it the executor runs whichever piece is ready first: `ops` holds the simulator's guess
  // at that order, the real one depends on how long each all-to-all or receive takes.
  std::vector<int32_t> window;
};

struct ClassProgram {
  std::vector<int32_t> ranks;
  std::vector<StreamProgram> streams;
};

struct Schedule {
  std::vector<ClassProgram> classes;
  std::vector<int32_t> node_class;               // node -> class
  std::vector<double> start, finish;             // simulated, per node
  // Per node: its `||` group where the pair was priced as one interval (unit costs' FB; each member
  // then holds its part of it), else -1. Pictures draw such pairs stacked.
  std::vector<int32_t> paired;
  std::vector<std::vector<ir::NodeId>> waits;    // per node: predecessors on another stream of its class (events)
  // Per node: ops it must also wait for although no edge says so — a just-in-time ZeRO-3 gather
  // waits for the op that precedes its consumer on the compute stream, so it is issued only when
  // that consumer is next (the executor and the deadlock check honour these like edges).
  std::vector<std::vector<ir::NodeId>> issue_after;
  double step_time = 0;
  // `sms` limits: compute seconds added on the slowest class by the multiprocessors its limited
  // communication held while both ran (sm_share_delay); 0 when nothing is limited or priced.
  double sms_delay = 0;
  int32_t class_of_rank(int32_t rank) const;
};

// List-schedules the DAG over every (class, stream), simulating as it goes. Among ready ops of a
// stream it picks the earliest simulated start; ties go to, in turn: communication, then backward
// (B, BI), then forward, then weight gradients (BW, which fill bubbles), then updates; then the
// lower microbatch, the lower stage, the lower node id. Reports a stall (e.g. tasks ordered to
// overlap that depend on each other) as a deadlock, located at the order that asked for the
// overlap, and returns nothing.
std::optional<Schedule> schedule(const ir::Graph& g, const CostModel& costs, DiagnosticEngine& diags);

// One collective's nodes on different rank classes, each set of two or more: the global norm's (one
// per class), a tie's sum at each pipeline coordinate that holds it, a `mirror` stage's sum at each
// of its two copies. Every member blocks until all have called it: the list scheduler starts them at
// the last one's readiness, and the deadlock check waits for all to reach it.
std::vector<std::vector<ir::NodeId>> cross_class_collectives(const ir::Graph& g);

// Per node: the seconds a compute op loses to communication on a stream limited to N of the device's
// `device_sms` multiprocessors (ir::PlanFacts::stream_sms) that ran beside it in `s`; empty when
// there is none (nothing limited, or the machine does not state its multiprocessors).
std::vector<double> sm_share_delay(const ir::Graph& g, const Schedule& s, int64_t device_sms);

// Validation: the simulated time of a forward-only step (ir::forward_only's ops) — each class's
// programs restricted to those ops in their order, each op as long as in the step's timeline.
double forward_only_time(const ir::Graph& g, const Schedule& s);

// The static deadlock check: runs every class's programs with blocking semantics (a send completes
// only when its receive is posted, and vice versa; an op waits for its events). Returns the
// rank × step grid with `<-- ERROR HERE` and the cycle of waits when the programs can hang.
std::optional<std::string> find_deadlock(const ir::Graph& g, const Schedule& s);

}  // namespace piper::sched
