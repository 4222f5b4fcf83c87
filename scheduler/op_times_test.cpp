#include "scheduler/op_times.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/plan_fixture.h"

using namespace piper;
using namespace piper::sched;
using piper::testing::Planner;

namespace {
// A trace as piper-run writes it: complete events in microseconds, the stream as tid, the step in args.
std::string event(int rank, const char* stream, const std::string& name, double us, int step) {
  return fmt::format(R"({{"ph": "X", "pid": {}, "tid": "{}", "name": "{}", "ts": 0, "dur": {}, "args": {{"step": {}}}}})",
                     rank, stream, name, us, step);
}
std::string trace(const std::vector<std::string>& events) {
  std::string out = R"({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0},)";
  for (const auto& e : events) out += e + ",";
  out.back() = ']';
  return out + "}";
}
// 1F1B pp=2 mb=4 under unit costs F=1, B=2.
sched::PlanOptions unit_1f1b() {
  sched::PlanOptions opt;
  opt.cmd.sets = {"pp=2", "mb=4"};
  opt.cost_spec = "F=1,B=2,W=1,comm=0";
  return opt;
}
}  // namespace

TEST_CASE("a run's trace gives each compute op its median over the steps from the first one read, on all ranks") {
  std::string error;
  const auto t = op_times_from_trace(trace({event(0, "compute", "0F0", 9000, 1),  // a warm-up step: not read
                                            event(0, "compute", "0F0", 1000, 4), event(0, "compute", "0F0", 3000, 5),
                                            event(1, "compute", "0F0", 2000, 4),  // a replica's, on rank 1
                                            event(0, "comm", "0SEND_F0", 5000, 4), event(1, "compute", "1BI0.s1", 700, 6)}),
                                     {4}, &error);
  CHECK(error.empty());
  REQUIRE(t.size() == 2);  // the send is communication: priced by the machine, not by the run
  CHECK(t.at("0F0") == doctest::Approx(0.002));
  CHECK(t.at("1BI0.s1") == doctest::Approx(0.0007));
  // One step: its own times.
  const auto five = op_times_from_trace(trace({event(0, "compute", "0F0", 1000, 4), event(0, "compute", "0F0", 3000, 5),
                                               event(0, "compute", "0F0", 8000, 6)}),
                                        {5, 5}, &error);
  REQUIRE(five.size() == 1);
  CHECK(five.at("0F0") == doctest::Approx(0.003));
}

TEST_CASE("text that is not a trace, or holds no compute at the steps read, is refused with the reason") {
  std::string error;
  CHECK(op_times_from_trace("{\"traceEvents\": [", {}, &error).empty());
  CHECK(error.find("not a trace") != std::string::npos);
  error.clear();
  CHECK(op_times_from_trace(R"({"other": []})", {}, &error).empty());
  CHECK(error.find("traceEvents") != std::string::npos);
  error.clear();
  CHECK(op_times_from_trace(trace({event(0, "compute", "0F0", 1000, 2)}), {4}, &error).empty());
  CHECK(error == "the trace holds no compute op at step 4 or later");
  CHECK(op_times_from_trace(trace({event(0, "compute", "0F0", 1000, 2)}), {3, 5}, &error).empty());
  CHECK(error == "the trace holds no compute op in steps 3 to 5");
  error.clear();
  CHECK(read_op_times("/nonexistent/trace.json", {4}, &error).empty());
  CHECK(error == "cannot read it");
}

// The simulation on measured times: the chunks they name cost what the run took, the rest as the
// units say, and the schedule follows. 1F1B pp=2 mb=4 under F=1, B=2: stage 1's forwards measured 3
// units each make the step 4 x 2 = 8 units longer (stage 1 runs 4 forwards and 4 backwards in a row
// once filled, and stage 0 waits on each of its handoffs).
TEST_CASE("measured chunk times replace the model's for the chunks they name, and the schedule follows") {
  Planner f("gpt8");
  sched::PlanOptions opt = unit_1f1b();
  auto plain = f.compile("use \"1f1b.piper\";\n", opt);
  REQUIRE_MESSAGE(plain.has_value(), f.errors());
  for (int i = 0; i < 4; ++i) opt.measured_ops[fmt::format("1F{}", i)] = 3;
  auto measured = f.compile("use \"1f1b.piper\";\n", opt);
  REQUIRE_MESSAGE(measured.has_value(), f.errors());
  for (const ir::Node& n : measured->dag.nodes) {
    const double before = plain->costs.cost(plain->dag, n, 1), after = measured->costs.cost(measured->dag, n, 1);
    if (n.op == ir::Op::F && n.stage == 1) CHECK(after == 3);
    else CHECK(after == before);
  }
  CHECK(measured->schedule.step_time == doctest::Approx(plain->schedule.step_time + 8));
}

// What runs is the plan's programs (piper-run schedules on the machine file, not on the trace), so
// the measured times re-time those programs; they are not scheduled afresh. 1F1B pp=2 mb=4 under
// unit costs runs stage 0 as 0F0 0F1 0B0 0F2 0B1 ...; with stage 1 nearly free and 0B0 long, 0B1 is
// ready before 0B0 ends, and a fresh schedule would run it before 0F2 (backward first on a tie).
TEST_CASE("measured times re-time the plan's own programs, in their order, not a fresh schedule") {
  Planner f("gpt8");
  sched::PlanOptions opt = unit_1f1b();
  auto plain = f.compile("use \"1f1b.piper\";\n", opt);
  REQUIRE_MESSAGE(plain.has_value(), f.errors());
  for (int i = 0; i < 4; ++i) opt.measured_ops[fmt::format("1F{}", i)] = opt.measured_ops[fmt::format("1B{}", i)] = 0.01;
  opt.measured_ops["0B0"] = 5;
  auto measured = f.compile("use \"1f1b.piper\";\n", opt);
  REQUIRE_MESSAGE(measured.has_value(), f.errors());
  auto order = [](const Plan& p, int32_t rank) {
    std::vector<std::string> out;
    const ClassProgram& c = p.schedule.classes[static_cast<size_t>(p.schedule.class_of_rank(rank))];
    for (const StreamProgram& s : c.streams)
      if (p.dag.streams[static_cast<size_t>(s.stream)] == "compute")
        for (ir::NodeId v : s.ops) out.push_back(ir::token(p.dag.nodes[static_cast<size_t>(v)]));
    return fmt::format("{}", fmt::join(out, " "));
  };
  CHECK(order(*plain, 0) == "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3 0U");
  CHECK(order(*measured, 0) == order(*plain, 0));
  CHECK(order(*measured, 1) == order(*plain, 1));
  // Scheduled afresh on the same costs, the order would not be the one that ran.
  auto fresh = schedule(measured->dag, measured->costs, f.diags);
  REQUIRE(fresh.has_value());
  Plan other = *measured;
  other.schedule = *fresh;
  CHECK(order(other, 0) != order(*plain, 0));
}
