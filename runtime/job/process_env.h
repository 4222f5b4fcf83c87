// The process-wide settings piper-run makes before anything starts: thread pools sized to the ranks
// that share the node and sleeping when idle, and a heap that keeps what it freed for the next step.
#pragma once
#include <string>

namespace piper::runtime {

// Ranks of this job on this node, from the launcher's environment (1 without one).
int local_ranks();
// This rank's index among them (its GPU), from the launcher's environment (0 without one).
int local_rank();
// Whether a launcher (mpirun, Hydra, Slurm) started this process.
bool started_by_launcher();
// This rank's number from the launcher, before MPI starts (0 without one).
int launcher_rank();
// Whether stdout goes to a terminal a person watches: a launcher gives each rank a pseudo-terminal
// whatever its own output is (mpirun ... > log), so under one this is false.
bool stdout_is_terminal();
// This rank's default intra-op threads: the node's cores divided among its ranks, at least 1.
int default_threads();

// The thread pools of OpenMP (LibTorch's intra-op pool) and OpenBLAS read their environment once,
// when the libraries load, before main. So the first time through, this sets OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS and MKL_NUM_THREADS to `threads` and OMP_WAIT_POLICY=PASSIVE (unless the user
// chose a policy: idle OpenMP threads otherwise spin for milliseconds and take the cores of the
// other ranks), then re-executes the program with the same arguments. Returns when the environment
// is already right, or when re-executing failed (the reason in *why; the run goes on unconfigured).
// Call before MPI or any thread starts: the launcher sees the same process (exec keeps its pid).
void exec_with_thread_env(int threads, char** argv, std::string* why);

// glibc returns freed memory above 128 KiB to the kernel (munmap, heap trimming) and faults it in
// again at the next allocation: with a step's activations freed and reallocated every microbatch,
// that doubled the step time of a small model. Large blocks stay in the heap instead (up to 32 MiB
// each; the heap keeps up to 1 GiB free), as a caching allocator would: RSS stays at the peak. All
// threads share one arena.
void keep_freed_memory();

}  // namespace piper::runtime
