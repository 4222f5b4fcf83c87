// Measures this machine for the simulator (`piper-run --profile FILE`): every pipeline region's F, B,
// BI and BW at a few microbatch sizes, the optimizer step per parameter byte, point-to-point and
// all-reduce time per message and per byte, then calibrated inside executed steps — written as a
// machine description the scheduler reads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/model/data.h"
#include "scheduler/plan.h"

namespace piper::runtime {

struct ProfileOptions {
  std::vector<int64_t> samples{1, 2, 4};  // microbatch sizes a straight line is fitted through
  int reps = 5;                           // timed repetitions of each measurement (the median is kept)
  int inflight = 4;                       // microbatches forward before their backwards, as in a pipeline
  int64_t seq_len = 0;                    // tokens per sample; 0: the model's
  std::string optimizer = "adamw";
  int threads = 1;                        // intra-op threads per rank (recorded)
};

// Every rank measures at once, sharing the machine as training will; the figures are averaged over
// ranks. Rank 0 returns the machine description (JSON text), the others an empty string.
std::string profile_machine(const std::string& model_path, Communicator& comm, const ProfileOptions& o);

// Regions measured alone run faster than inside a training step (the executor's threads, the other
// ranks' traffic, caches that a step's other work evicts), and a collective issued by the executor
// (handed to its stream's thread, waited for without spinning) takes longer than a blocking call
// timed alone. Runs `plan` — compiled with `machine_json`, using every rank — for `steps` steps and
// returns, on rank 0, that machine with its "calibration" completed, from the steps after the first
// summed over ranks. Compute: per chunk kind (F, B, U) measured over simulated time, what the cost
// model multiplies the regions' times by. Collectives: the seconds per collective by which the
// measured ones exceed the simulated ones (zero or more), what the cost model adds to each.
// Handoffs (`plan` a pipeline without replicas): the seconds by which a handoff a stage waited for
// delayed it beyond the simulated send (handoffs.h), what the cost model adds to each send.
enum class Calibrate { Compute, Collectives, Handoffs };
std::string calibrate_machine(const std::string& machine_json, const sched::Plan& plan, const std::string& model_path,
                              const TokenData& data, Communicator& comm, int steps, const std::string& described,
                              Calibrate what = Calibrate::Compute);

// The whole protocol of `piper-run --profile`: the profile, then a data-parallel step over every rank
// to calibrate compute, then (two ranks or more) a ZeRO-3 step to calibrate collectives and a 1F1B
// pipeline over every rank to calibrate handoffs (where the model has a pipeline region a rank),
// every rank running the plans priced by rank 0's figures. Rank 0 returns the calibrated machine description,
// the others an empty string.
std::string profile_and_calibrate(const std::string& model_path, const TokenData& data, Communicator& comm,
                                  const ProfileOptions& o);

}  // namespace piper::runtime
