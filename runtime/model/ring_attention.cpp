#include "runtime/model/ring_attention.h"

#include <torch/torch.h>

namespace piper::runtime {
torch::Tensor balanced_places(int64_t j, int64_t k, int64_t n) {
  const int64_t c = n / 2;
  return torch::cat({torch::arange(j * c, (j + 1) * c), torch::arange((2 * k - 1 - j) * c, (2 * k - j) * c)});
}

namespace {
torch::Tensor places(int64_t j, int64_t k, int64_t n) { return balanced_places(j, k, n); }

// The scores of q against one member's keys, the entries a query may not see (a later place) at
// -1e30 as the single-device model masks them (a finite fill: a row that sees none of a block gets
// a log-sum-exp near -1e30 and so no weight when blocks are merged, never a NaN).
torch::Tensor scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& qpos, const torch::Tensor& kpos) {
  return torch::matmul(q, k.transpose(-2, -1)).masked_fill(qpos.unsqueeze(1) < kpos.unsqueeze(0), -1e30);
}

struct Saved {
  torch::Tensor out, lse;
};

// The forward: blocks merged by their log-sum-exps, so only q, k, v, the output and the
// log-sum-exp are kept for the backward (not a block's scores).
Saved ring_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const RingLink& g) {
  const int64_t n = g.ways(), me = g.member(), tokens = q.size(2);
  const torch::Tensor qpos = places(me, n, tokens);
  torch::Tensor kv = torch::stack({k, v});
  Saved s;
  const int64_t steps = g.drop() ? 1 : n;
  for (int64_t step = 0; step < steps; ++step) {
    if (step > 0) kv = g.shift(kv);
    const int64_t src = (me - step + n) % n;  // whose keys this rank holds now
    torch::Tensor sc = scores(q, kv[0], qpos, places(src, n, tokens));
    torch::Tensor lse = sc.logsumexp(-1);
    torch::Tensor out = torch::matmul(torch::softmax(sc, -1), kv[1]);
    if (step == 0) {
      s = {out, lse};
      continue;
    }
    torch::Tensor merged = torch::logaddexp(s.lse, lse);
    s.out = s.out * (s.lse - merged).exp().unsqueeze(-1) + out * (lse - merged).exp().unsqueeze(-1);
    s.lse = merged;
  }
  return s;
}

// The backward, FlashAttention's: each block's probabilities recomputed from the saved
// log-sum-exp; the keys' and values' gradients travel the ring with them and, one step more, reach
// their owner.
torch::autograd::variable_list ring_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const Saved& s, const torch::Tensor& dout, const RingLink& g) {
  const int64_t n = g.ways(), me = g.member(), tokens = q.size(2);
  const torch::Tensor qpos = places(me, n, tokens);
  const torch::Tensor delta = (dout * s.out).sum(-1, /*keepdim=*/true);
  torch::Tensor dq = torch::zeros_like(q);
  torch::Tensor buf = torch::stack({k, v, torch::zeros_like(k), torch::zeros_like(v)});
  const int64_t steps = g.drop() ? 1 : n;
  for (int64_t step = 0; step < steps; ++step) {
    if (step > 0) buf = g.shift(buf);
    const int64_t src = (me - step + n) % n;
    torch::Tensor p = (scores(q, buf[0], qpos, places(src, n, tokens)) - s.lse.unsqueeze(-1)).exp();
    buf[3].add_(torch::matmul(p.transpose(-2, -1), dout));
    torch::Tensor ds = p * (torch::matmul(dout, buf[1].transpose(-2, -1)) - delta);
    dq.add_(torch::matmul(ds, buf[0]));
    buf[2].add_(torch::matmul(ds.transpose(-2, -1), q));
  }
  // After n-1 steps this rank holds member me+1's gradients: one step more hands them over.
  torch::Tensor grads = g.drop() ? buf.narrow(0, 2, 2) : g.shift(buf.narrow(0, 2, 2));
  return {dq, grads[0], grads[1]};
}

// The link travels through autograd as an integer (saved_data holds IValues); it outlives the step.
const RingLink& link_of(int64_t handle) { return *reinterpret_cast<const RingLink*>(handle); }

struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t handle) {
    Saved s = ring_forward(q, k, v, link_of(handle));
    ctx->save_for_backward({q, k, v, s.out, s.lse});
    ctx->saved_data["link"] = handle;
    return s.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    const auto t = ctx->get_saved_variables();
    auto d = ring_backward(t[0], t[1], t[2], Saved{t[3], t[4]}, grad[0].contiguous(), link_of(ctx->saved_data["link"].toInt()));
    return {d[0], d[1], d[2], torch::Tensor()};
  }
};
}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const RingLink& g) {
  // fp32 inside (a bf16 model's q, k, v come back to bf16 at the end), as the merges need.
  const auto type = q.scalar_type();
  auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat).contiguous(); };
  return RingAttention::apply(f(q), f(k), f(v), reinterpret_cast<int64_t>(&g)).to(type);
}

torch::Tensor run_ring_region(const torch::jit::Module& region, const torch::Tensor& x, const RingLink& g) {
  auto& m = const_cast<torch::jit::Module&>(region);
  auto qkv = m.run_method("cp_qkv", x).toTuple();
  const auto& e = qkv->elements();
  torch::Tensor y = ring_attention(e.at(0).toTensor(), e.at(1).toTensor(), e.at(2).toTensor(), g);
  return m.run_method("cp_exit", x, y).toTensor();
}

}  // namespace piper::runtime
