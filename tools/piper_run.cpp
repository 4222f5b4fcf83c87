// piper-run: `mpirun -np N piper-run model.pt strategy.piper` — every rank compiles the same plan and
// executes its own program of it, step after step (thin main over runtime/).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "lang/paths.h"
#include "lang/units.h"
#include "runtime/executor.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"
#include "runtime/process_env.h"
#include "runtime/profiler.h"
#include "scheduler/plan.h"

using namespace piper;
using namespace piper::runtime;

namespace {
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Rank 0 collects every rank's spans into one Perfetto/Chrome trace: a process per rank, a thread
// per stream, on one time axis. Each rank times its ops on its own steady clock. Ranks on one host
// share that clock (CLOCK_MONOTONIC), so their times are used as they are. Across hosts, every rank
// reads its clock after a barrier, an instant common to all to within the barrier's exit skew (the
// MPI progress thread's sleep: up to a millisecond), and times are taken from there. Either way the
// earliest op of any rank starts at 0.
void write_trace(Communicator& comm, const std::vector<std::pair<int64_t, StepResult>>& steps, const std::string& path) {
  const size_t world = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  std::vector<int> everyone(world);
  for (size_t r = 0; r < world; ++r) everyone[r] = static_cast<int>(r);
  comm.prepare_group(everyone, 3);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const size_t h = std::hash<std::string>{}(host);
  // Per rank: its host (two exact halves), its clock after the barrier, its first op's start.
  std::vector<double> facts(4 * world, 0.0);
  double sync = 0;
  comm.all_reduce_sum(&sync, 1, everyone, 3);
  comm.all_reduce_sum(&sync, 1, everyone, 3);  // the second starts with the ranks together
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  double first = now;
  for (const auto& [step, r] : steps) first = std::min(first, r.ops_began);
  facts[4 * me] = static_cast<double>(h >> 32);
  facts[4 * me + 1] = static_cast<double>(h & 0xffffffffu);
  facts[4 * me + 2] = now;
  facts[4 * me + 3] = first;
  comm.all_reduce_sum(facts.data(), facts.size(), everyone, 3);
  bool one_host = true;
  for (size_t r = 1; r < world; ++r) one_host &= facts[4 * r] == facts[0] && facts[4 * r + 1] == facts[1];
  double shift = 0;  // added to this rank's clock: the common axis
  if (!one_host) shift = facts[2] - now;  // rank 0's reading of the barrier's instant
  double origin = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < world; ++r) origin = std::min(origin, facts[4 * r + 3] + (one_host ? 0 : facts[2] - facts[4 * r + 2]));
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [step, r] : steps) {
    const double offset = r.ops_began + shift - origin;
    for (const auto& op : r.ops) {
      events.push_back({{"name", op.token}, {"ph", "X"}, {"pid", comm.rank()}, {"tid", op.stream},
                        {"ts", (offset + op.start) * 1e6}, {"dur", (op.end - op.start) * 1e6}, {"args", {{"step", step + 1}}}});
      // A counter track: the rank's tensor memory after each op.
      events.push_back({{"name", "tensor memory"}, {"ph", "C"}, {"pid", comm.rank()}, {"ts", (offset + op.end) * 1e6},
                        {"args", {{"MiB", double(op.live_bytes) / (1 << 20)}}}});
    }
  }
  std::string mine = events.dump();
  const int kLenTag = 1 << 30, kDataTag = (1 << 30) + 1;
  if (comm.rank() != 0) {
    uint64_t n = mine.size();
    comm.send(&n, sizeof n, 0, kLenTag);
    comm.send(mine.data(), mine.size(), 0, kDataTag);
    return;
  }
  nlohmann::json all = nlohmann::json::array();
  auto add = [&](const nlohmann::json& evs, int rank) {
    all.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
    for (const auto& e : evs) all.push_back(e);
  };
  add(events, 0);
  for (int r = 1; r < comm.size(); ++r) {
    uint64_t n = 0;
    comm.recv(&n, sizeof n, r, kLenTag);
    std::string text(n, '\0');
    comm.recv(text.data(), n, r, kDataTag);
    add(nlohmann::json::parse(text), r);
  }
  std::ofstream(path) << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

