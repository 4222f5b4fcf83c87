// piper-run: `mpirun -np N piper-run model.pt strategy.piper` — every rank compiles the same plan and
// executes its own program of it, step after step (thin main over runtime/job).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "lang/paths.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/nccl_communicator.h"
#include "runtime/device/build_info.h"
#include "runtime/device/memory_counter.h"
#include "runtime/exec/executor.h"
#include "runtime/job/process_env.h"
#include "runtime/job/train.h"
#include "runtime/profile/profiler.h"
#include "tools/recipe_options.h"
#include "tools/run_file.h"

using namespace piper;
using namespace piper::runtime;

namespace {
struct RunArgs {
  TrainOptions train;
  std::string profile_path, comm = "mpi", progress = "auto";
};

// The command line into `a`; an exit status when the run ends here (help, version, a usage error).
std::optional<int> parse(int argc, char** argv, RunArgs& a, bool lead) {
  TrainOptions& t = a.train;
  t.data_path = share_dir() + "/data/corpus.txt";
  CLI::App app{"piper-run: train MODEL with STRATEGY; under mpirun, one executor per rank"};
  app.set_version_flag("--version", fmt::format("piper-run {} ({})", PIPER_VERSION, runtime::build_info()));
  int64_t threads = 0;
  std::vector<double> betas;
  app.add_option("MODEL", t.model, "model.pt with its region manifest")->required();
  app.add_option("STRATEGY", t.strategy, "strategy file (.piper); not with --profile");
  app.add_option("--steps", t.steps)->capture_default_str();
  app.add_option("--batch-size", t.batch, "global batch (samples per step, all replicas)")->capture_default_str();
  app.add_option("--seq-len", t.seq_len, "tokens per sample (default and maximum: the model's)");
  app.add_option("--optimizer", t.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}))->capture_default_str();
  add_recipe_options(app, t.lr, t.recipe, betas);
  app.add_option("--seed", t.seed, "data order seed")->capture_default_str();
  app.add_option("--data", t.data_path, "text file (byte tokens) or nanoGPT .bin")->capture_default_str();
  app.add_option("--val-data", t.val_data, "validation text or .bin: forward-only steps through the same plan");
  app.add_option("--eval-every", t.eval_every, "with --val-data: validate after every N steps and the last")
      ->check(CLI::PositiveNumber);
  app.add_option("--eval-batches", t.eval_batches, "global batches per validation (fixed windows)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--set", t.sets, "override a strategy parameter: NAME=VALUE (repeatable)")->allow_extra_args(false);
  app.add_option("-I,--include", t.include, "extra folder for `use \"...\"`")->allow_extra_args(false);
  app.add_option("--metrics", t.metrics_path, "JSON lines, one per step (written by rank 0)");
  app.add_flag("--check-copies", t.check_copies,
               "with `mirror`: after every step, compare each stage's two copies bit for bit (metrics: copy_diff, 0 when equal)");
  app.add_option("--trace", t.trace_path, "Perfetto/Chrome trace of what ran: a track per rank and stream");
  app.add_option("--threads", threads, "intra-op threads per rank (default: cores / ranks on this node)");
  app.add_option("--memory-limit", t.memory_limit,
                 "per-rank limit on tensor memory from the first step on, e.g. 512MiB: an op that needs more fails");
  app.add_option("--profile", a.profile_path,
                 "measure this machine instead of training: each region's F/B/BI/BW, the optimizer, the links; "
                 "writes a machine description for --machine (run it as you will train: same ranks and threads)");
  app.add_option("--machine", t.machine_path, "schedule with the costs of a machine description (from --profile)");
  app.add_option("--checkpoint", t.checkpoint_dir,
                 "write checkpoints under DIR (step-N folders, the previous one removed once the new one is complete)");
  app.add_option("--save-every", t.save_every, "with --checkpoint: every N steps (default: after the last step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--resume", t.resume_dir,
                 "continue from the newest checkpoint under DIR, saved by any strategy for this model, to --steps");
  app.add_flag("--accept-changes", t.accept_changes,
               "with --resume: continue although the optimizer's recipe differs from the checkpoint's (refused otherwise)");
  app.add_option("--op-timeout", t.op_timeout,
                 "seconds an op may run or wait before a watchdog reports every stream and ends the job (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--comm", a.comm, "collectives and messages over mpi, or nccl (through the rank's GPU; "
                 "tensors stay on the CPU unless --device cuda)")
      ->check(CLI::IsMember({"mpi", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", t.device, "where tensors live: cpu, or cuda (the local rank's GPU; needs a LibTorch with "
                 "CUDA, and --comm nccl on more than one rank: docs/runtime.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--save-model", t.save_model, "write the trained model as a TorchScript model.pt with its manifest");
  std::string write_config;
  auto run_file = TomlRunFile::install(app, write_config);
  run_file->find_path(argc, argv);
  app.add_option("--progress", a.progress, "a progress bar between step lines: auto (when stdout is a terminal of "
                 "its own, not under mpirun, whose ranks write to a pseudo-terminal even into a log), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    if (t.strategy.empty() && a.profile_path.empty()) throw CLI::RequiredError("STRATEGY");
    check_recipe(t.optimizer, t.recipe, betas);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0 || !lead) return lead ? app.exit(e) : 0;
    fmt::print(stderr, "piper-run: {}\nRun with --help for more information.\n", run_file->locate(e.what()));
    return 2;
  }
  if (lead && !run_file->write(app, write_config)) {
    fmt::print(stderr, "piper-run: error: --write-config {}: cannot write\n", write_config);
    return 2;
  }
  t.threads = threads > 0 ? static_cast<int>(threads) : default_threads();
  t.progress = a.progress == "on" || (a.progress == "auto" && stdout_is_terminal());
  return std::nullopt;
}

// MPI underneath in any case: it starts the job, carries NCCL's ids and ends the job on a failure.
std::unique_ptr<Communicator> start_comm(int* argc, char*** argv, const std::string& backend) {
  auto comm = make_mpi_communicator(argc, argv);
  if (backend != "nccl") return comm;
  const int rank = comm->rank();
  std::string error;
  try {
    auto api = make_nccl_api(local_rank());
    if (rank == 0) fmt::print(stderr, "piper-run: communication over {}\n", api->describe());
    return make_nccl_communicator(std::move(comm), std::move(api));
  } catch (const std::exception& e) {
    error = e.what();
  }
  fmt::print(stderr, "piper-run: error: --comm nccl on rank {}: {}\n", rank, error);
  if (comm) comm->abort("NCCL could not start");
  std::abort();  // MPI went with the failed communicator: this process ends, and mpirun ends the others
}

int profile(const RunArgs& a, Communicator& comm) {
  set_intra_op_threads(a.train.threads);
  const std::string text = profile_and_calibrate(a.train.model, TokenData(a.train.data_path), comm,
                                                 ProfileOptions{.seq_len = a.train.seq_len, .optimizer = a.train.optimizer,
                                                                .threads = a.train.threads});
  if (comm.rank() != 0) return 0;
  std::ofstream out(a.profile_path);
  if (!(out << text)) {
    fmt::print(stderr, "piper-run: error: {}: cannot write\n", a.profile_path);
    return 1;
  }
  fmt::print("piper-run: wrote {} (use it: --machine {})\n", a.profile_path, a.profile_path);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  RunArgs a;
  if (auto rc = parse(argc, argv, a, launcher_rank() == 0)) return *rc;
  // Before MPI, threads or tensors exist (the order matters): the pools are configured by
  // re-executing, the heap and the memory counter before the first allocation.
  std::string why;
  exec_with_thread_env(a.train.threads, argv, &why);
  if (!why.empty() && launcher_rank() == 0) fmt::print(stderr, "piper-run: warning: {}\n", why);
  keep_freed_memory();
  install_memory_counter();  // every rank measures its own tensors
  auto comm = start_comm(&argc, &argv, a.comm);
  const bool lead = comm->rank() == 0;
  if (a.train.device == "cuda") {
    const char* refused = comm->size() > 1 && a.comm != "nccl"
                              ? "--device cuda on more than one rank needs --comm nccl (MPI would be handed GPU memory)"
                          : !a.profile_path.empty() ? "--profile measures the CPU; not with --device cuda" : nullptr;
    if (refused) {
      if (lead) fmt::print(stderr, "piper-run: error: {}\n", refused);
      return 1;
    }
    a.train.device = fmt::format("cuda:{}", local_rank());
  }
  try {
    return a.profile_path.empty() ? train(a.train, *comm) : profile(a, *comm);
  } catch (const std::exception& e) {
    comm->abort(e.what());
  }
}
