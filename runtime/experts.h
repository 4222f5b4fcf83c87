// Expert parallelism's communication: the dispatch of tokens to the ranks that hold their experts
// and the combine that brings the results back, forward and (as their transposes) backward.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include <vector>

#include "runtime/chunk_runner.h"
#include "runtime/communicator.h"

namespace piper::runtime {

// Dense dispatch: every token's normalised hidden state and gates reach every rank of the group
// (an all-gather); each rank runs its own experts on all of them, weighted by the gates; the combine
// sums those partial outputs over the group, returns each rank its own tokens (a reduce-scatter) and
// adds the block's residual. Exact; more traffic than a sparse top-k all-to-all.
struct ExpertExchange {
  Communicator& comm;
  const std::vector<int>& group;

  // `router`: the dense piece that ends with the router ({attention, h, gates}); fills expert.inputs.
  void dispatch(const PieceIO& router, PieceIO& expert);
  // The expert piece's partial outputs -> this rank's tokens' block outputs (residual included).
  torch::Tensor combine(const PieceIO& router, const PieceIO& expert);
  // Backward of the combine: the gradient of this rank's block outputs -> the experts' output
  // gradient for every token of the group; `router.grad_residual` gets the residual's share.
  torch::Tensor combine_transpose(const torch::Tensor& grad_out, PieceIO& router);
  // Backward of the dispatch: the expert piece's input gradients {h, gates} (every token of the
  // group) -> this rank's tokens' gradients of h and gates.
  std::vector<torch::Tensor> dispatch_transpose(const std::vector<torch::Tensor>& grad_inputs);
};

}  // namespace piper::runtime
