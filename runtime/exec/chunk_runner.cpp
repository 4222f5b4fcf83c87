#include "runtime/exec/chunk_runner.h"

#include <torch/torch.h>

#include "runtime/model/backward_split.h"
#include "runtime/device/memory_counter.h"

namespace piper::runtime {

namespace {
std::vector<torch::Tensor> compute(const PieceModules& m, const std::vector<torch::Tensor>& in, const LossFn& loss) {
  if (m.expert) {
    const torch::Tensor &h = in.at(0), &gates = in.at(1);
    torch::Tensor y = torch::zeros_like(h);
    for (size_t c = 0; c < m.experts.size(); ++c) {
      const torch::Tensor g = gates.select(1, static_cast<int64_t>(c));
      const torch::Tensor idx = g.detach().nonzero().squeeze(1);  // the tokens that chose this member
      if (idx.numel() == 0) continue;
      const torch::Tensor out = const_cast<torch::jit::Module&>(m.experts[c].second).forward({h.index_select(0, idx)}).toTensor();
      y = y.index_add(0, idx, out * g.index_select(0, idx).unsqueeze(1));
    }
    return {y};
  }
  torch::Tensor x = in.at(0);
  // Sequence and context parallelism: x is this rank's share of the tokens (in the group `share`
  // cuts them over) from the first such region on, and whole again before any other region and at
  // the piece's end (what it hands on and the loss read).
  const TensorGroup* share = nullptr;
  auto to_share = [&](const TensorGroup* want) {
    if (want == share) return;
    if (share) x = gather_sequence(x, *share);
    if (want) x = scatter_sequence(x, *want);
    share = want;
  };
  for (size_t i = 0; i < m.plain.size(); ++i) {
    const bool sharded = i < m.sharded.size() && m.sharded[i], seq = i < m.sequence.size() && m.sequence[i];
    const auto context = i < m.context.size() ? m.context[i] : PieceModules::kWhole;
    to_share(seq ? m.tp : context != PieceModules::kWhole ? &m.cp->group() : nullptr);
    auto& module = const_cast<torch::jit::Module&>(m.plain[i]);
    x = sharded                            ? run_sharded(module, x, *m.tp, seq)
        : context == PieceModules::kRing ? run_ring_region(module, x, *m.cp)
                                           : module.forward({x}).toTensor();
  }
  if (m.moe_end) {
    to_share(m.attn_sequence ? m.tp : m.attn_context ? &m.cp->group() : nullptr);
    auto& attn = const_cast<torch::jit::Module&>(m.attn);
    torch::Tensor a = m.attn_sharded   ? run_sharded(attn, x, *m.tp, m.attn_sequence)
                      : m.attn_context ? run_ring_region(attn, x, *m.cp)
                                       : attn.forward({x}).toTensor();
    if (share) a = gather_sequence(a, *share);
    auto hg = const_cast<torch::jit::Module&>(m.router).forward({a}).toTuple();
    return {a, hg->elements()[0].toTensor(), hg->elements()[1].toTensor()};
  }
  to_share(nullptr);
  if (loss) return {loss(x)};
  return {x};
}

// The outputs that receive a gradient, with it (a loss needs none).
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> roots(const PieceIO& io, const LossFn& loss,
                                                                         const std::vector<torch::Tensor>& grads) {
  if (loss) return {{io.outputs.at(0)}, {}};
  std::vector<torch::Tensor> outs, gs;
  for (size_t i = 0; i < io.outputs.size(); ++i)
    if (i < grads.size() && grads[i].defined() && io.outputs[i].requires_grad()) {
      outs.push_back(io.outputs[i]);
      gs.push_back(grads[i]);
    }
  return {outs, gs};
}
}  // namespace

void run_forward(const PieceModules& m, PieceIO& io, bool record, const LossFn& loss) {
  MemScope scope(MemCategory::Activations);
  if (!record) {
    torch::NoGradGuard no_grad;
    io.outputs = compute(m, io.inputs, loss);
    io.recompute = true;
    return;
  }
  io.outputs = compute(m, io.inputs, loss);
}

void run_backward(const PieceModules& m, PieceIO& io, ir::Op op, std::vector<torch::Tensor> grad_outputs,
                  const LossFn& loss) {
  MemScope scope(MemCategory::Activations);
  if (op == ir::Op::BW && io.split) {  // the weight half of what BI started
    backward_weights(io.weight);
    io.split = false;
    io.outputs.clear();
    io.inputs.clear();
    io.grad_outputs.clear();
    return;
  }
  if (io.recompute) {  // activation checkpointing: the forward again, now recording the graph
    io.outputs = compute(m, io.inputs, loss);
    io.recompute = false;
  }
  if (op == ir::Op::BW) grad_outputs = io.grad_outputs;  // the ones BI received (it had no inputs to differentiate)
  else io.grad_outputs = grad_outputs;
  auto [outs, grads] = roots(io, loss, grad_outputs);
  std::vector<torch::Tensor> leaves;
  for (const auto& x : io.inputs)
    if (x.requires_grad()) leaves.push_back(x);
  io.grad_inputs.assign(io.inputs.size(), torch::Tensor());
  if (op == ir::Op::BI) {
    // Without inputs to differentiate (the first stage) BI has nothing to do; BW runs the whole
    // backward from the gradients kept.
    if (!leaves.empty() && !outs.empty()) {
      auto g = backward_inputs(outs, grads, leaves, &io.weight);
      for (size_t i = 0, k = 0; i < io.inputs.size(); ++i)
        if (io.inputs[i].requires_grad()) io.grad_inputs[i] = g[k++];
      io.split = true;
      // The graph now holds only what BW needs; the rest goes with these.
      io.outputs.clear();
      io.grad_outputs.clear();
      io.inputs.clear();
    }
    return;
  }
  if (!outs.empty()) torch::autograd::backward(outs, grads);
  if (op == ir::Op::B)
    for (size_t i = 0; i < io.inputs.size(); ++i)
      if (io.inputs[i].requires_grad()) io.grad_inputs[i] = io.inputs[i].grad();
  // The activations are released with the graph; the input gradients stay for their consumers.
  io.outputs.clear();
  io.grad_outputs.clear();
  io.inputs.clear();
}

}  // namespace piper::runtime
