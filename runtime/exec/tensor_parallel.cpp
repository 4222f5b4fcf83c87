#include "runtime/exec/tensor_parallel.h"

#include <torch/torch.h>

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

const TensorGroup& group_of(int64_t handle) { return *reinterpret_cast<const TensorGroup*>(handle); }

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

torch::Tensor run_sharded(const torch::jit::Module& region, const torch::Tensor& x, const TensorGroup& g) {
  auto& m = const_cast<torch::jit::Module&>(region);
  const int64_t handle = reinterpret_cast<int64_t>(&g);
  torch::Tensor h = m.run_method("tp_enter", x).toTensor();
  if (h.requires_grad()) h = ReduceBackward::apply(h, handle);
  torch::Tensor p = m.run_method("tp_partial", h).toTensor();
  torch::Tensor s = p.requires_grad() ? ReduceForward::apply(p, handle) : [&] {
    torch::Tensor out = p.contiguous().clone();
    sum_over(out, g);
    return out;
  }();
  return m.run_method("tp_exit", x, s).toTensor();
}

}  // namespace piper::runtime
