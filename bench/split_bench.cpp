// The zero-bubble split's cost, measured on a model's own regions in one process, one thread:
// a stage of consecutive regions after the embedding (an input that needs its gradient, as on
// every stage after the first; ending with the head, the executor's loss) runs F then B, or F then
// BI then BW, alternately, many times; prints the median times and (BI + BW) / B.
// Usage: piper-bench-split MODEL [FIRST LAST] [SAMPLES] [REPS]
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/exec/chunk_runner.h"
#include "runtime/job/process_env.h"
#include "runtime/model/region_model.h"
#include "runtime/model/region_model_impl.h"

using namespace piper::runtime;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: piper-bench-split MODEL [FIRST LAST] [SAMPLES] [REPS]\n");
    return 2;
  }
  keep_freed_memory();  // as piper-run runs
  torch::set_num_threads(1);
  plain_interpreter();
  RegionModel model(argv[1]);
  auto& impl = model.impl();
  const size_t n = impl.modules.size();
  const size_t first = argc > 3 ? std::stoul(argv[2]) : 1, last = argc > 3 ? std::stoul(argv[3]) : n - 2;
  const int64_t samples = argc > 4 ? std::stoll(argv[4]) : 2;
  const int reps = argc > 5 ? std::stoi(argv[5]) : 20;
  PieceModules pm;
  for (size_t r = first; r <= last && r < n; ++r) {
    pm.plain.push_back(impl.modules[r]);
    for (auto p : impl.modules[r].parameters()) {
      p.set_requires_grad(true);
      p.mutable_grad() = torch::zeros_like(p);
    }
  }
  // The blocks' input: the embedding's output on random tokens.
  const torch::Tensor tokens = torch::randint(impl.vocab, {samples, impl.seq_len}, torch::kLong);
  torch::Tensor x;
  {
    torch::NoGradGuard no_grad;
    x = impl.modules[0].forward({tokens}).toTensor();
  }
  // A stage that ends with the head starts its backward from the executor's loss; others from a
  // gradient of their output's shape.
  const bool head = last >= n - 1;
  const torch::Tensor targets = torch::randint(impl.vocab, {samples, impl.seq_len}, torch::kLong);
  LossFn loss;
  if (head)
    loss = [&targets](const torch::Tensor& logits) {
      const torch::Tensor l = logits.to(torch::kFloat);
      return at::cross_entropy_loss(l.reshape({-1, l.size(-1)}), targets.reshape({-1}));
    };
  torch::Tensor gy;
  if (!head) gy = torch::randn_like(x);
  std::vector<double> b, bi, bw;
  for (int i = 0; i < reps + 3; ++i) {
    for (bool split : {false, true}) {
      PieceIO io;
      io.inputs = {x.detach().requires_grad_(true)};
      run_forward(pm, io, true, loss);
      double t0 = now();
      if (!split) {
        run_backward(pm, io, piper::ir::Op::B, {gy}, loss);
        if (i >= 3) b.push_back(now() - t0);
        continue;
      }
      run_backward(pm, io, piper::ir::Op::BI, {gy}, loss);
      double t1 = now();
      run_backward(pm, io, piper::ir::Op::BW, {}, {});
      double t2 = now();
      if (i >= 3) {
        bi.push_back(t1 - t0);
        bw.push_back(t2 - t1);
      }
    }
  }
  const double mb = median(b), mi = median(bi), mw = median(bw);
  fmt::print("regions {}..{} ({}), {} samples, {} reps: B {:.2f} ms, BI {:.2f} + BW {:.2f} = {:.2f} ms: (BI + BW) / B = {:.3f}\n",
             first, last, impl.sequence[first] + ".." + impl.sequence[std::min(last, n - 1)], samples, reps, mb * 1e3, mi * 1e3,
             mw * 1e3, (mi + mw) * 1e3, (mi + mw) / mb);
  return 0;
}
