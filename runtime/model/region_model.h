// A loaded model.pt whose manifest regions can run one at a time, as pipeline stages will.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace piper::runtime {

struct RegionCheck {
  double max_output_diff = 0;  // whole forward vs regions chained
  double max_grad_diff = 0;    // gradients of every parameter, same comparison
  double loss = 0;
  size_t regions = 0, parameters = 0;
};

// Regions run in TorchScript's plain interpreter: the profiling executor re-specializes graphs after
// their first runs, which changes what autograd saves (more memory from the second step on) and
// spends seconds compiling; without it memory is the same every step, as measured. The setting is
// per thread: call this on every thread that runs regions.
void plain_interpreter();

// One region with a tensor-parallel layout run as slices and summed, against the region whole.
struct TensorCheck {
  std::string region;
  double max_output_diff = 0, max_grad_diff = 0;
  std::string error;  // the region does not run on a slice: what broke (TorchScript names the line)
};

class RegionModel {
 public:
  // Loads MODEL (throws std::runtime_error naming the file and the problem).
  explicit RegionModel(const std::string& path);
  ~RegionModel();
  RegionModel(RegionModel&&) noexcept;

  const std::string& manifest_json() const;
  const std::vector<std::string>& sequence() const;  // region names a pipeline cuts, in order
  // Runs the whole model and the regions chained on the same random batch and compares outputs and
  // gradients (cross-entropy on next tokens).
  RegionCheck check_regions(int64_t batch, uint64_t seed);
  // Every region with a `tp` layout: its `ways` slices by the tensor-parallel contract (docs/models.md)
  // summed, against the region whole — the output and the gradients of its input and parameters
  // (a slice's gradient against that slice of the whole's).
  std::vector<TensorCheck> check_tensor_parallel(int64_t ways, int64_t batch, uint64_t seed);

  struct Impl;  // runtime/region_model_impl.h
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace piper::runtime
