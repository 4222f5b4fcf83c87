// Per-rank peak memory from the simulated timeline: model states under each ZeRO stage, activations
// held per microbatch (or only stage inputs when recomputed), and ZeRO-3's gathered parameters.
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "lang/manifest.h"
#include "scheduler/schedule.h"

namespace piper::sched {

struct MemoryUse {
  int64_t params = 0, grads = 0, optimizer = 0;  // resident for the whole step
  int64_t peak_dynamic = 0;                      // activations + gathered parameters at the worst moment
  int64_t peak() const { return params + grads + optimizer + peak_dynamic; }
};

// One entry per schedule class, from the plan's facts (ir/facts.h) and the manifest's activation shapes.
std::vector<MemoryUse> memory_use(const ir::Graph& g, const Schedule& s, const Manifest& m);

}  // namespace piper::sched
