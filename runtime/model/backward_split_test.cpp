// The zero-bubble split on a real autograd graph: BI's input gradients and BI+BW's weight gradients
// equal one whole backward's; BI computes no weight gradient; after BI the graph holds what the weight
// gradients need (the output gradients of the ops with weights, captured), and lets go of the saved
// tensors only the input gradients needed.
#include "runtime/model/backward_split.h"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <set>

#include "runtime/device/memory_counter.h"

using namespace piper::runtime;

namespace {
struct Block : torch::nn::Module {  // a transformer-like block: a residual MLP under a layer norm
  Block(int64_t d, int64_t f) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    up = register_module("up", torch::nn::Linear(d, f));
    down = register_module("down", torch::nn::Linear(f, d));
  }
  torch::Tensor forward(torch::Tensor x) { return x + down(torch::gelu(up(ln(x)))); }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}
}  // namespace

TEST_CASE("BI then BW computes what B computes, once") {
  torch::manual_seed(0);
  torch::nn::Sequential net(Block(32, 128), Block(32, 128));
  const torch::Tensor x0 = torch::randn({4, 16, 32}), gy = torch::randn({4, 16, 32});

  // B: one whole backward.
  torch::Tensor x = x0.clone().requires_grad_(true);
  torch::autograd::backward({net->forward(x)}, {gy});
  const torch::Tensor want_dx = x.grad().clone();
  const auto want = grads_of(*net);
  for (auto& p : net->parameters()) p.mutable_grad().zero_();

  // BI, then BW.
  torch::Tensor x2 = x0.clone().requires_grad_(true);
  torch::Tensor y = net->forward(x2);
  WeightHalf rest;
  auto dx = backward_inputs({y}, {gy}, {x2}, &rest);
  REQUIRE(dx.size() == 1);
  CHECK(torch::allclose(dx[0], want_dx, 1e-6, 1e-6));
  for (auto& p : net->parameters()) CHECK(p.grad().abs().sum().item<double>() == 0.0);  // no weight gradient yet
  CHECK(!rest.roots.empty());
  y = torch::Tensor();
  backward_weights(rest);
  const auto got = grads_of(*net);
  for (size_t i = 0; i < want.size(); ++i) CHECK(torch::allclose(got[i], want[i], 1e-5, 1e-6));
}

TEST_CASE("after BI the graph holds only what the weight gradients need, after BW nothing") {
  install_memory_counter();
  set_memory_rank(7);
  torch::manual_seed(0);
  torch::nn::Sequential net(Block(64, 256), Block(64, 256), Block(64, 256));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  torch::Tensor x = torch::randn({8, 32, 64}).requires_grad_(true), gy = torch::randn({8, 32, 64});
  const int64_t base = memory_stats(7).live;
  torch::Tensor y = net->forward(x);
  const int64_t saved = memory_stats(7).live - base;
  WeightHalf rest;
  reset_memory_peak(7);
  auto dx = backward_inputs({y}, {gy}, {x}, &rest);
  const int64_t bi_peak = memory_stats(7).peak - base;
  y = torch::Tensor();
  const int64_t held = memory_stats(7).live - base - dx[0].nbytes();
  std::set<const void*> storages;  // captured gradients, each storage once (one may feed two edges)
  int64_t captured = 0;
  for (const auto& t : rest.grads)
    if (storages.insert(t.storage().data()).second) captured += static_cast<int64_t>(t.storage().nbytes());
  MESSAGE("saved by the forward " << saved << " bytes; held between BI and BW " << held << ", of which captured gradients "
                                  << captured << "; BI's peak " << bi_peak);
  // Per block, of what the forward saved, the GELU's input (only its input gradient needed it) is
  // freed; the linears' inputs, the layer norm's statistics stay, beside the captured gradients.
  const int64_t gelu_inputs = 3 * 8 * 32 * 256 * 4;
  CHECK(held - captured <= saved - gelu_inputs);
  // Each node of the input half lets go as soon as it has run: BI never holds all the forward saved
  // and all it captures at once.
  CHECK(bi_peak < saved + captured);
  backward_weights(rest);
  dx.clear();
  CHECK(memory_stats(7).live - base <= gy.nbytes());
}
