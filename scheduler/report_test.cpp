#include "scheduler/report.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "ir/emit.h"
#include "scheduler/emit.h"
#include "tests/plan_fixture.h"

using namespace piper;
using namespace piper::sched;
using piper::testing::Planner;
using nlohmann::json;

namespace {
// 1F1B × ZeRO-1 × TP, pp=2 dp=2 tp=2 on gpt8 over 2 hosts of 4 ranks on the H100 file: tp inside a
// host, dp inside, pp across; every tier has traffic.
Plan three_d(Planner& f) {
  PlanOptions opt;
  opt.cmd.sets = {"pp=2", "dp=2", "tp=2", "mb=4"};
  opt.cmd.batch_size = 16;
  opt.machine_path = PIPER_SOURCE_DIR "/machines/h100.json";
  opt.host_of = {0, 0, 0, 0, 1, 1, 1, 1};
  auto p = f.compile("use \"1f1b_dp_tp.piper\";\n", opt);
  REQUIRE_MESSAGE(p, f.errors());
  return std::move(*p);
}
}  // namespace

// The page draws from this data, and the browser test compares the page with --emit sim-json; here
// the data itself is compared with sim-json and with the plan it came from.
TEST_CASE("the report's data: the simulated step, each program's memory and busy time as sim-json says") {
  Planner f("gpt8");
  const Plan p = three_d(f);
  const json r = json::parse(report_json(p, {"3d.piper", "gpt8.json", "h100.json", 80.0 * (1 << 30), 16}));
  const json sim = json::parse(emit_sim_json(p.dag, p.schedule, p.memory));
  CHECK(r["step_time"].get<double>() == sim["step_time"].get<double>());
  CHECK(r["eval_step_time"].get<double>() == sim["eval_step_time"].get<double>());
  std::set<int64_t> covered;
  for (const json& c : r["classes"]) {
    const int64_t shown = c["shown_rank"];
    const json& rank = sim["ranks"][static_cast<size_t>(shown)];
    CHECK(c["peak_bytes"] == rank["peak_bytes"]);
    CHECK(c["by_category"] == rank["by_category"]);
    CHECK(c["busy"].get<double>() == rank["busy"].get<double>());
    CHECK(c["idle"].get<double>() == rank["idle"].get<double>());
    const ClassProgram& cls = p.schedule.classes[static_cast<size_t>(p.schedule.class_of_rank(static_cast<int32_t>(shown)))];
    CHECK(c["ranks"] == ir::rank_list(cls.ranks));
    for (int32_t x : cls.ranks) {
      covered.insert(x);
      CHECK(p.memory[static_cast<size_t>(x)].peak <= c["peak_bytes"].get<int64_t>());  // the fullest is shown
    }
    size_t ops = 0;
    for (const json& s : c["streams"]) ops += s["ops"].size();
    size_t planned = 0;
    for (const StreamProgram& s : cls.streams) planned += s.ops.size();
    CHECK(ops == planned);
  }
  CHECK(covered.size() == 8);
}

// Communication per tier: the nodes' bytes on the tier on_network says, and the tensor-parallel
// sums inside the pieces as the cost model prices them.
TEST_CASE("the report's communication: each tier's bytes are the plan's, tp sums inside a host, pp across") {
  Planner f("gpt8");
  const Plan p = three_d(f);
  const json r = json::parse(report_json(p, {"3d.piper", "gpt8.json", "h100.json", 0, 0}));
  const json& first = r["classes"][0];
  const int32_t cls = p.schedule.class_of_rank(first["shown_rank"].get<int32_t>());
  std::map<std::string, double> expected;  // tier -> bytes
  for (const StreamProgram& s : p.schedule.classes[static_cast<size_t>(cls)].streams)
    for (ir::NodeId v : s.ops) {
      const ir::Node& n = p.dag.nodes[static_cast<size_t>(v)];
      if (ir::is_chunk(n.op)) {
        const CostModel::PieceTraffic tp = p.costs.piece_traffic(p.dag, n);
        expected[tp.on_network ? "across hosts" : "inside a host"] += tp.bytes + tp.gathered;
      }
      else if (n.op != ir::Op::Recv) expected[on_network(p.dag, n) ? "across hosts" : "inside a host"] += double(n.bytes);
    }
  std::map<std::string, double> got;
  std::set<std::string> across_axes;
  for (const json& row : first["comm"]) {
    got[row["tier"]] += row["bytes"].get<double>();
    if (row["tier"] == "across hosts") across_axes.insert(row["axis"].get<std::string>());
    if (row["op"] == "all_reduce (in pieces)") {
      CHECK(row["axis"] == "tp");
      CHECK(row["tier"] == "inside a host");
      CHECK(row["seconds"].get<double>() > 0);
    }
  }
  CHECK(expected.size() == 2);
  for (const auto& [tier, bytes] : expected) CHECK(got[tier] == doctest::Approx(bytes).epsilon(1e-12));
  CHECK(across_axes == std::set<std::string>{"pp"});
  const json& axes = r["mesh"]["axes"];
  REQUIRE(axes.size() == 3);
  CHECK(axes[0]["name"] == "pp");
  CHECK(axes[0]["crosses"] == true);
  CHECK(axes[2]["roles"] == json::array({"tensor"}));
  CHECK(axes[2]["stride"] == 1);
  CHECK(r["mesh"]["first_hosts"][1] == json::array({4, 5, 6, 7}));
}

// One file, nothing fetched: the data is inside, and a "</script>" in a user's file name cannot end it.
TEST_CASE("the report page is self-contained and its data cannot close the script that holds it") {
  Planner f("gpt8");
  const Plan p = f.plan("use \"1f1b.piper\";\n", {"pp=2", "mb=4"}, "F=1,B=2,W=1,comm=0");
  const std::string page = emit_report_html(p, {"a</script><b>.piper", "gpt8.json", "", 0, 0});
  CHECK(page.find("{{PLAN_DATA}}") == std::string::npos);
  CHECK(page.find("a<\\/script><b>.piper") != std::string::npos);
  CHECK(page.find("</script><b>") == std::string::npos);
  for (const char* remote : {"https://", "src=", "@import", "url("}) CHECK_MESSAGE(page.find(remote) == std::string::npos, remote);
  // The only address is SVG's namespace, which names and fetches nothing.
  CHECK(page.find("http://") == page.find("http://www.w3.org/2000/svg"));
  CHECK(page.find("http://", page.find("http://") + 1) == std::string::npos);
}
