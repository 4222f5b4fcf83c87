// Tensor parallelism inside a piece: a sharded region's slice of its parameters, and the region run
// by the tensor-parallel contract with Megatron's f and g around its sharded part.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include <vector>

#include "lang/manifest.h"
#include "runtime/comm/communicator.h"
#include "runtime/model/tensor_slice.h"

namespace piper::runtime {

// The ranks that hold a stage's slices and how they sum partials. `drop`: the sums are skipped — the
// all-reduces, and under sequence parallelism the reduce-scatters, which keep their own share unsummed
// (PIPER_TEST_DROP_COLLECTIVE=tensor, the equivalence test's negative control).
struct TensorGroup {
  Communicator* comm = nullptr;
  std::vector<int> group;
  int channel = 0;
  bool drop = false;
  // Context parallelism's load balancing: member j's share of a sequence is chunks j and 2k-1-j of
  // 2k (k members), so that each does as much of the causal attention; otherwise chunk j of k.
  bool balanced = false;
};

// The region by the contract (docs/models.md): h = tp_enter(x) replicated; f(h) (identity forward,
// all-reduce of its gradient backward); p = tp_partial(h) on this rank's slice; g(p) (all-reduce
// forward, identity backward); tp_exit(x, g(p)).
// With `sequence` (Megatron's sequence parallelism) x is this rank's share of the tokens: tp_enter
// runs on it, its result is all-gathered (reduce-scattered backward) for tp_partial, whose partial
// output is reduce-scattered (all-gathered backward) back to this rank's share for tp_exit.
torch::Tensor run_sharded(const torch::jit::Module& region, const torch::Tensor& x, const TensorGroup& g,
                          bool sequence = false);

// Activations [samples, sequence, ...] cut along the sequence over the group (member j holds the
// j-th share). scatter_sequence: this rank's share (its gradient all-gathered backward);
// gather_sequence: the whole from every member's share (backward: this rank's share of the
// gradient, which every member computed alike from the same whole).
torch::Tensor scatter_sequence(const torch::Tensor& x, const TensorGroup& g);
torch::Tensor gather_sequence(const torch::Tensor& x, const TensorGroup& g);

// The group of a pointer handed through an autograd function (they take integers, not references).
inline const TensorGroup& group_of(int64_t handle) { return *reinterpret_cast<const TensorGroup*>(handle); }
inline int64_t handle_of(const TensorGroup& g) { return reinterpret_cast<int64_t>(&g); }
// This rank's place in the group and the group's size.
int64_t member(const TensorGroup& g);
int64_t ways(const TensorGroup& g);

}  // namespace piper::runtime
