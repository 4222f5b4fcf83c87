// The rank view (LibTorch-free) on every library strategy: each rank's peers, tags, groups, shards
// and experts are consistent with every other rank's, and the memory model sees the same ZeRO stage,
// buckets, units and expert ownership the executor will run (both read the plan's facts).
#include "runtime/view/rank_view.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>
#include <set>

#include "tests/plan_fixture.h"

using namespace piper;
using namespace piper::runtime;
using piper::testing::Planner;

namespace {
struct Case {
  const char* strategy;
  int world;
  std::vector<std::string> sets;
  const char* model = "gpt8";
};

const std::vector<Case>& library() {
  static const std::vector<Case> cases = {
      {"single.piper", 1, {"mb=2"}},
      {"dp.piper", 2, {"dp=2"}},
      {"zero1.piper", 2, {"dp=2"}},
      {"zero2.piper", 4, {"dp=4"}},
      {"zero3.piper", 4, {"dp=4"}},
      {"gpipe.piper", 2, {"pp=2", "mb=4"}},
      {"1f1b.piper", 4, {"pp=4", "mb=8"}},
      {"interleaved_1f1b.piper", 2, {"pp=2", "v=2", "mb=4"}},
      {"zb1p.piper", 2, {"pp=2", "mb=4"}},
      {"dualpipev.piper", 2, {"pp=2", "mb=4"}},
      {"1f1b_dp.piper", 4, {"pp=2", "dp=2", "mb=2"}},
      {"1f1b_zero2.piper", 4, {"pp=2", "dp=2", "mb=2"}},
      {"1f1b_zero3.piper", 4, {"pp=2", "dp=2", "mb=2"}},
      {"dualpipev_ep.piper", 4, {"pp=2", "ep=2", "mb=4"}, "moe8"},
  };
  return cases;
}

// What runtime/stage_params allocates for a rank's held stages, from its view alone.
sched::ByCategory allocated(const RankView& v) {
  sched::ByCategory r{};
  auto put = [&](sched::MemCategory c, int64_t elems) { r[static_cast<size_t>(c)] += 4 * elems; };
  for (const auto& [s, sv] : v.stages) {
    const auto& f = *sv.facts;
    const int zero = sv.replicated() ? sv.zero() : 0;
    int64_t shards = 0;
    if (zero == 3)
      for (size_t u = 0; u < f.replication.units.size(); ++u) shards += sv.my_unit_shard(u).size();
    else if (zero > 0)
      for (size_t b = 0; b < f.replication.buckets.size(); ++b) shards += sv.my_shard(b).size();
    put(sched::MemCategory::Params, zero == 3 ? shards : f.dense_elems);
    put(sched::MemCategory::Grads, zero >= 2 ? shards : f.dense_elems);
    put(sched::MemCategory::Optimizer, 2 * (zero == 0 ? f.dense_elems : shards));
    for (const auto& [seg, ex] : sv.experts) {
      const int64_t elems = static_cast<int64_t>(ex.owned.size()) * ex.shard->member_bytes / 4;
      put(sched::MemCategory::Params, elems);
      put(sched::MemCategory::Grads, elems);
      put(sched::MemCategory::Optimizer, 2 * elems);
    }
  }
  return r;
}
}  // namespace

