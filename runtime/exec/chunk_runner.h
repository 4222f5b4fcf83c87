// One piece of a stage, forward and backward (F, B, BI, BW): whole stages, pieces cut at buckets or
// units, and expert pieces all run through this code; what flows in and out are lists of tensors.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include <functional>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "runtime/exec/context_parallel.h"
#include "runtime/exec/tensor_parallel.h"
#include "runtime/model/backward_split.h"

namespace piper::runtime {

struct PieceModules {
  std::vector<torch::jit::Module> plain;  // dense: the regions' modules, run in order
  // Tensor parallelism: per module of `plain` (and the MoE end's attention), whether it runs sharded
  // (tensor_parallel.h) with `tp`; empty when the piece has no sharded region.
  std::vector<bool> sharded;
  bool attn_sharded = false;
  // Of those, the ones with sequence parallelism (per module of `plain`, and the MoE end's attention):
  // the activation between two of them stays this rank's share of the tokens.
  std::vector<bool> sequence;
  bool attn_sequence = false;
  bool attn_context = false;  // the block's attention by ring attention (context parallelism)
  const TensorGroup* tp = nullptr;
  // Context parallelism, per module of `plain`: whether it runs on this rank's (balanced) share of
  // the tokens with `cp`, as is (kTokenwise) or by ring attention (kRing, context_parallel.h).
  enum Context : uint8_t { kWhole = 0, kTokenwise = 1, kRing = 2 };
  std::vector<Context> context;
  const GroupRing* cp = nullptr;
  // Dense, ending with a block whose experts are the next piece: it stops after the block's
  // attention and router (the zoo's MoE contract, docs/models.md) and outputs {attention, h, gates}.
  bool moe_end = false;
  torch::jit::Module attn, router;
  // Expert piece: the members this rank holds; inputs {h, gates} of the tokens routed here (gates:
  // one column per member held), output the gate-weighted sum of their outputs, each member run
  // only on the tokens that chose it.
  bool expert = false;
  std::vector<std::pair<int64_t, torch::jit::Module>> experts;
};

struct PieceIO {
  std::vector<torch::Tensor> inputs;        // leaves requiring grad where a gradient flows back (tokens do not)
  std::vector<torch::Tensor> outputs;       // the forward's results; {loss} for the model's last piece
  std::vector<torch::Tensor> grad_outputs;  // the backward's incoming gradients (kept for BW when BI had no inputs)
  // Expert pieces: this microbatch's routing (experts.h). route_to[k]: the indices of this rank's
  // tokens sent to group member k; route_from[k]: how many tokens member k sent here.
  std::vector<torch::Tensor> route_to;
  std::vector<int64_t> route_from;
  WeightHalf weight;   // between BI and BW: where the weight half starts
  bool split = false;  // BI ran the input half; BW runs from `weight`
  std::vector<torch::Tensor> grad_inputs;   // the backward's results, one per input
  torch::Tensor grad_residual;              // moe_end: the gradient of its attention output (from the combine)
  bool recompute = false;                   // the forward ran without a graph; it reruns before the backward
};

using LossFn = std::function<torch::Tensor(const torch::Tensor& logits)>;

// Runs the piece on io.inputs; `loss` (set for the model's last piece) turns its output into the loss.
// Without `record`, no autograd graph is kept (activation checkpointing: io.recompute is set).
void run_forward(const PieceModules& m, PieceIO& io, bool record, const LossFn& loss);

// B: input and weight gradients; BI: input gradients only, keeping for BW only what weight
// gradients need; BW: weight gradients only (nothing of BI is computed twice). `grad_outputs` has one
// entry per output (ignored for a loss). Activations are released after B and BW.
void run_backward(const PieceModules& m, PieceIO& io, ir::Op op, std::vector<torch::Tensor> grad_outputs,
                  const LossFn& loss);

}  // namespace piper::runtime
