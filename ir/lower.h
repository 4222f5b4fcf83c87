// Lowers a checked strategy onto the Global Training DAG: the ordered pipeline of graph rewrites.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "lang/diagnostic.h"
#include "lang/manifest.h"
#include "lang/strategy.h"

namespace piper::ir {

struct PassInfo {
  const char* name;
  const char* help;
};
const std::vector<PassInfo>& pass_list();

inline constexpr size_t kMaxDagNodes = 200'000;

struct LowerOptions {
  int64_t samples_per_microbatch = 1;  // sizes messages; from --batch-size when known
  bool verify_each = false;            // run the verifier after every pass (tests, --verify-each)
  std::function<void(const char* pass, const Graph&)> after_pass;  // --print-after
  // Past this many DAG nodes a plan is refused with a located error (lowering, scheduling and the
  // memory model cost ~4 µs a node: 200,000 answer within a second). Benchmarks lift it.
  size_t max_nodes = kMaxDagNodes;
  // Measured seconds per region by name (a machine file's F + B at one sample): when every pipeline
  // region has one, the cut pass cuts balanced placements by them instead of the checker's FLOPs.
  std::map<std::string, double> region_costs;
  // Gradients clipped by their global norm (piper-run --clip-grad-norm): the norm pass adds its
  // all-reduce between the last gradient and the first update.
  bool global_norm = false;
  // The host of each rank (HostFacts::host_of): from the launcher at run time, piper-check --hosts,
  // or the machine file's ranks per host. Empty: one host. Its size must be the mesh's world.
  std::vector<int32_t> host_of;
};

// Returns nothing when the strategy cannot be lowered (a diagnostic says why, e.g. an order cycle).
// A verifier failure is a bug in Piper and throws InternalError.
std::optional<Graph> lower(const CheckedStrategy& s, const Manifest& m, DiagnosticEngine& diags,
                           const LowerOptions& options = {});

}  // namespace piper::ir
