#include "runtime/exec/tensor_parallel.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

namespace piper::runtime {

namespace {
// Sums `t` over the group in place (contiguous). bf16 partials are summed in fp32 and rounded once,
// as one bf16 matmul over the whole contraction accumulates in fp32 (and MPI has no bf16 sum).
void sum_over(torch::Tensor& t, const TensorGroup& g) {
  if (g.drop || g.group.size() < 2) return;
  if (t.scalar_type() == torch::kFloat)
    return g.comm->all_reduce_sum(t.data_ptr<float>(), static_cast<size_t>(t.numel()), g.group, g.channel);
  torch::Tensor f = t.to(torch::kFloat).contiguous();
  g.comm->all_reduce_sum(f.data_ptr<float>(), static_cast<size_t>(f.numel()), g.group, g.channel);
  t.copy_(f);
}

// Sequence parallelism's data movement, along dimension 1 (activations are [samples, sequence, ...]).
// The collectives cut flat buffers into equal parts, so the sequence goes first while they run.

// A balanced group's order of the sequence, in which each member's share is contiguous: chunks
// 0, 2k-1, 1, 2k-2, ... of 2k (`back`: that order undone).
torch::Tensor balance(const torch::Tensor& x, const TensorGroup& g, bool back = false) {
  if (!g.balanced || g.group.size() < 2) return x;
  const int64_t k = ways(g);
  std::vector<torch::Tensor> c = x.chunk(2 * k, 1), out(c.size());
  for (int64_t j = 0; j < k; ++j) {
    const size_t lo = static_cast<size_t>(j), hi = static_cast<size_t>(2 * k - 1 - j);
    if (back) {
      out[lo] = c[2 * lo];
      out[hi] = c[2 * lo + 1];
    } else {
      out[2 * lo] = c[lo];
      out[2 * lo + 1] = c[hi];
    }
  }
  return torch::cat(out, 1);
}

// This rank's share of x along the sequence.
torch::Tensor my_share(const torch::Tensor& x, const TensorGroup& g) {
  return balance(x, g).chunk(ways(g), 1)[static_cast<size_t>(member(g))].contiguous();
}

// Every member's share of the sequence, concatenated: [samples, sequence / k, ...] -> [samples, sequence, ...].
torch::Tensor all_gather_sequence(const torch::Tensor& x, const TensorGroup& g) {
  if (g.group.size() < 2) return x;
  torch::Tensor in = x.transpose(0, 1).to(torch::kFloat).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= ways(g);
  torch::Tensor out = torch::empty(shape, in.options());
  std::vector<size_t> offsets;
  for (int64_t j = 0; j <= ways(g); ++j) offsets.push_back(static_cast<size_t>(j * in.numel()));
  g.comm->all_gather(in.data_ptr<float>(), out.data_ptr<float>(), offsets, g.group, g.channel);
  return balance(out.to(x.scalar_type()).transpose(0, 1), g, /*back=*/true).contiguous();
}

// The members' partials summed, this rank keeping its share of the sequence (`drop`: its share of
// its own partial, unsummed: the negative control).
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, const TensorGroup& g) {
  if (g.group.size() < 2) return x;
  if (g.drop) return my_share(x, g);
  torch::Tensor in = balance(x, g).transpose(0, 1).to(torch::kFloat).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= ways(g);
  torch::Tensor out = torch::empty(shape, in.options());
  std::vector<size_t> offsets;
  for (int64_t j = 0; j <= ways(g); ++j) offsets.push_back(static_cast<size_t>(j * out.numel()));
  g.comm->reduce_scatter_sum(in.data_ptr<float>(), out.data_ptr<float>(), offsets, g.group, g.channel);
  return out.to(x.scalar_type()).transpose(0, 1).contiguous();
}

template <torch::Tensor (*Forward)(const torch::Tensor&, const TensorGroup&),
          torch::Tensor (*Backward)(const torch::Tensor&, const TensorGroup&)>
struct SequenceOp : torch::autograd::Function<SequenceOp<Forward, Backward>> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t handle) {
    ctx->saved_data["group"] = handle;
    return Forward(x, group_of(handle));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    return {Backward(grad[0], group_of(ctx->saved_data["group"].toInt())), torch::Tensor()};
  }
};
// Megatron's pairs: gather forward / reduce-scatter backward into tp_partial, and the reverse out of it;
// at the edges of a run of such regions, this rank's share in (its gradient gathered back) and the whole out.
using AllGatherSequence = SequenceOp<all_gather_sequence, reduce_scatter_sequence>;
using ReduceScatterSequence = SequenceOp<reduce_scatter_sequence, all_gather_sequence>;
using ScatterSequence = SequenceOp<my_share, all_gather_sequence>;
using GatherSequence = SequenceOp<all_gather_sequence, my_share>;

