// piper-tune's search on a toy cost model with a known optimum, under a memory budget, and the
// plan it writes (which must check to the same prediction).
#include "scheduler/tune.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "lang/model_shapes.h"
#include "tests/plan_fixture.h"

using namespace piper;
using namespace piper::sched;
using piper::testing::Planner;

namespace {
TuneOptions toy(int64_t np) {
  TuneOptions o;
  o.np = np;
  o.batch_size = 8;
  o.cost_spec = "F=1,B=2,W=1,comm=0";
  o.library = {"gpipe.piper", "1f1b.piper", "zb1p.piper"};
  o.search_path = {PIPER_STRATEGY_DIR};
  o.recompute = false;
  return o;
}
const Candidate* find(const std::vector<Candidate>& list, const std::string& label) {
  for (const auto& c : list)
    if (c.label() == label) return &c;
  return nullptr;
}
}  // namespace

TEST_CASE("piper-tune on unit costs finds the known optimum: ZB1P's split backward at the fewest microbatches") {
  Planner f("gpt8");
  const TuneResult r = tune(f.manifest, toy(2));
  REQUIRE(!r.ranked.empty());
  // Unit costs price a microbatch alike at any size, so fewer microbatches win; at pp=2 1F1B and
  // GPipe take (m + 1)(F + B) and ZB1P, whose weight gradients fill the drain, less.
  for (int64_t m : {1, 2, 4, 8}) {
    CAPTURE(m);
    const Candidate* c = find(r.ranked, fmt::format("1f1b pp=2 mb={}", m));
    REQUIRE(c);
    CHECK(c->step_time == doctest::Approx(3.0 * double(m + 1)));
    const Candidate* z = find(r.ranked, fmt::format("zb1p pp=2 mb={}", m));
    REQUIRE(z);
    CHECK(z->step_time < c->step_time);
  }
  CHECK(r.ranked.front().label() == "zb1p pp=2 mb=1");
  CHECK(r.ranked.front().step_time == doctest::Approx(5.0));
  for (size_t i = 1; i < r.ranked.size(); ++i) CHECK(r.ranked[i - 1].step_time <= r.ranked[i].step_time);
  // pp=1 has no pipeline to place: rejected by the checker, with its reason.
  CHECK(!r.rejected.empty());
  for (const auto& c : r.rejected) CHECK(!c.rejected.empty());
  // Deterministic: the same search ranks the same way.
  const TuneResult again = tune(f.manifest, toy(2));
  REQUIRE(again.ranked.size() == r.ranked.size());
  for (size_t i = 0; i < r.ranked.size(); ++i) CHECK(again.ranked[i].label() == r.ranked[i].label());
}

TEST_CASE("piper-tune under a memory budget: 1F1B's fewest activations win when ZB1P and GPipe do not fit") {
  Planner f("gpt8");
  const TuneResult all = tune(f.manifest, toy(2));
  const Candidate* m4 = find(all.ranked, "1f1b pp=2 mb=4");
  const Candidate* m2 = find(all.ranked, "1f1b pp=2 mb=2");
  const Candidate* z4 = find(all.ranked, "zb1p pp=2 mb=4");
  REQUIRE((m4 && m2 && z4));
  REQUIRE(m4->peak_bytes < m2->peak_bytes);  // 1F1B: smaller microbatches, less in flight
  REQUIRE(m4->peak_bytes < z4->peak_bytes);  // ZB1P: bounded too, but its weight halves lag
  TuneOptions o = toy(2);
  o.memory_budget = double(m4->peak_bytes + std::min(m2->peak_bytes, z4->peak_bytes)) / 2;
  const TuneResult r = tune(f.manifest, o);
  REQUIRE(!r.ranked.empty());
  CHECK(r.ranked.front().label() == "1f1b pp=2 mb=4");  // the fastest of what fits
  for (const auto& c : r.ranked) CHECK(double(c.peak_bytes) <= *o.memory_budget);
  CHECK(find(r.rejected, "zb1p pp=2 mb=1")->rejected.find("over the budget") != std::string::npos);
}

