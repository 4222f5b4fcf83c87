// Measured memory: a counting CPU allocator for LibTorch's tensors — live and peak bytes per rank
// and by category, and an optional per-rank limit past which allocation fails with a clear message.
#pragma once
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "scheduler/memory.h"

namespace piper::runtime {

// What a tensor's storage is for (the memory model's categories); the executor says it around
// each op (the thread's current tag).
using sched::MemCategory;
using sched::kMemCategories;
using sched::mem_category_name;

struct MemoryStats {
  int64_t live = 0, peak = 0;                        // bytes of tensor storage
  std::array<int64_t, kMemCategories> live_by{};     // now
  std::array<int64_t, kMemCategories> at_peak{};     // when the peak was reached
  int64_t allocations = 0;
};

// Installs the counting allocator as LibTorch's CPU allocator (once per process; later calls do nothing).
// Storage allocated before it is installed is not counted.
void install_memory_counter();
bool memory_counter_installed();

// The allocating thread's rank (ranks in one process, as with the fake communicator) and category.
void set_memory_rank(int rank);
int memory_rank();
class MemScope {  // sets the thread's category for its lifetime
 public:
  explicit MemScope(MemCategory c);
  ~MemScope();
  MemScope(const MemScope&) = delete;
  MemScope& operator=(const MemScope&) = delete;

 private:
  MemCategory saved_;
};

MemoryStats memory_stats(int rank);
void reset_memory_peak(int rank);  // the peak restarts from what is live now
// Refuse allocations that would take this rank past `bytes` (0: no limit).
void set_memory_limit(int rank, int64_t bytes);

// What an allocation past the limit throws (through LibTorch, possibly wrapped by the TorchScript
// interpreter; take_out_of_memory() gives back the clean message on the thread that hit it).
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};
std::string take_out_of_memory();  // "" when this thread has not hit the limit since the last call

}  // namespace piper::runtime
