// Measures the idle fraction of the compute streams of a pipeline run in one process: every rank a
// thread with the in-process communicator (no MPI progress threads competing for the cores), so
// the result isolates the executor from the transport. Compare with bench/speed_bench.sh (MPI).
// Usage: piper-bench-pipeline-idle MODEL STRATEGY PP MB [STEPS]
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <thread>

#include "runtime/exec/executor.h"

using namespace piper;
using namespace piper::runtime;

int main(int argc, char** argv) {
  if (argc < 5) {
    fmt::print(stderr, "usage: {} MODEL STRATEGY PP MB [STEPS]\n", argv[0]);
    return 2;
  }
  std::string model = argv[1], strategy = argv[2];
  int pp = std::atoi(argv[3]), mb = std::atoi(argv[4]), steps = argc > 5 ? std::atoi(argv[5]) : 20;
  sched::PlanOptions opt;
  opt.cmd.np = pp;
  opt.cmd.sets = {fmt::format("pp={}", pp), fmt::format("mb={}", mb)};
  opt.cmd.batch_size = 16;
  opt.cmd.search_path = default_search_path();
  std::string errors;
  auto plan = sched::compile_plan(model, strategy, opt, &errors);
  if (!plan) {
    fmt::print(stderr, "{}", errors);
    return 1;
  }
  set_intra_op_threads(1);
  TokenData data(std::string(PIPER_SOURCE_DIR) + "/data/corpus.txt");
  auto comms = make_fake_world(pp);
  std::vector<std::vector<StepResult>> results(static_cast<size_t>(pp));
  std::vector<std::thread> ranks;
  for (int r = 0; r < pp; ++r)
    ranks.emplace_back([&, r] {
      Executor ex(*plan, model, data, *comms[static_cast<size_t>(r)], ExecutorOptions{16, 1e-3, "adamw", 0});
      for (int s = 0; s < steps; ++s) results[static_cast<size_t>(r)].push_back(ex.step(s));
    });
  for (auto& t : ranks) t.join();
  std::vector<double> fracs;
  for (const auto& per_rank : results)
    for (size_t s = 5; s < per_rank.size(); ++s) {
      // From the step's first op to its last, on any rank (the pipeline's span).
      double busy = 0, begin = 1e30, end = 0;
      for (const auto& rank_ops : results)
        for (const auto& op : rank_ops[s].ops) begin = std::min(begin, op.start), end = std::max(end, op.end);
      for (const auto& op : per_rank[s].ops)
        if (op.stream == "compute") busy += op.end - op.start;
      fracs.push_back(1 - busy / (end - begin));
    }
  std::sort(fracs.begin(), fracs.end());
  double formula = double(pp - 1) / (mb + pp - 1);
  fmt::print("in-process {} pp={} m={}: idle fraction of the compute streams {:.3f} (median of {} rank-steps), "
             "formula (p-1)/(m+p-1) = {:.3f}: ratio {:.2f}\n",
             strategy.substr(strategy.rfind('/') + 1), pp, mb, fracs[fracs.size() / 2], fracs.size(), formula,
             fracs[fracs.size() / 2] / formula);
}