// Megatron's g: the partial outputs summed in the forward; the gradient reaches every slice as is.
struct ReduceForward : torch::autograd::Function<ReduceForward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x, int64_t handle) {
    torch::Tensor out = x.contiguous().clone();
    sum_over(out, group_of(handle));
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list grad) {
    return {grad[0], torch::Tensor()};
  }
};

// Megatron's f: identity in the forward; the slices' input gradients summed in the backward.
struct ReduceBackward : torch::autograd::Function<ReduceBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t handle) {
    ctx->saved_data["group"] = handle;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    torch::Tensor g = grad[0].contiguous().clone();
    sum_over(g, group_of(ctx->saved_data["group"].toInt()));
    return {g, torch::Tensor()};
  }
};
}  // namespace

int64_t member(const TensorGroup& g) {
  return std::find(g.group.begin(), g.group.end(), g.comm->rank()) - g.group.begin();
}
int64_t ways(const TensorGroup& g) { return std::max<int64_t>(1, static_cast<int64_t>(g.group.size())); }

torch::Tensor run_sharded(const torch::jit::Module& region, const torch::Tensor& x, const TensorGroup& g, bool sequence) {
  auto& m = const_cast<torch::jit::Module&>(region);
  const int64_t handle = reinterpret_cast<int64_t>(&g);
  torch::Tensor h = m.run_method("tp_enter", x).toTensor();
  if (sequence) {
    torch::Tensor p = m.run_method("tp_partial", AllGatherSequence::apply(h, handle)).toTensor();
    return m.run_method("tp_exit", x, ReduceScatterSequence::apply(p, handle)).toTensor();
  }
  if (h.requires_grad()) h = ReduceBackward::apply(h, handle);
  torch::Tensor p = m.run_method("tp_partial", h).toTensor();
  torch::Tensor s = p.requires_grad() ? ReduceForward::apply(p, handle) : [&] {
    torch::Tensor out = p.contiguous().clone();
    sum_over(out, g);
    return out;
  }();
  return m.run_method("tp_exit", x, s).toTensor();
}

torch::Tensor scatter_sequence(const torch::Tensor& x, const TensorGroup& g) {
  // The checker checked the model's sequence; a shorter --seq-len must divide as well.
  const int64_t chunks = g.balanced ? 2 * ways(g) : ways(g);
  if (x.dim() < 2 || x.size(1) % chunks != 0)
    throw std::runtime_error(fmt::format("{} parallelism over {} ranks: a sequence of {} tokens does not divide evenly "
                                         "into {} chunks (choose a --seq-len that {} divides)",
                                         g.balanced ? "context" : "sequence", ways(g), x.dim() < 2 ? 0 : x.size(1), chunks,
                                         g.balanced ? "2×cp" : "tp"));
  return ScatterSequence::apply(x, reinterpret_cast<int64_t>(&g));
}

torch::Tensor gather_sequence(const torch::Tensor& x, const TensorGroup& g) {
  return GatherSequence::apply(x, reinterpret_cast<int64_t>(&g));
}

}  // namespace piper::runtime
