// The training job `piper-run MODEL STRATEGY` runs on each rank: the plan compiled and compared
// across ranks, the executor stepped, each step reported, checkpoints, the trained model, the trace.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/exec/recipe.h"

namespace piper::runtime {

struct TrainOptions {
  std::string model, strategy, data_path;
  std::string val_data;            // validation windows (--val-data); "" none
  int64_t eval_every = 0, eval_batches = 8;
  std::vector<std::string> sets, include;  // --set NAME=VALUE, -I folders
  int64_t steps = 20, batch = 8, seq_len = 0;
  double lr = 1e-3;                // the peak learning rate
  Recipe recipe;                   // schedule, betas, eps, weight decay
  std::string optimizer = "adamw";
  uint64_t seed = 0;
  int threads = 1;                 // intra-op threads per rank (already configured)
  std::string machine_path;        // schedule with these costs
  std::string memory_limit;        // "512MiB": an op that needs more fails
  double op_timeout = 300;
  std::string device = "cpu";      // or cuda:N
  std::string metrics_path, trace_path, checkpoint_dir, resume_dir, save_model;
  int64_t save_every = 0;
  bool progress = false;           // a progress bar between rank 0's step lines (a terminal of its own)
  bool accept_changes = false;     // --resume may change the optimizer's recipe (said, not refused)
  bool check_copies = false;       // `mirror`: compare each stage's two copies after every step (metrics copy_diff)
};

// Runs the job on this rank. Returns the exit status of an error every rank saw alike (rank 0 prints
// it); a failure on one rank (an op, a file) throws, and the caller aborts the whole job with it.
int train(const TrainOptions& o, Communicator& comm);

}  // namespace piper::runtime