// Every rank's peak tensor bytes of the step, and its bytes by category at that moment (rank order).
struct StepMemory {
  std::vector<int64_t> peak;                                // per rank
  std::vector<std::array<int64_t, kMemCategories>> at_peak;  // per rank
};
StepMemory gather_memory(Communicator& comm, const MemoryStats& mine) {
  const size_t w = static_cast<size_t>(comm.size()), row = 1 + kMemCategories;
  std::vector<double> all(w * row, 0.0);
  const size_t me = static_cast<size_t>(comm.rank()) * row;
  all[me] = static_cast<double>(mine.peak);
  for (int c = 0; c < kMemCategories; ++c) all[me + 1 + static_cast<size_t>(c)] = static_cast<double>(mine.at_peak[static_cast<size_t>(c)]);
  std::vector<int> everyone(w);
  for (size_t r = 0; r < w; ++r) everyone[r] = static_cast<int>(r);
  comm.all_reduce_sum(all.data(), all.size(), everyone, 3);
  StepMemory out;
  for (size_t r = 0; r < w; ++r) {
    out.peak.push_back(static_cast<int64_t>(all[r * row]));
    std::array<int64_t, kMemCategories> cats{};
    for (size_t c = 0; c < static_cast<size_t>(kMemCategories); ++c) cats[c] = static_cast<int64_t>(all[r * row + 1 + c]);
    out.at_peak.push_back(cats);
  }
  return out;
}
}  // namespace

// This rank's number from the launcher, before MPI starts (rank 0 prints usage errors).
bool launcher_lead() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v) == 0;
  return true;
}

