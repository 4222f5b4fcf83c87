// The zero-bubble split of one backward pass on LibTorch's autograd graph: the input half (BI)
// computes only input gradients and keeps only what the weight half (BW) needs; BW computes only
// weight gradients, starting where BI left off. Runtime-internal (LibTorch inside).
#pragma once
#include <torch/csrc/autograd/edge.h>
#include <torch/script.h>

#include <vector>

namespace piper::runtime {

// What BW starts from: edges into the graph's nodes and the gradients those inputs received.
struct WeightHalf {
  std::vector<torch::autograd::Edge> roots;
  std::vector<torch::Tensor> grads;
};

// BI. `outputs` with their gradients `grads` (undefined for a scalar loss: 1) are differentiated
// with respect to `inputs` (leaves requiring grad; their gradients are returned in order). Nothing is
// accumulated into parameters. Afterwards the graph holds only what the weight gradients need,
// described by *rest.
std::vector<torch::Tensor> backward_inputs(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads,
                                           const std::vector<torch::Tensor>& inputs, WeightHalf* rest);

// BW: accumulates the weight gradients into the parameters' .grad and frees the graph.
void backward_weights(WeightHalf& rest);

}  // namespace piper::runtime
