// Test helpers for the plan compiler: strategy text in memory compiled against an example manifest.
#pragma once
#include <doctest/doctest.h>

#include "scheduler/plan.h"
#include "tests/lang_fixture.h"

namespace piper::testing {

struct Planner : Front {
  using Front::Front;

  // Compiles `text` as if it were a file in strategies/; nothing (and the errors in diags) on failure.
  std::optional<sched::Plan> compile(const std::string& text, sched::PlanOptions opt = {}) {
    opt.cmd.search_path.push_back(PIPER_STRATEGY_DIR);
    FileId id = sources.add(source_path("strategies/<test>.piper"), text);
    auto r = sched::compile_plan(id, manifest, opt, sources, diags);
    return std::move(r.plan);
  }

  // The same, requiring success, with `--set` values and unit costs (`F=1,B=2,...`).
  sched::Plan plan(const std::string& text, std::vector<std::string> sets = {}, const std::string& costs = "",
                   std::optional<int64_t> np = std::nullopt) {
    sched::PlanOptions opt;
    opt.cmd.sets = std::move(sets);
    opt.cmd.np = np;
    opt.cost_spec = costs;
    opt.verify_each = true;
    auto p = compile(text, opt);
    REQUIRE_MESSAGE(p.has_value(), errors());
    return std::move(*p);
  }
};

}  // namespace piper::testing