int main(int argc, char** argv) {
  bool lead = launcher_lead();
  CLI::App app{"piper-run: train MODEL with STRATEGY; under mpirun, one executor per rank"};
  app.set_version_flag("--version", std::string("piper-run ") + PIPER_VERSION);
  std::string model, strategy, data_path = share_dir() + "/data/corpus.txt", metrics_path, trace_path;
  std::string comm_backend = "mpi", device = "cpu";
  std::string optimizer = "adamw", memory_limit, profile_path, machine_path, checkpoint_dir, resume_dir, save_model;
  int64_t save_every = 0;
  double op_timeout = 300;
  int64_t steps = 20, batch = 8, seq_len = 0, threads = 0;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::vector<std::string> sets, include;
  app.add_option("MODEL", model, "model.pt with its region manifest")->required();
  app.add_option("STRATEGY", strategy, "strategy file (.piper); not with --profile");
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--batch-size", batch, "global batch (samples per step, all replicas)")->capture_default_str();
  app.add_option("--seq-len", seq_len, "tokens per sample (default and maximum: the model's)");
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--optimizer", optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}))->capture_default_str();
  app.add_option("--seed", seed, "data order seed")->capture_default_str();
  app.add_option("--data", data_path, "text file (byte tokens) or nanoGPT .bin")->capture_default_str();
  app.add_option("--set", sets, "override a strategy parameter: NAME=VALUE (repeatable)")->allow_extra_args(false);
  app.add_option("-I,--include", include, "extra folder for `use \"...\"`")->allow_extra_args(false);
  app.add_option("--metrics", metrics_path, "JSON lines, one per step (written by rank 0)");
  app.add_option("--trace", trace_path, "Perfetto/Chrome trace of what ran: a track per rank and stream");
  app.add_option("--threads", threads, "intra-op threads per rank (default: cores / ranks on this node)");
  app.add_option("--memory-limit", memory_limit,
                 "per-rank limit on tensor memory from the first step on, e.g. 512MiB: an op that needs more fails");
  app.add_option("--profile", profile_path,
                 "measure this machine instead of training: each region's F/B/BI/BW, the optimizer, the links; "
                 "writes a machine description for --machine (run it as you will train: same ranks and threads)");
  app.add_option("--machine", machine_path, "schedule with the costs of a machine description (from --profile)");
  app.add_option("--checkpoint", checkpoint_dir,
                 "write checkpoints under DIR (step-N folders, the previous one removed once the new one is complete)");
  app.add_option("--save-every", save_every, "with --checkpoint: every N steps (default: after the last step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--resume", resume_dir,
                 "continue from the newest checkpoint under DIR, saved by any strategy for this model, to --steps");
  app.add_option("--op-timeout", op_timeout,
                 "seconds an op may run or wait before a watchdog reports every stream and ends the job (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--comm", comm_backend, "collectives and messages over mpi, or nccl (through the rank's GPU; "
                 "tensors stay on the CPU unless --device cuda)")
      ->check(CLI::IsMember({"mpi", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", device, "where tensors live: cpu, or cuda (the local rank's GPU; needs a LibTorch with "
                 "CUDA, and --comm nccl on more than one rank: docs/runtime.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--save-model", save_model, "write the trained model as a TorchScript model.pt with its manifest");
  try {
    app.parse(argc, argv);
    if (strategy.empty() && profile_path.empty()) throw CLI::RequiredError("STRATEGY");
  } catch (const CLI::ParseError& e) {
    int rc = lead ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
    return rc == 0 ? 0 : 2;
  }
  // Before MPI, threads or tensors exist (the order matters): the pools are configured by
  // re-executing, the heap and the memory counter before the first allocation.
  const int t = threads > 0 ? static_cast<int>(threads) : default_threads();
  std::string why;
  exec_with_thread_env(t, argv, &why);
  if (!why.empty() && lead) fmt::print(stderr, "piper-run: warning: {}\n", why);
  keep_freed_memory();
  install_memory_counter();  // every rank measures its own tensors
  auto comm = make_mpi_communicator(&argc, &argv);
  lead = comm->rank() == 0;
  auto fail = [&](const std::string& msg) {
    if (lead) fmt::print(stderr, "{}{}", msg, msg.ends_with('\n') ? "" : "\n");
    return 1;
  };
  if (device == "cuda") {
    if (comm->size() > 1 && comm_backend != "nccl")
      return fail("piper-run: error: --device cuda on more than one rank needs --comm nccl (MPI would be handed GPU "
                  "memory)");
    if (!profile_path.empty()) return fail("piper-run: error: --profile measures the CPU; not with --device cuda");
    device = fmt::format("cuda:{}", local_rank());
  }
  if (comm_backend == "nccl") {
    // MPI stays underneath: it starts the job, carries the NCCL ids and ends the job on a failure.
    try {
      auto api = make_nccl_api(local_rank());
      if (lead) fmt::print(stderr, "piper-run: communication over {}\n", api->describe());
      comm = make_nccl_communicator(std::move(comm), std::move(api));
    } catch (const std::exception& e) {
      fmt::print(stderr, "piper-run: error: --comm nccl on rank {}: {}\n", comm->rank(), e.what());
      comm->abort("NCCL could not start");
    }
  }

  if (!profile_path.empty()) {
    try {
      set_intra_op_threads(t);
      const std::string text = profile_machine(model, *comm, ProfileOptions{.seq_len = seq_len, .optimizer = optimizer, .threads = t});
      // Calibration: a data-parallel step on every rank, 4 microbatches of 2 samples each, priced by
      // what was just measured and then run.
      const std::string tmp_strategy = fmt::format("{}.rank{}.tmp.piper", profile_path, comm->rank());
      if (lead) std::ofstream(profile_path + ".rank0.tmp") << text;
      std::ofstream(tmp_strategy) << fmt::format("mesh dp = {};\nsplit batch into 4;\nreplicate * over dp;\n", comm->size());
      std::vector<int> everyone(static_cast<size_t>(comm->size()));
      for (int r = 0; r < comm->size(); ++r) everyone[static_cast<size_t>(r)] = r;
      comm->prepare_group(everyone, 3);
      double sync = 0;
      comm->all_reduce_sum(&sync, 1, everyone, 3);  // rank 0's file is written
      sched::PlanOptions popt;
      popt.cmd.np = comm->size();
      popt.cmd.batch_size = 8 * comm->size();
      popt.machine_path = profile_path + ".rank0.tmp";
      std::string errors;
      auto cal = sched::compile_plan(model, tmp_strategy, popt, &errors);
      if (!cal) throw std::runtime_error("calibration plan: " + errors);
      TokenData data(data_path);
      std::string calibrated = calibrate_machine(text, *cal, model, data, *comm, 4,
                                                 fmt::format("dp over {} ranks, 4 microbatches of 2 samples", comm->size()));
      comm->all_reduce_sum(&sync, 1, everyone, 3);  // everyone has read rank 0's file
      if (comm->size() >= 2) {
        // Then the collectives as the executor issues them: ZeRO-3 gathers and reduce-scatters every
        // layer of every microbatch, priced by the machine calibrated so far.
        if (lead) std::ofstream(popt.machine_path) << calibrated;
        std::ofstream(tmp_strategy) << fmt::format("mesh dp = {};\nsplit batch into 4;\nreplicate * over dp zero 3 prefetch 0;\n",
                                                   comm->size());
        comm->all_reduce_sum(&sync, 1, everyone, 3);  // rank 0's file is written
        auto zero3 = sched::compile_plan(model, tmp_strategy, popt, &errors);
        if (!zero3) throw std::runtime_error("calibration plan: " + errors);
        calibrated = calibrate_machine(calibrated, *zero3, model, data, *comm, 4,
                                       fmt::format("ZeRO-3 over {} ranks, 4 microbatches of 2 samples", comm->size()),
                                       Calibrate::Collectives);
        comm->all_reduce_sum(&sync, 1, everyone, 3);  // everyone has read it
      }
      std::remove(tmp_strategy.c_str());
      if (lead) {
        std::remove(popt.machine_path.c_str());
        std::ofstream out(profile_path);
        if (!(out << calibrated)) return fail(fmt::format("piper-run: error: {}: cannot write", profile_path));
        fmt::print("piper-run: wrote {} (use it: --machine {})\n", profile_path, profile_path);
      }
      return 0;
    } catch (const std::exception& e) {
      comm->abort(e.what());
    }
  }
  // Every rank compiles the same plan from the same inputs; a mismatch is refused below.
  sched::PlanOptions opt;
  opt.machine_path = machine_path;
  opt.cmd.np = comm->size();
  opt.cmd.sets = sets;
  opt.cmd.batch_size = batch;
  opt.cmd.search_path = include;
  for (auto& d : default_search_path()) opt.cmd.search_path.push_back(d);
  std::string errors;
  auto plan = sched::compile_plan(model, strategy, opt, &errors);
  if (!plan) return fail(errors);
  auto missing = Executor::unsupported(*plan);
  if (!missing.empty())
    return fail(fmt::format("piper-run: error: {} uses what the runtime does not execute yet: {} (piper-check can still "
                            "check and simulate it)",
                            strategy, fmt::format("{}", fmt::join(missing, ", "))));
  {
    // Compare plan hashes: each rank fills its slot, a sum shows everyone's.
    std::vector<double> h(static_cast<size_t>(comm->size()) * 2, 0.0);
    h[static_cast<size_t>(comm->rank()) * 2] = static_cast<double>(plan->hash >> 32);
    h[static_cast<size_t>(comm->rank()) * 2 + 1] = static_cast<double>(plan->hash & 0xffffffffu);
    std::vector<int> everyone(static_cast<size_t>(comm->size()));
    for (int r = 0; r < comm->size(); ++r) everyone[static_cast<size_t>(r)] = r;
    comm->prepare_group(everyone, 3);
    comm->all_reduce_sum(h.data(), h.size(), everyone, 3);
    for (int r = 1; r < comm->size(); ++r)
      if (h[static_cast<size_t>(r) * 2] != h[0] || h[static_cast<size_t>(r) * 2 + 1] != h[1])
        return fail(fmt::format("piper-run: error: rank {} compiled a different plan than rank 0 (different files or "
                                "--set on different ranks?); refusing to start",
                                r));
  }
  std::optional<double> limit;
  if (!memory_limit.empty() && !(limit = parse_size(memory_limit)))
    return fail(fmt::format("piper-run: error: --memory-limit: '{}' is not a size like 512MiB", memory_limit));
  try {
    TokenData data(data_path);
    set_intra_op_threads(t);
    Executor ex(*plan, model, data, *comm, ExecutorOptions{batch, lr, optimizer, seed, seq_len, op_timeout, device});
    int64_t seq = seq_len > 0 ? seq_len : plan->manifest.regions[static_cast<size_t>(plan->manifest.sequence.front())].input->shape[0];
    if (lead)
      fmt::print("piper-run: {} ranks, {} stages, {} microbatches of {} samples, {} threads per rank\n", comm->size(),
                 plan->dag.facts.stages.size(), plan->dag.facts.microbatches, plan->samples_per_microbatch(), t);
    std::ofstream metrics;
    if (lead && !metrics_path.empty()) metrics.open(metrics_path);
    int64_t first = 0;
    if (!resume_dir.empty()) {
      std::string note;
      first = ex.load_checkpoint(resume_dir, &note);
      if (lead) fmt::print("piper-run: {}\n", note);
    }
    if (limit) set_memory_limit(comm->rank(), static_cast<int64_t>(*limit));
    const bool tty = isatty(1);
    std::vector<std::pair<int64_t, StepResult>> spans;
    for (int64_t s = first; s < steps; ++s) {
      StepResult r = ex.step(s);
      double tps = double(batch * seq) / r.seconds;
      const StepMemory mem = gather_memory(*comm, r.memory);
      const size_t fullest = static_cast<size_t>(std::max_element(mem.peak.begin(), mem.peak.end()) - mem.peak.begin());
      if (lead) {
        if (tty) fmt::print("\r\033[K");  // replace the progress bar with the step's line
        fmt::print("step {:>4}/{}  loss {:.6f}  {:>8.0f} tokens/s  {:.3f} s  tensors {} (rank {})  rss {}\n", s + 1, steps,
                   r.loss, tps, r.seconds, human_bytes(double(mem.peak[fullest])), fullest,
                   human_bytes(double(peak_rss_bytes())));
        if (tty && s + 1 < steps) {
          int done = static_cast<int>(40 * (s + 1) / steps);
          fmt::print("[{}{}] {}/{}", std::string(static_cast<size_t>(done), '#'), std::string(static_cast<size_t>(40 - done), '.'),
                     s + 1, steps);
        }
        std::fflush(stdout);
        if (metrics.is_open()) {
          nlohmann::json by_category;
          for (int c = 0; c < kMemCategories; ++c)
            by_category[mem_category_name(static_cast<MemCategory>(c))] = mem.at_peak[fullest][static_cast<size_t>(c)];
          metrics << fmt::format("{{\"step\":{},\"loss\":{:.9g},\"tokens_per_s\":{:.1f},\"step_s\":{:.6f},"
                                 "\"peak_mem_bytes\":{},\"peak_tensor_bytes\":{},\"peak_tensor_bytes_by_rank\":[{}],"
                                 "\"peak_tensor_bytes_by_category\":{}}}\n",
                                 s + 1, r.loss, tps, r.seconds, peak_rss_bytes(), mem.peak[fullest], fmt::join(mem.peak, ","),
                                 by_category.dump())
                  << std::flush;
        }
      }
      if (!trace_path.empty()) spans.emplace_back(s, std::move(r));
      if (!checkpoint_dir.empty() && ((save_every > 0 && (s + 1) % save_every == 0) || s + 1 == steps)) {
        const std::string at = ex.save_checkpoint(checkpoint_dir, s + 1, strategy);
        if (lead) fmt::print("piper-run: checkpoint {}\n", at);
      }
    }
    if (!save_model.empty()) {
      ex.save_model(save_model);
      if (lead) fmt::print("piper-run: wrote the trained model to {}\n", save_model);
    }
    if (!trace_path.empty()) write_trace(*comm, spans, trace_path);
    auto [sum, sumsq] = ex.param_checksum();
    if (lead && metrics.is_open())
      metrics << fmt::format("{{\"final_param_sum\":{:.12g},\"final_param_sumsq\":{:.12g}}}\n", sum, sumsq);
    return 0;
  } catch (const std::exception& e) {
    comm->abort(e.what());
  }
}
