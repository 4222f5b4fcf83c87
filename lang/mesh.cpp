#include "lang/mesh.h"

namespace piper {

int Mesh::index(std::string_view axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == axis) return static_cast<int>(i);
  return -1;
}

int64_t Mesh::size(std::string_view axis) const { return size(index(axis)); }

int64_t Mesh::size(int axis) const { return axis < 0 ? 1 : axes_[static_cast<size_t>(axis)].size; }

std::vector<int64_t> Mesh::sizes() const {
  std::vector<int64_t> out;
  for (const auto& a : axes_) out.push_back(a.size);
  return out;
}

int64_t Mesh::stride(int axis) const {
  int64_t s = 1;
  for (size_t i = axes_.size(); i-- > static_cast<size_t>(axis) + 1;) s *= axes_[i].size;
  return s;
}

std::vector<int64_t> Mesh::coords(int64_t rank) const {
  std::vector<int64_t> c(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int64_t Mesh::coord(int64_t rank, int axis) const {
  if (axis < 0) return 0;
  return (rank / stride(axis)) % axes_[static_cast<size_t>(axis)].size;
}

std::vector<int32_t> Mesh::ranks_at(int axis, int64_t c) const {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < world_; ++r)
    if (axis < 0 || coord(r, axis) == c) out.push_back(static_cast<int32_t>(r));
  return out;
}

std::vector<int32_t> Mesh::group_along(int64_t rank, int axis) const {
  if (axis < 0) return {static_cast<int32_t>(rank)};
  const int64_t s = stride(axis), n = axes_[static_cast<size_t>(axis)].size;
  const int64_t base = rank - coord(rank, axis) * s;
  std::vector<int32_t> out;
  for (int64_t k = 0; k < n; ++k) out.push_back(static_cast<int32_t>(base + k * s));
  return out;
}

int64_t Mesh::replicas(int pipeline_axis) const {
  int64_t n = world_ / size(pipeline_axis);
  for (const MeshAxis& a : axes_)
    if (a.model) n /= a.size;
  return n;
}

int64_t Mesh::replica_of(int64_t rank, int pipeline_axis) const {
  int64_t replica = 0;
  auto c = coords(rank);
  for (size_t i = 0; i < axes_.size(); ++i)
    if (static_cast<int>(i) != pipeline_axis && !axes_[i].model) replica = replica * axes_[i].size + c[i];
  return replica;
}

int64_t Mesh::samples_per_microbatch(int64_t global_batch, int pipeline_axis, int64_t microbatches) const {
  const int64_t per = replicas(pipeline_axis) * microbatches;
  if (per <= 0 || global_batch % per != 0) return 0;
  return global_batch / per;
}

}  // namespace piper
