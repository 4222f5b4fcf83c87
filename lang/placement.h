// Where the `place` directives put each pipeline region, and the stages that makes. The checker
// decides it with the manifest's FLOPs for balanced placements; lowering decides it again with
// measured region costs when a machine file has them (ir/cut.cpp). One algorithm for both.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "lang/manifest.h"
#include "lang/strategy.h"

namespace piper {

struct Placement {
  int64_t coord = 0;                                // on the pipeline axis
  std::optional<std::pair<size_t, int64_t>> group;  // (place directive, stage group) for `over` forms
};

// A region's weight in a balanced cut (FLOPs, or measured nanoseconds).
using RegionWeight = std::function<int64_t(RegionId)>;

// Every placed pipeline region's placement, from the checked `place` directives in order; balanced
// ones cut by `weight`, each after the placements before it are known. `sequence`: the manifest's.
std::map<RegionId, Placement> place_regions(const std::vector<Directive>& directives, const Mesh& mesh,
                                            const std::vector<RegionId>& sequence, const RegionWeight& weight);

// Stages: maximal runs of sequence regions on one coordinate; regions placed with `on` join their
// neighbours, `over` groups stay apart (a V's two halves on the last rank are two stages).
std::vector<Stage> form_stages(const std::vector<RegionId>& sequence, const std::map<RegionId, Placement>& placed);

}  // namespace piper
