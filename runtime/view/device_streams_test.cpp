// Device streams and events for every library strategy's ranks: every cross-stream dependency is
// covered by the waits kept (checked from the plan's steps alone), and implied waits are dropped.
#include "runtime/view/device_streams.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>

#include "tests/plan_fixture.h"

using namespace piper;
using namespace piper::runtime;
using piper::testing::Planner;

TEST_CASE("device streams: every cross-stream dependency is covered by an event wait, implied ones dropped") {
  struct Case {
    const char* strategy;
    int world;
    std::vector<std::string> sets;
    const char* model = "gpt8";
  };
  const std::vector<Case> cases = {
      {"zero3.piper", 2, {"dp=2"}},
      {"1f1b.piper", 4, {"pp=4", "mb=8"}},
      {"zb1p.piper", 2, {"pp=2", "mb=4"}},
      {"dualpipev.piper", 2, {"pp=2", "mb=4"}},
      {"1f1b_zero3.piper", 4, {"pp=2", "dp=2", "mb=2"}},
      {"dualpipev_ep.piper", 4, {"pp=2", "ep=2", "mb=4"}, "moe8"},
  };
  int64_t deps = 0, waits = 0;
  for (const Case& c : cases) {
    CAPTURE(c.strategy);
    Planner f(c.model);
    auto plan = f.plan(fmt::format("use \"{}\";\n", c.strategy), c.sets, "", c.world);
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      const RankView v = make_rank_view(plan, r, c.world, 1 << 30);
      const DeviceStreamPlan d = plan_device_streams(plan, v);
      const size_t k = d.streams.size();
      REQUIRE(k == v.program(plan).streams.size());
      // Replay the steps: what each stream knows finished, from its order and the events it waits for.
      std::map<int32_t, std::pair<size_t, size_t>> recorder;  // event -> (stream, position)
      std::map<ir::NodeId, std::pair<size_t, size_t>> at;
      for (size_t s = 0; s < k; ++s)
        for (size_t i = 0; i < d.programs[s].size(); ++i) {
          const auto& st = d.programs[s][i];
          CHECK(st.op == v.program(plan).streams[s].ops[i]);  // the schedule's order, unchanged
          at[st.op] = {s, i};
          if (st.record >= 0) CHECK(recorder.emplace(st.record, std::make_pair(s, i)).second);
        }
      std::map<ir::NodeId, std::vector<int64_t>> after;  // per op: last finished position per stream
      std::vector<size_t> head(k, 0);
      size_t left = 0;
      for (const auto& p : d.programs) left += p.size();
      while (left > 0) {
        bool moved = false;
        for (size_t s = 0; s < k; ++s)
          while (head[s] < d.programs[s].size()) {
            const auto& st = d.programs[s][head[s]];
            std::vector<int64_t> know(k, -1);
            if (head[s] > 0) know = after[d.programs[s][head[s] - 1].op];
            bool ready = true;
            for (int32_t e : st.wait) {
              REQUIRE(recorder.count(e));
              const auto [rs, ri] = recorder[e];
              CHECK(rs != s);
              auto it = after.find(d.programs[rs][ri].op);
              if (it == after.end()) {
                ready = false;
                break;
              }
              for (size_t t = 0; t < k; ++t) know[t] = std::max(know[t], it->second[t]);
            }
            if (!ready) break;
            for (ir::NodeId q : v.local_preds[size_t(st.op)]) {
              const auto [qs, qi] = at.at(q);
              CHECK_MESSAGE((qs == s || know[qs] >= int64_t(qi)),
                            fmt::format("{} runs before {} is known finished", ir::token(plan.dag.nodes[size_t(st.op)]),
                                        ir::token(plan.dag.nodes[size_t(q)])));
            }
            know[s] = int64_t(head[s]);
            after[st.op] = know;
            ++head[s];
            --left;
            moved = true;
          }
        REQUIRE(moved);
      }
      CHECK(d.waits <= d.cross_stream_deps);
      deps += d.cross_stream_deps;
      waits += d.waits;
    }
  }
  MESSAGE(fmt::format("{} cross-stream dependencies, {} event waits kept", deps, waits));
  CHECK(waits < deps);  // vector clocks drop the waits that earlier ones imply
}