TEST_CASE("the plan piper-tune writes checks, and simulates to what it predicted") {
  for (const char* model : {"gpt8", "moe8"}) {
    CAPTURE(model);
    Planner f(model);
    TuneOptions o;
    o.np = 4;
    o.batch_size = 16;
    o.search_path = {PIPER_STRATEGY_DIR};  // the whole library
    const TuneResult r = tune(f.manifest, o);
    REQUIRE(!r.ranked.empty());
    std::vector<size_t> picks{0, r.ranked.size() / 2, r.ranked.size() - 1};
    for (size_t i = 0; i < r.ranked.size(); ++i)  // and a plan with recomputation
      if (r.ranked[i].recompute) {
        picks.push_back(i);
        break;
      }
    for (size_t i : picks) {
      const Candidate& c = r.ranked[i];
      CAPTURE(c.label());
      PlanOptions po;
      po.cmd.np = o.np;
      po.cmd.batch_size = o.batch_size;
      auto p = f.compile(candidate_text(c, model, o), po);
      REQUIRE_MESSAGE(p, f.errors());
      CHECK(p->schedule.step_time == doctest::Approx(c.step_time));
      int64_t peak = 0;
      for (const auto& u : p->memory) peak = std::max(peak, u.peak);
      CHECK(peak == c.peak_bytes);
      // The plan --report draws is the one the search ranked.
      std::string errors;
      const auto again = candidate_plan(c, f.manifest, o, &errors);
      REQUIRE_MESSAGE(again, errors);
      CHECK(again->hash == c.plan_hash);
      CHECK(again->schedule.step_time == c.step_time);
    }
  }
}

TEST_CASE("piper-tune with recomputation: it saves memory and costs time, and wins only under a budget") {
  Planner f("gpt8");
  TuneOptions o = toy(2);
  o.recompute = true;
  const TuneResult all = tune(f.manifest, o);
  const Candidate* plain = find(all.ranked, "1f1b pp=2 mb=2");
  const Candidate* rc = find(all.ranked, "1f1b pp=2 mb=2 +recompute");
  REQUIRE((plain && rc));
  CHECK(rc->peak_bytes < plain->peak_bytes);
  CHECK(rc->step_time > plain->step_time);
  CHECK(!all.ranked.front().recompute);  // without a budget, recomputing only costs
  // A budget just under the plain plan's peak: the recomputing one fits, and the plain one is
  // rejected for memory.
  o.memory_budget = double(plain->peak_bytes) - 1;
  const TuneResult tight = tune(f.manifest, o);
  CHECK(find(tight.ranked, "1f1b pp=2 mb=2 +recompute"));
  CHECK(find(tight.rejected, "1f1b pp=2 mb=2")->rejected.find("over the budget") != std::string::npos);
}

TEST_CASE("piper-tune cuts stages by cost where an even cut cannot be made, and drops a balanced twin of the even cut") {
  Planner f("gpt8");
  TuneOptions o = toy(3);
  o.library = {"1f1b.piper"};
  const TuneResult r = tune(f.manifest, o);
  // 8 layers cannot be cut evenly into 3 stages: the even plan is rejected with the checker's
  // reason, the balanced one is valid.
  const Candidate* even = find(r.rejected, "1f1b pp=3 mb=2");
  REQUIRE(even);
  CHECK(even->rejected.find("cannot be cut evenly") != std::string::npos);
  CHECK(find(r.ranked, "1f1b pp=3 mb=2 balance"));
  for (const auto& c : r.ranked) CHECK(c.label().find("pp=3") != std::string::npos);
  // At pp=1 there is nothing to cut: `balance` is not varied (no "pp=1 ... balance" candidate).
  for (const auto* list : {&r.ranked, &r.rejected})
    for (const auto& c : *list) CHECK(c.label().find("pp=1 mb=1 balance") == std::string::npos);

  // At pp=2 the balanced cut of gpt8 on unit costs is the even cut (4 + 4 layers, the embedding and
  // the head each a small part): the same plan, kept once under its plain name.
  const TuneResult two = tune(f.manifest, toy(2));
  CHECK(two.twins > 0);
  CHECK(find(two.ranked, "1f1b pp=2 mb=2"));
  CHECK(!find(two.ranked, "1f1b pp=2 mb=2 balance"));
}

