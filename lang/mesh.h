// The device mesh: named axes laid over the world's ranks, and every question asked of it (coordinates, groups, replicas).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lang/source.h"

namespace piper {

struct MeshAxis {
  std::string name;
  int64_t size = 1;
  SourceLoc loc;
  // Tensor parallelism splits the model over this axis (`shard ... over tp heads`): its ranks read the
  // same samples, so it is not a data axis.
  bool model = false;
};

// Ranks are row-major over the axes in declaration order: the first axis varies slowest, the last
// fastest (so `mesh pp = 2, dp = 2` puts the data-parallel replicas of a stage on neighbouring ranks).
class Mesh {
 public:
  Mesh() = default;  // one device, no axes
  Mesh(std::vector<MeshAxis> axes, int64_t world) : axes_(std::move(axes)), world_(world) {}

  const std::vector<MeshAxis>& axes() const { return axes_; }
  bool empty() const { return axes_.empty(); }
  int64_t world() const { return world_; }

  int index(std::string_view axis) const;     // -1 when the mesh has no such axis
  int64_t size(std::string_view axis) const;  // 1 for an axis not in the mesh
  int64_t size(int axis) const;               // 1 for -1
  std::vector<int64_t> sizes() const;

  std::vector<int64_t> coords(int64_t rank) const;
  int64_t coord(int64_t rank, int axis) const;  // 0 for axis -1
  // Ranks whose coordinate on `axis` is `coord` (every rank for axis -1), ascending.
  std::vector<int32_t> ranks_at(int axis, int64_t coord) const;
  // `rank` and the ranks that differ from it only on `axis` (its collective group along it), ascending.
  std::vector<int32_t> group_along(int64_t rank, int axis) const;

  // Data replicas: every combination of coordinates off the pipeline axis and the model (tensor-
  // parallel) axes reads its own samples.
  int64_t replicas(int pipeline_axis) const;
  int64_t replica_of(int64_t rank, int pipeline_axis) const;  // 0 .. replicas-1
  // Samples in one microbatch of one replica: the global batch over replicas × microbatches; 0 when
  // it does not split evenly (the checker reports that at `split`).
  int64_t samples_per_microbatch(int64_t global_batch, int pipeline_axis, int64_t microbatches) const;

 private:
  int64_t stride(int axis) const;
  std::vector<MeshAxis> axes_;
  int64_t world_ = 1;
};

}  // namespace piper
