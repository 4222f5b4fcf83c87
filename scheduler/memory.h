// The memory model: what each rank holds over the simulated step, by category — the same categories
// and the same allocations as the executor's (runtime/exec/stage_params, runtime/exec/executor), from the plan's
// facts and the manifest's measured activation memory — and its peak.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "lang/manifest.h"
#include "scheduler/schedule.h"

namespace piper::sched {

// What a tensor's storage is for. The executor tags its allocations with these (the counting
// allocator measures them); the memory model predicts them.
enum class MemCategory : uint8_t { Params, Grads, Optimizer, Activations, Comm, Gather, Other };
inline constexpr int kMemCategories = 7;
const char* mem_category_name(MemCategory c);  // params, grads, optimizer, activations, comm, gather, other
using ByCategory = std::array<int64_t, kMemCategories>;

struct MemoryUse {
  ByCategory resident{};  // held for the whole step: parameters, gradients, optimizer state
  ByCategory at_peak{};   // everything live at the step's fullest moment (resident included)
  int64_t peak = 0;       // the most live at any moment of the step
  int64_t resident_total() const;
  int64_t states() const;  // parameters, gradients and optimizer state at the peak
};

struct MemoryOptions {
  bool adam = true;  // AdamW keeps two moments per optimized element; SGD none
};

// One entry per rank, in rank order.
std::vector<MemoryUse> memory_use(const ir::Graph& g, const Schedule& s, const Manifest& m,
                                  const MemoryOptions& options = {});

// Per schedule class: (time, live bytes beyond what is resident) after each change over the step.
std::vector<std::vector<std::pair<double, int64_t>>> memory_timeline(const ir::Graph& g, const Schedule& s,
                                                                     const Manifest& m, const MemoryOptions& options = {});

}  // namespace piper::sched
