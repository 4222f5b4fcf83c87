// Ring attention's arithmetic (causal, load-balanced shares, FlashAttention-style backward) over a
// RingLink: the executor's links pass blocks to the next rank, the memory probe's stand in for one.
#pragma once
#include <torch/script.h>

namespace piper::runtime {

// One member of a ring of `ways()`: shift() sends a tensor to the next member and returns the
// previous one's (of the same shape). drop(): attend to the own keys only (the negative control).
class RingLink {
 public:
  virtual ~RingLink() = default;
  virtual int64_t ways() const = 0;
  virtual int64_t member() const = 0;
  virtual bool drop() const { return false; }
  virtual torch::Tensor shift(const torch::Tensor& t) const = 0;
};

// The places in the whole sequence of member j's share of `n` tokens of a ring of k: two chunks of
// n/2, chunk j and chunk 2k-1-j of the 2k (so each member does as much causal attention).
torch::Tensor balanced_places(int64_t j, int64_t k, int64_t n);

// Causal attention of this member's q ([samples, heads, tokens, head_dim], already scaled) to every
// member's k and v, by the tokens' places; differentiable (its backward passes dk and dv round the
// ring home). `link` must outlive the backward. Computes in fp32, returns q's dtype.
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const RingLink& link);

// A region by the context-parallel contract (docs/models.md) on this member's share x:
// cp_exit(x, ring_attention(cp_qkv(x))).
torch::Tensor run_ring_region(const torch::jit::Module& region, const torch::Tensor& x, const RingLink& link);

}  // namespace piper::runtime
