// Validation: forward-only steps through the same plan. The rank's program with every backward,
// update and their communication left out — forward pieces, their sends and receives, the forward
// all-to-alls and ZeRO-3's forward gathers stay, in the planned order (a subset of a program that
// cannot deadlock cannot either) — run with the model in eval mode and no autograd graph.
#include <fmt/format.h>
#include <torch/torch.h>

#include "runtime/exec/executor_impl.h"
#include "runtime/model/region_model_impl.h"

namespace piper::runtime {

using ir::forward_only;
using ir::NodeId;

// The forward-only program and its predecessors, and its threads (once, at the first evaluation).
void Executor::Impl::prepare_evaluation() {
  if (eval_threads) return;
  if (queues) throw std::runtime_error("validation (--eval-every) runs on the CPU only so far, not with --device cuda");
  const sched::ClassProgram& full = view.program(plan);
  eval_program.ranks = full.ranks;
  for (const auto& s : full.streams) {
    sched::StreamProgram p{s.stream, {}, {}};
    for (size_t k = 0; k < s.ops.size(); ++k)
      if (forward_only(node(s.ops[k]))) {
        p.ops.push_back(s.ops[k]);
        p.window.push_back(s.window.empty() ? -1 : s.window[k]);
      }
    eval_program.streams.push_back(std::move(p));
  }
  eval_preds.assign(g.nodes.size(), {});
  for (size_t v = 0; v < g.nodes.size(); ++v)
    for (NodeId u : view.local_preds[v])
      if (forward_only(node(u))) eval_preds[v].push_back(u);
  eval_threads = std::make_unique<StreamThreads>(g, eval_program, eval_preds, comm.rank(), [](size_t) {
    plain_interpreter();
  });
  eval_threads->set_op_timeout(opt.op_timeout);
  eval_threads->set_in_order(queues != nullptr || !tensor_groups.empty() || !context_groups.empty());  // as the step's (executor.cpp)
  if (const auto inline_sends = post_inline_sends()) eval_threads->set_post_inline(inline_sends);
}

double Executor::Impl::evaluate(const TokenData& val, int64_t batches) {
  prepare_evaluation();
  auto& root = model.impl().root;
  root.train(false);  // dropout off, as a forward-only PyTorch pass in eval mode
  evaluating = true;
  const int64_t per_replica = opt.global_batch / view.replicas;
  double total = 0;
  for (int64_t k = 0; k < batches; ++k) {  // the same windows at every evaluation: a fixed validation set
    auto batch = val.batch(opt.seed, static_cast<uint64_t>(k), opt.global_batch, view.replica * per_replica, per_replica, seq);
    tokens = torch::from_blob(batch.data(), {per_replica, seq + 1}, torch::kLong).clone();
    begin_pass();
    std::string failure = eval_threads->run(cur_step, [this](NodeId v) { run(v); },
                                            [this](const std::string& msg) { comm.abort(msg); }, nullptr);
    if (!failure.empty()) comm.abort(failure);
    finish_sends();
    total += pass_loss();
  }
  evaluating = false;
  root.train(true);
  end_pass();
  return total / static_cast<double>(batches);
}

double Executor::evaluate(const TokenData& val, int64_t batches) { return impl_->evaluate(val, batches); }

}  // namespace piper::runtime
