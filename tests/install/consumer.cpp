// Compiles a plan with an installed Piper: MODEL STRATEGY -> the number of DAG nodes and ranks.
#include <cstdio>
#include <string>

#include "lang/frontend.h"
#include "scheduler/plan.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  piper::sched::PlanOptions opt;
  opt.cmd.search_path = piper::default_search_path();
  for (int i = 3; i < argc; ++i) opt.cmd.sets.push_back(argv[i]);
  std::string errors;
  auto plan = piper::sched::compile_plan(argv[1], argv[2], opt, &errors);
  if (!plan) {
    std::fputs(errors.c_str(), stderr);
    return 1;
  }
  std::printf("plan: %zu nodes on %lld ranks\n", plan->dag.nodes.size(), static_cast<long long>(plan->dag.facts.mesh.world()));
  return 0;
}
