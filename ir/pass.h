// What every lowering pass shares: the graph being rewritten and what the strategy says about it.
#pragma once
#include <map>
#include <vector>

#include "ir/graph.h"
#include "ir/lower.h"

namespace piper::ir {

struct LowerContext {
  const CheckedStrategy& strategy;
  const Manifest& manifest;
  DiagnosticEngine& diags;
  const LowerOptions& options;
  Graph graph;
  std::vector<Stage> stages;  // the checker's, until the cut pass cuts balanced placements by measured costs
  bool failed = false;  // a pass reported the user's error; lowering stops after it

  // One microbatch's worth; floating activations of a bf16 stage are bf16.
  int64_t activation_bytes(const std::optional<TensorSpec>& t, DType precision = DType::F32) const;
  StageFacts& stage(size_t s) { return graph.facts.stages[s]; }
  bool segmented(int32_t stage) const { return graph.stage(stage).segments.size() > 1; }
  int32_t axis_index(const std::string& axis) const { return strategy.mesh.index(axis); }
};

// The passes, in the order ir::lower runs them (lower.cpp says why that order).
void hosts_pass(LowerContext& c);
void cut_pass(LowerContext& c);
void build_pass(LowerContext& c);
void split_pass(LowerContext& c);
void place_pass(LowerContext& c);
void p2p_pass(LowerContext& c);
void replicate_pass(LowerContext& c);
void tie_pass(LowerContext& c);  // sets c.failed when tied copies are replicated differently
void mirror_pass(LowerContext& c);  // sets c.failed when `mirror` meets what it does not compose with
void shard_pass(LowerContext& c);
void norm_pass(LowerContext& c);
void storage_pass(LowerContext& c);
void order_pass(LowerContext& c);  // sets c.failed with a located diagnostic on a cycle
void recompute_pass(LowerContext& c);

}  // namespace piper::ir