TEST_CASE("every rank's view agrees with every other rank's and with the memory model, for every library strategy") {
  for (const Case& c : library()) {
    CAPTURE(c.strategy);
    Planner f(c.model);
    auto plan = f.plan(fmt::format("use \"{}\";\n", c.strategy), c.sets, "", c.world);
    std::vector<RankView> views;
    for (int r = 0; r < c.world; ++r) views.push_back(make_rank_view(plan, r, c.world, 1 << 30));
    const auto& g = plan.dag;
    // Every send names the rank whose receive names it back, with the same tag.
    for (const auto& e : g.edges) {
      if (g.nodes[size_t(e.src)].op != ir::Op::Send || g.nodes[size_t(e.dst)].op != ir::Op::Recv) continue;
      for (const auto& v : views) {
        if (!v.mine(plan, e.src)) continue;
        auto [to, tag] = v.peers[size_t(e.src)];
        auto [from, tag2] = views[size_t(to)].peers[size_t(e.dst)];
        CHECK(from == v.rank);
        CHECK(tag == tag2);
      }
    }
    for (const auto& v : views) {
      CAPTURE(v.rank);
      // The memory model's resident state is what the executor's parameter store will allocate.
      CHECK(plan.memory[size_t(v.rank)].resident == allocated(v));
      for (const auto& [s, sv] : v.stages) {
        const auto& rep = sv.facts->replication;
        if (!sv.replicated()) continue;
        // Each group member's shards partition each bucket and unit; members agree on the group.
        CHECK(sv.dp_group.size() == size_t(rep.ways));
        for (size_t b = 0; b < rep.buckets.size(); ++b) {
          CHECK(sv.bucket_shards[b].front() == rep.buckets[b].begin);
          CHECK(sv.bucket_shards[b].back() == rep.buckets[b].end);
        }
        for (int peer : sv.dp_group) CHECK(views[size_t(peer)].stages.at(s).dp_group == sv.dp_group);
      }
    }
    // Expert ownership: the members of an expert group hold each list's members exactly once.
    std::map<std::pair<int32_t, int32_t>, std::multiset<int64_t>> held;
    for (const auto& v : views)
      for (const auto& [s, sv] : v.stages)
        for (const auto& [seg, ex] : sv.experts)
          if (v.rank == ex.group.front()) {
            for (int member : ex.group)
              for (int64_t e : views[size_t(member)].stages.at(s).experts.at(seg).owned) held[{s, seg}].insert(e);
            CHECK(held[{s, seg}].size() == ex.shard->members.size());
            CHECK(std::set<int64_t>(held[{s, seg}].begin(), held[{s, seg}].end()).size() == ex.shard->members.size());
          }
  }
}

TEST_CASE("message tags are checked against the communicator's limit") {
  Planner f;
  auto plan = f.plan("use \"1f1b.piper\";\n", {"pp=2", "mb=8"}, "", 2);
  CHECK_NOTHROW(make_rank_view(plan, 0, 2, 1 << 30));
  try {
    make_rank_view(plan, 0, 2, 7);
    FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("message tags") != std::string::npos);
    CHECK(std::string(e.what()).find("allows tags up to 7") != std::string::npos);
  }
}

TEST_CASE("a rank outside the plan's world is refused") {
  Planner f;
  auto plan = f.plan("use \"dp.piper\";\n", {"dp=2"}, "", 2);
  CHECK_THROWS_WITH(make_rank_view(plan, 0, 3, 1 << 30), doctest::Contains("the plan is for 2 ranks"));
}

TEST_CASE("`sms` on a stream limits the communicators of the collectives that run on it, and no others") {
  Planner f("moe8");
  // DualPipeV x EP with the experts' all-to-alls on a stream of their own, limited to 20
  // multiprocessors; the replicas' all-reduces stay on comm, unlimited.
  auto plan = f.plan("param ep = 2;\nuse \"dualpipev.piper\";\nmesh ep = ep;\nstream a2a;\n"
                     "replicate * over ep bucket 25MiB on stream comm;\n"
                     "shard layers[*].moe.experts over ep on stream a2a sms 20;\n",
                     {"pp=2", "mb=4"}, "", 4);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const RankView v = make_rank_view(plan, rank, 4, 1 << 30);
    REQUIRE(v.group_sms.size() == 1);
    const auto& [key, sms] = *v.group_sms.begin();
    CHECK(key.second == expert_channel(static_cast<ir::StreamId>(
                            std::find(plan.dag.streams.begin(), plan.dag.streams.end(), "a2a") - plan.dag.streams.begin())));
    CHECK(sms == 20);
    CHECK(v.groups.count(key) == 1);
    CHECK(std::find(key.first.begin(), key.first.end(), rank) != key.first.end());
  }
}
