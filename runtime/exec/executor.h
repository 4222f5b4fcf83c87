// Runs one rank's program of a plan, step after step: a thread per logical stream, events where a
// dependency crosses streams, LibTorch for the chunks and a Communicator for the rest.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/model/data.h"
#include "runtime/device/memory_counter.h"
#include "runtime/exec/recipe.h"
#include "runtime/device/stream_threads.h"
#include "scheduler/plan.h"

namespace piper::runtime {
class CallWatch;  // runtime/device/call_watch.h

struct ExecutorOptions {
  int64_t global_batch = 8;
  double lr = 1e-3;
  std::string optimizer = "adamw";  // adamw | sgd
  uint64_t seed = 0;                // data order
  int64_t seq_len = 0;              // tokens per sample; 0: the model's (at most the model's)
  double op_timeout = 0;            // seconds an op may run or wait before the watchdog ends the job (0: never)
  // Where tensors live: "cpu", or a device with streams ("cuda", "cuda:1"), whose streams then run
  // the rank's logical streams with events between them (runtime/device_queues.h).
  std::string device = "cpu";
  // Tests: a device whose streams and events order the ops while the tensors stay on `device`
  // (a fake's); "" = `device` itself when it is not the CPU.
  std::string stream_device = "";
  Recipe recipe = {};  // the schedule, AdamW's betas and eps, weight decay (lr above is the peak)
};

struct StepResult {
  double loss = 0;     // mean over the global batch (the same number on every rank)
  double lr = 0;       // the learning rate the step was taken with
  double grad_norm = -1;  // the global gradient norm before clipping (-1: the plan measures none)
  double copy_diff = -1;  // --check-copies: Executor::copy_divergence after the step (-1: not checked)
  double val_loss = -1;   // validation after this step (-1: none; the job sets it, see Executor::evaluate)
  double eval_seconds = 0;  // what one validation batch took (the job measures it)
  double seconds = 0;
  std::vector<OpSpan> ops;
  double ops_began = 0;  // steady-clock seconds at which `ops`' times start (this rank's clock)
  MemoryStats memory;  // this rank's tensor storage during the step (when the memory counter is installed)
  int64_t ring_bytes = 0;  // what this rank sent round context parallelism's rings in the step
};

// LibTorch's intra-op threads for this process (ranks sharing cores want 1 each).
void set_intra_op_threads(int n);

class Executor {
 public:
  // Throws std::runtime_error when the plan needs something this runtime does not execute yet.
  Executor(const sched::Plan& plan, const std::string& model_path, const TokenData& data, Communicator& comm,
           ExecutorOptions options);
  ~Executor();
  StepResult step(int64_t step);
  // Validation: the mean loss over `batches` fixed windows of `val` (batch k: the k-th of the run's
  // seed), forward only through the same plan, the model in eval mode; the same on every rank.
  double evaluate(const TokenData& val, int64_t batches);
  // Sum and sum of squares of every model parameter (each counted once across replicas), the same
  // on every rank: compared with the reference trainer's to show the final weights agree.
  std::pair<double, double> param_checksum();
  // `mirror`: each rank's largest difference between a stage's two copies' parameters, summed over
  // every rank (0 only if every pair is bit-identical, as it must be); -1 when the plan has no copies.
  // Every rank calls it.
  double copy_divergence();
  // Checkpoints (runtime/checkpoint.h): every rank calls these. save_checkpoint writes the state
  // after `steps_done` steps under DIR and returns the checkpoint's path; load_checkpoint fills this
  // plan's parameters and optimizer state from the newest checkpoint under DIR, saved by any plan of
  // the same model, and returns its step (`note` says what was loaded). `settings` (JSON text: the
  // run's resolved options) is recorded with the checkpoint and handed back when it is loaded.
  std::string save_checkpoint(const std::string& dir, int64_t steps_done, const std::string& strategy,
                              const std::string& settings = "{}");
  int64_t load_checkpoint(const std::string& dir, std::string* note, std::string* settings = nullptr);
  // Rank 0 writes the trained model as a TorchScript model.pt with its manifest (all ranks call it).
  void save_model(const std::string& path);
  // Where this rank is now, from any thread (its streams, or the watched call between them; "" when
  // none): for a stopped job's report.
  std::string report_now() const;
  // The watchdog of calls every rank makes outside the plan's streams (the job arms it around its own).
  CallWatch& calls();
  // What of the plan this executor cannot run; empty when the plan is supported.
  static std::vector<std::string> unsupported(const sched::Plan& plan);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace piper::runtime
