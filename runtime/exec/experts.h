// Expert parallelism's communication: the dispatch of tokens to the ranks that hold their experts
// and the combine that brings the results back, forward and (as their transposes) backward.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include <vector>

#include "runtime/exec/chunk_runner.h"
#include "runtime/comm/communicator.h"
#include "runtime/view/rank_view.h"

namespace piper::runtime {

// Sparse top-k dispatch: each token goes only to the members of the group that hold one of its
// chosen experts (a gate that is not 0), with its normalised hidden state and the gates of that
// member's experts; token counts are exchanged first, then one all-to-all-v. Each member runs an
// expert only on the tokens routed to it (chunk_runner) and the combine sends the gate-weighted
// partial outputs back the same way; the origin adds them in group order, plus the block's
// residual. The backward is the same exchange transposed. Exact: a gate of 0 contributes nothing,
// and its gradient is dropped by the router's top-k anyway. The routing of a microbatch (which
// tokens went to whom, how many came from whom) is kept in the expert piece's PieceIO.
struct ExpertExchange {
  Communicator& comm;
  const StageView::Experts& ex;
  int channel;  // expert_channel of the stream the exchange runs on

  // `router`: the dense piece that ends with the router ({attention, h, gates}); fills expert.inputs.
  void dispatch(const PieceIO& router, PieceIO& expert);
  // The expert piece's partial outputs -> this rank's tokens' block outputs (residual included).
  torch::Tensor combine(const PieceIO& router, const PieceIO& expert);
  // Backward of the combine: the gradient of this rank's block outputs -> the gradient of the
  // expert piece's output (its received tokens); `router.grad_residual` gets the residual's share.
  torch::Tensor combine_transpose(const torch::Tensor& grad_out, PieceIO& router, const PieceIO& expert);
  // Backward of the dispatch: the expert piece's input gradients {h, gates} (received tokens) ->
  // this rank's tokens' gradients of h and gates.
  std::vector<torch::Tensor> dispatch_transpose(const std::vector<torch::Tensor>& grad_inputs, const PieceIO& router,
                                                const PieceIO& expert);
};

}  // namespace piper::runtime
