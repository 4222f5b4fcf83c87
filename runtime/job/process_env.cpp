#include "runtime/job/process_env.h"

#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>

namespace piper::runtime {

namespace {
constexpr const char* kMarker = "PIPER_THREAD_ENV";  // set once configured: the re-executed run keeps going

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}
}  // namespace

int local_ranks() {
  // Open MPI, then MPICH/Hydra and Slurm.
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (int n = env_int(name); n > 0) return n;
  return 1;
}

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

namespace {
constexpr const char* kRankVars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
}  // namespace

bool started_by_launcher() {
  return std::any_of(std::begin(kRankVars), std::end(kRankVars), [](const char* n) { return std::getenv(n) != nullptr; });
}

int launcher_rank() {
  for (const char* name : kRankVars)
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) && !started_by_launcher(); }

int default_threads() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_ranks());
}

void exec_with_thread_env(int threads, char** argv, std::string* why) {
  const std::string want = std::to_string(threads);
  const char* done = std::getenv(kMarker);
  if (done && want == done) return;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) setenv(name, want.c_str(), 1);
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  setenv(kMarker, want.c_str(), 1);
  execv("/proc/self/exe", argv);
  if (why) *why = fmt::format("could not re-execute to configure the thread pools: {}", std::strerror(errno));
}

void keep_freed_memory() {
  // Setting them also switches off glibc's dynamic threshold, which would otherwise move.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // One arena for every thread: a stream thread's own arena grows in 64 MiB heaps whose pages fault
  // in as it grows, and memory freed by another stream's thread goes back to the arena it came
  // from. Measured on the small GPT, one rank, batch 16: 5.4k → 6.1k tokens/s. Allocations are few
  // per op, so the shared lock costs nothing measurable.
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace piper::runtime
