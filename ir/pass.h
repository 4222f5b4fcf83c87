// What every lowering pass shares: the graph being rewritten and what the strategy says about it.
#pragma once
#include <map>
#include <vector>

#include "ir/graph.h"
#include "ir/lower.h"

namespace piper::ir {

// A piece of a stage's forward/backward: the whole stage, or a run cut at sharded regions.
struct Segment {
  std::vector<RegionId> regions;  // for dense pieces: the pipeline regions (their sharded lists excluded)
  RegionId sharded = -1;          // for expert pieces: the list region that is sharded
  int64_t param_bytes = 0;
  int64_t flops = 0;
};

struct LowerContext {
  const CheckedStrategy& strategy;
  const Manifest& manifest;
  DiagnosticEngine& diags;
  const LowerOptions& options;
  Graph graph;
  std::vector<std::vector<Segment>> segments;  // per stage; one segment when nothing is sharded
  std::vector<std::vector<int32_t>> stage_ranks;  // per stage: the ranks that hold it

  int64_t activation_bytes(const std::optional<TensorSpec>& t) const;
  bool segmented(int32_t stage) const { return segments[static_cast<size_t>(stage)].size() > 1; }
  int32_t axis_index(const std::string& axis) const;
  // Ranks whose coordinate on `axis` is `coord` (all ranks when axis is empty), ascending.
  std::vector<int32_t> ranks_at(const std::string& axis, int64_t coord) const;
};

void build_pass(LowerContext& c);
void split_pass(LowerContext& c);
void place_pass(LowerContext& c);
void p2p_pass(LowerContext& c);
void replicate_pass(LowerContext& c);
void shard_pass(LowerContext& c);
bool order_pass(LowerContext& c);  // false: a diagnostic was reported
void recompute_pass(LowerContext& c);

}  // namespace piper::ir