TEST_CASE("piper-tune varies ZeRO-3's units and prefetch: the least memory per layer without prefetch, picked under a budget") {
  Planner f("gpt8");
  TuneOptions o = toy(2);
  o.library = {"zero3.piper"};
  const TuneResult all = tune(f.manifest, o);
  const Candidate* lean = find(all.ranked, "zero3 dp=2 ahead=0");
  const Candidate* ahead = find(all.ranked, "zero3 dp=2 ahead=1");
  const Candidate* stage = find(all.ranked, "zero3 dp=2 ahead=0 stage_unit");
  REQUIRE((lean && ahead && stage));
  // One layer in full at a time; one more with prefetch; the whole model as one unit.
  CHECK(lean->peak_bytes < ahead->peak_bytes);
  CHECK(ahead->peak_bytes < stage->peak_bytes);
  // With one unit there is nothing to gather ahead: stage_unit with ahead=1 is a twin, dropped.
  CHECK(!find(all.ranked, "zero3 dp=2 ahead=1 stage_unit"));
  CHECK(all.twins >= 1);
  o.memory_budget = double(lean->peak_bytes + ahead->peak_bytes) / 2;
  const TuneResult tight = tune(f.manifest, o);
  REQUIRE(tight.ranked.size() == 1);
  CHECK(tight.ranked.front().label() == "zero3 dp=2 ahead=0");
}

// piper-tune knows no parameter by name: a new declared domain in a strategy file is searched,
// and a parameter without one keeps its default.
TEST_CASE("a parameter a strategy file declares with values is searched, with no C++ change") {
  Planner f("gpt8");
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("piper-tune-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "mine.piper") << "param acc = 1 in {1, 2, 4};\nparam ways = 2 in divisors(world);\nparam fixed = 3;\n"
                                       "mesh dp = ways;\nsplit batch into acc;\nreplicate * over dp;\n";
  TuneOptions o = toy(2);
  o.library = {"mine.piper"};
  o.search_path = {dir.string(), PIPER_STRATEGY_DIR};
  const TuneResult r = tune(f.manifest, o);
  // acc over its list; ways over the divisors of 2 that make the mesh 2 ranks: only 2.
  for (int acc : {1, 2, 4}) CHECK(find(r.ranked, fmt::format("mine acc={} ways=2", acc)));
  CHECK(r.ranked.size() == 3);
  CHECK(r.rejected.empty());
  const auto params = strategy_params((dir / "mine.piper").string(), o.search_path, 2);
  REQUIRE(params.size() == 3);
  CHECK(params[0].values == std::vector<int64_t>{1, 2, 4});
  CHECK(params[1].sizes_mesh);
  CHECK(params[2].values.empty());  // no domain: not searched
  std::filesystem::remove_all(dir);
}

// Megatron's accounting, on a Llama shape (its regions say their work, so the H100 roofline prices
// them): three forwards of the manifest's FLOPs over the batch, per device per second, against the
// fp32 peak these fp32 plans run at; a roofline whose efficiencies are at most 1 never reaches it.
// The GPT manifest says no work: its plans run at the file's one rate, and no MFU is claimed.
TEST_CASE("piper-tune's model TFLOP/s and MFU: three forwards over the batch, against the peak the roofline priced") {
  ShapeConfig shape = *shape_preset("llama3-8b");
  shape.layers = 4, shape.seq = 1024;
  SourceManager sm;
  DiagnosticEngine diags(sm);
  const auto m = parse_manifest(sm.add("llama.json", shape_manifest_json(shape)), sm, diags);
  REQUIRE(m);
  TuneOptions o;
  o.np = 4;
  o.batch_size = 8;
  o.machine_path = PIPER_SOURCE_DIR "/machines/h100.json";
  o.library = {"1f1b_dp_tp.piper"};
  o.search_path = {PIPER_STRATEGY_DIR};
  o.recompute = false;
  const TuneResult r = tune(*m, o);
  REQUIRE(!r.ranked.empty());
  double forward = 0;
  for (RegionId x : m->sequence) forward += double(m->flops(x));
  for (const Candidate& c : r.ranked) {
    CAPTURE(c.label());
    CHECK(c.model_flops == doctest::Approx(3 * forward * 8));
    CHECK(c.peak_flops == doctest::Approx(6.7e13));
    CHECK(c.tflops_per_device(o.np) == doctest::Approx(c.model_flops / c.step_time / 4 / 1e12));
    CHECK(c.mfu(o.np) > 0);
    CHECK(c.mfu(o.np) < 1);
  }
  Planner f("gpt8");
  o.library = {"1f1b.piper"};
  const TuneResult gpt = tune(f.manifest, o);
  REQUIRE(!gpt.ranked.empty());
  CHECK(gpt.ranked.front().model_flops > 0);
  CHECK(gpt.ranked.front().peak_flops == 0);
  CHECK(gpt.ranked.front().mfu(o.np) == 0);
}
