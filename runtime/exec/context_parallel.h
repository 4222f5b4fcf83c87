// Context parallelism inside a piece: a context-parallel group as a ring (ring_attention.h) over
// the communicator. Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include "runtime/exec/tensor_parallel.h"
#include "runtime/model/ring_attention.h"

namespace piper::runtime {

// The group's members in order; shift() is one step of the ring, a personalised exchange with the
// next and previous member on the group's channel. `g.drop`: each attends to its own keys only.
class GroupRing : public RingLink {
 public:
  explicit GroupRing(const TensorGroup& g) : g_(g) {}
  int64_t ways() const override { return runtime::ways(g_); }
  int64_t member() const override { return runtime::member(g_); }
  bool drop() const override { return g_.drop; }
  torch::Tensor shift(const torch::Tensor& t) const override;
  const TensorGroup& group() const { return g_; }

 private:
  const TensorGroup& g_;
};

}  // namespace piper::runtime
