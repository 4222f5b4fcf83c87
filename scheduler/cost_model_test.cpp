#include "scheduler/cost_model.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "tests/plan_fixture.h"

using namespace piper;
using namespace piper::sched;
using piper::testing::Planner;

namespace {
// A machine file as `piper-run --profile` writes it, for gpt8's regions: every region's chunk times
// are `fixed + per × samples` with the numbers below, and the calibration multiplies them.
std::string profiled_machine(const std::string& extra = "", bool all_regions = true) {
  std::string regions;
  for (std::string name : {"embed", "layers.0", "layers.1", "layers.2", "layers.3", "layers.4", "layers.5", "layers.6",
                           "layers.7", "head"}) {
    if (!all_regions && name == "layers.5") continue;
    regions += fmt::format(R"("{}": {{"F": [0.001, 0.002], "B": [0.002, 0.004], "BI": [0.001, 0.0025], "BW": [0.0005, 0.002]}},)",
                           name);
  }
  regions.pop_back();
  return fmt::format(R"({{"name": "test", "flops": 1e9, "memory_bytes": 1e10, "memory_bandwidth": 1e10,
    "link": {{"bandwidth": 1e9, "latency": 1e-5}}, "update": [0.0001, 1e-9],
    "calibration": {{"F": 1.5, "B": 2, "U": 1}}, "regions": {{{}}}{}}})",
                     regions, extra);
}

struct MachineFile {
  std::string path;
  explicit MachineFile(const std::string& text) : path(fmt::format("/tmp/piper_cost_model_test_{}.json", ::getpid())) {
    std::ofstream(path) << text;
  }
  ~MachineFile() { std::remove(path.c_str()); }
};

std::optional<Plan> compile(Planner& f, const std::string& strategy, const std::string& machine) {
  MachineFile file(machine);
  PlanOptions opt;
  opt.cmd.sets = {"pp=2", "mb=4"};
  opt.cmd.batch_size = 8;  // 2 samples per microbatch
  opt.machine_path = file.path;
  return f.compile(strategy, opt);
}

double cost_of(const Plan& p, const std::string& token) {
  for (const ir::Node& n : p.dag.nodes)
    if (ir::token(n) == token) return p.costs.cost(p.dag, n, 1);
  FAIL("no node " << token);
  return 0;
}
// 1F1B x ZeRO-3 (pp=2, both sends and collectives) priced by the profiled machine with collectives
// measured and `calibration` added to its calibration ("" for none).
std::optional<Plan> zero3_pipeline(Planner& f, const std::string& calibration) {
  std::string text = profiled_machine(R"(, "collectives": {"bandwidth": 1e9, "latency": 1e-5})");
  text.replace(text.find("\"U\": 1}"), 7, "\"U\": 1" + calibration + "}");
  return compile(f, "use \"1f1b_zero3.piper\";\n", text);
}
// Between the same plan priced without and with a calibration: every collective costs `collective`
// seconds more, every send `send` more (the plan has both).
void check_added(const Plan& plain, const Plan& calibrated, double collective, double send) {
  int collectives_seen = 0, sends_seen = 0;
  for (const ir::Node& n : plain.dag.nodes) {
    const double before = plain.costs.cost(plain.dag, n, 2), after = calibrated.costs.cost(calibrated.dag, n, 2);
    if (n.op == ir::Op::AllGather || n.op == ir::Op::ReduceScatter || n.op == ir::Op::AllReduce) {
      CHECK(after == doctest::Approx(before + collective));
      ++collectives_seen;
    } else if (n.op == ir::Op::Send) {
      CHECK(after == doctest::Approx(before + send));
      ++sends_seen;
    }
  }
  CHECK(collectives_seen > 0);
  CHECK(sends_seen > 0);
}
}  // namespace


TEST_CASE("measured region times price each piece: the sum of its regions at its microbatch size, calibrated") {
  Planner f("gpt8");
  auto p = compile(f, "use \"zb1p.piper\";\n", profiled_machine());
  REQUIRE_MESSAGE(p.has_value(), f.errors());
  CHECK(p->costs.measured(p->dag));
  // Stage 0 is embed + layers 0..3, stage 1 layers 4..7 + head: five regions each; 2 samples.
  const double F = 0.001 + 0.002 * 2, B = 0.002 + 0.004 * 2, BI = 0.001 + 0.0025 * 2, BW = 0.0005 + 0.002 * 2;
  CHECK(cost_of(*p, "0F0") == doctest::Approx(5 * 1.5 * F));
  CHECK(cost_of(*p, "1F0") == doctest::Approx(5 * 1.5 * F));
  // The first stage takes tokens: nothing for BI, the whole backward in BW.
  CHECK(cost_of(*p, "0BI0") == 0);
  CHECK(cost_of(*p, "0BW0") == doctest::Approx(5 * 2 * B));
  CHECK(cost_of(*p, "1BI0") == doctest::Approx(5 * 2 * BI));
  CHECK(cost_of(*p, "1BW0") == doctest::Approx(5 * 2 * BW));
}

TEST_CASE("the optimizer step is priced per parameter byte of the stage") {
  Planner f("gpt8");
  auto p = compile(f, "use \"1f1b.piper\";\n", profiled_machine());
  REQUIRE_MESSAGE(p.has_value(), f.errors());
  int64_t bytes = 0;
  for (const auto& sg : p->dag.stage(0).segments) bytes += sg.param_bytes;
  CHECK(cost_of(*p, "0U") == doctest::Approx(0.0001 + 1e-9 * double(bytes)));
}

TEST_CASE("a region the machine file does not list is priced by FLOPs, and the plan says it is not all measured") {
  Planner f("gpt8");
  auto p = compile(f, "use \"1f1b.piper\";\n", profiled_machine("", false));
  REQUIRE_MESSAGE(p.has_value(), f.errors());
  CHECK_FALSE(p->costs.measured(p->dag));
  CHECK(cost_of(*p, "0F0") == doctest::Approx(5 * 1.5 * (0.001 + 0.002 * 2)));  // stage 0 is all measured
}

TEST_CASE("a measured line below zero or a calibration that is not positive is refused") {
  Planner f("gpt8");
  std::string bad = profiled_machine();
  bad.replace(bad.find("[0.001, 0.002]"), 14, "[-0.001, 0.002]");
  CHECK_FALSE(compile(f, "use \"1f1b.piper\";\n", bad).has_value());
  CHECK(f.errors().find("regions.embed: expected") != std::string::npos);
  Planner g("gpt8");
  std::string zero = profiled_machine();
  zero.replace(zero.find("\"B\": 2"), 6, "\"B\": 0");
  CHECK_FALSE(compile(g, "use \"1f1b.piper\";\n", zero).has_value());
  CHECK(g.errors().find("\"calibration\"") != std::string::npos);
}

TEST_CASE("the calibrated collective time is added to every collective, the handoff time to every send") {
  Planner f("gpt8");
  auto plain = zero3_pipeline(f, "");
  REQUIRE_MESSAGE(plain, f.errors());
  struct Case {
    const char *key, *error;
    double collective, send;
  };
  for (const Case& c : {Case{"collective", "\"collective\" is the seconds added to each collective", 0.003, 0},
                        Case{"p2p", "\"p2p\" is the seconds added to each pipeline handoff", 0, 0.002}}) {
    CAPTURE(c.key);
    Planner g("gpt8");
    auto calibrated = zero3_pipeline(g, fmt::format(R"(, "{}": {})", c.key, c.collective + c.send));
    REQUIRE_MESSAGE(calibrated, g.errors());
    check_added(*plain, *calibrated, c.collective, c.send);
    // 1F1B's first forward of the last stage and its first backward of the first wait for a handoff
    // each: the step takes at least two of them longer.
    if (c.send > 0) CHECK(calibrated->schedule.step_time >= plain->schedule.step_time + 2 * c.send - 1e-9);
    Planner h("gpt8");
    CHECK_FALSE(zero3_pipeline(h, fmt::format(R"(, "{}": -1)", c.key)).has_value());
    CHECK(h.errors().find(c.error) != std::string::npos);
  }
}

// The machine file reaches the balanced cut through the plan compiler (the cut pass), once parsed,
// and the plan's strategy reports the stages it runs.
TEST_CASE("a machine file's region times cut a balanced placement, and the plan reports the stages it runs") {
  Planner f("gpt8");
  // Every region alike but the head, as dear as three blocks: its stage keeps one block.
  std::string m = profiled_machine();
  const std::string head = R"("head": {"F": [0.001, 0.002], "B": [0.002, 0.004])";
  m.replace(m.find(head), head.size(), R"("head": {"F": [0.003, 0.006], "B": [0.006, 0.012])");
  const std::string text = "mesh pp = 3;\nplace embed on pp = 0;\nplace layers[*] over pp balanced;\nplace head on pp = 2;\n";
  PlanOptions opt;
  opt.cmd.batch_size = 8;
  const auto by_flops = f.compile(text, opt);
  opt.machine_text = m;
  const auto measured = f.compile(text, opt);
  REQUIRE((by_flops && measured));
  auto last_stage = [](const Plan& p) { return p.dag.facts.stages.back().regions.size(); };
  CHECK(last_stage(*by_flops) == 3);  // layers 6, 7 and the head
  CHECK(last_stage(*measured) == 2);  // layer 7 and the head
  CHECK(measured->strategy.stages.back().regions == measured->dag.facts.stages.back().regions);
}

// Two tiers: what the plan's hosts say goes between hosts is priced on the machine's network, the
// rest on the link inside a host. 1f1b_dp with pp=2 × dp=2 on 2 hosts of 2 ranks keeps dp inside
// and sends pp across; the hosts come from --hosts (host_of) or the machine's ranks_per_host.
TEST_CASE("two tiers: handoffs and collectives that cross hosts are priced on the network, the rest inside") {
  const std::string net = R"(, "network": {"bandwidth": 1e6, "latency": 1e-3})";
  auto plan = [&](Planner& f, const std::string& strategy, const std::string& extra, std::vector<int32_t> host_of) {
    MachineFile file(profiled_machine(extra));
    PlanOptions opt;
    opt.cmd.sets = {"pp=2", "dp=2", "mb=2"};
    opt.cmd.batch_size = 8;
    opt.machine_path = file.path;
    opt.host_of = std::move(host_of);
    auto p = f.compile(strategy, opt);
    REQUIRE_MESSAGE(p, f.errors());
    return std::move(*p);
  };
  auto price = [](const Plan& p, ir::Op op) {
    for (const ir::Node& n : p.dag.nodes)
      if (n.op == op) return p.costs.cost(p.dag, n, 2);
    FAIL("no such node");
    return 0.0;
  };
  Planner a("gpt8"), b("gpt8"), c("gpt8"), d("gpt8");
  const Plan one = plan(a, "use \"1f1b_dp.piper\";\n", net, {});
  const Plan pp_across = plan(b, "use \"1f1b_dp.piper\";\n", net, {0, 0, 1, 1});
  const Plan dp_across = plan(c, "use \"dp.piper\";\nuse \"1f1b.piper\";\n", net, {0, 0, 1, 1});
  CHECK(pp_across.dag.facts.hosts.count == 2);
  CHECK(pp_across.dag.facts.hosts.axis_crosses == std::vector<uint8_t>{1, 0});  // mesh pp, dp
  CHECK(dp_across.dag.facts.hosts.axis_crosses == std::vector<uint8_t>{1, 0});  // mesh dp, pp
  CHECK(dp_across.dag.axis_name(0) == "dp");
  // The send's bytes over the network's 1 MB/s with its 1 ms, against the 1 GB/s link's 10 µs.
  const double send_in = price(one, ir::Op::Send), send_out = price(pp_across, ir::Op::Send);
  CHECK(send_in < 1e-4);
  CHECK(send_out > 1e-3);
  CHECK(price(dp_across, ir::Op::Send) == doctest::Approx(send_in));
  CHECK(price(pp_across, ir::Op::AllReduce) == doctest::Approx(price(one, ir::Op::AllReduce)));
  CHECK(price(dp_across, ir::Op::AllReduce) > 100 * price(one, ir::Op::AllReduce));
  // The machine's ranks_per_host places the world when the hosts are not given.
  const Plan by_machine = plan(d, "use \"1f1b_dp.piper\";\n", net + R"(, "ranks_per_host": 2)", {});
  CHECK(by_machine.dag.facts.hosts.host_of == std::vector<int32_t>{0, 0, 1, 1});
  CHECK(price(by_machine, ir::Op::Send) == doctest::Approx(send_out));
  // Collectives' own link between hosts (as --profile fits it to a ring's all-reduce) prices the
  // crossing all-reduce; sends across stay on the network's point-to-point figure.
  Planner e("gpt8");
  const Plan own = plan(e, "use \"dp.piper\";\nuse \"1f1b.piper\";\n",
                        net + R"(, "network_collectives": {"bandwidth": 1e12, "latency": 0})", {0, 0, 1, 1});
  CHECK(price(own, ir::Op::AllReduce) < price(dp_across, ir::Op::AllReduce) / 100);
  CHECK(price(own, ir::Op::Send) == doctest::Approx(price(dp_across, ir::Op::Send)));
}

namespace {
// Seconds of compute on rank 0 during which communication on `stream` runs on rank 0 too.
double overlapped(const Plan& p, const std::string& stream) {
  const int32_t cls = p.schedule.class_of_rank(0);
  const auto& g = p.dag;
  double sum = 0;
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    if (p.schedule.node_class[c] != cls || g.streams[g.nodes[c].stream] != "compute") continue;
    for (size_t m = 0; m < g.nodes.size(); ++m)
      if (p.schedule.node_class[m] == cls && g.streams[g.nodes[m].stream] == stream && !ir::is_chunk(g.nodes[m].op))
        sum += std::max(0.0, std::min(p.schedule.finish[c], p.schedule.finish[m]) - std::max(p.schedule.start[c], p.schedule.start[m]));
  }
  return sum;
}
}  // namespace

TEST_CASE("`sms`: compute beside a limited stream's communication runs slower by the share it holds, and past the device it is an error") {
  auto dp = [](const std::string& clause, const std::string& machine, Planner& f) {
    MachineFile file(machine);
    PlanOptions opt;
    opt.cmd.batch_size = 8;
    opt.machine_path = file.path;
    return f.compile("mesh dp = 2;\nreplicate * over dp bucket 64KiB on stream comm" + clause + ";\n", opt);
  };
  Planner a("gpt8"), b("gpt8"), c("gpt8"), d("gpt8");
  const std::string machine = profiled_machine(R"(, "sms": 100)");
  const auto free = dp("", machine, a);
  const auto limited = dp(" sms 25", machine, b);
  const auto unpriced = dp(" sms 25", profiled_machine(), c);  // the machine does not say how many it has
  REQUIRE(free);
  REQUIRE(limited);
  REQUIRE(unpriced);
  // The bucketed all-reduces run beside the backward; each second of it costs the compute 25/100 s.
  const double beside = overlapped(*free, "comm");
  CHECK(beside > 0);
  CHECK(limited->schedule.sms_delay == doctest::Approx(0.25 * beside));
  CHECK(limited->schedule.step_time > free->schedule.step_time);
  CHECK(limited->dag.facts.sms_of(1) == 25);  // comm: stream 1 of every graph (ir::Graph::streams)
  CHECK(unpriced->schedule.step_time == doctest::Approx(free->schedule.step_time));
  CHECK(unpriced->schedule.sms_delay == 0);
  // As many as the device has leaves none for compute: refused at the clause.
  CHECK_FALSE(dp(" sms 100", machine, d));
  CHECK(d.errors().find("stream 'comm' may use 100 multiprocessors, but a device of 'test' has 100 (none left for compute)") !=
        std::string::npos);
  CHECK(d.errors().find("<test>.piper:2:") != std::string::npos);
}

namespace {
// A device with round numbers: 100 SMs, 1 PFLOP/s bf16 at half efficiency for products, 3 TB/s.
Machine roofline_device() {
  Machine m;
  m.name = "round";
  m.sms = 100;
  m.memory_bandwidth = 3e12;
  m.roofline = Roofline{};
  m.roofline->peak_bf16 = 1e15;
  m.roofline->peak_fp32 = 1e14;
  m.roofline->gemm_efficiency = 0.5;
  m.roofline->tile_m = m.roofline->tile_n = 128;
  m.roofline->attention_forward = 0.6;
  m.roofline->attention_backward = 0.4;
  return m;
}
Work gemm(int64_t m, int64_t n, int64_t k, char shard = 0) {
  Work w;
  w.kind = Work::Kind::Gemm;
  w.m = m, w.n = n, w.k = k, w.shard = shard;
  return w;
}
// doctest's Approx adds 1 to the scale it compares against: at microseconds that is no check at all.
doctest::Approx exactly(double x) { return doctest::Approx(x).scale(0).epsilon(1e-9); }

}  // namespace

TEST_CASE("roofline: a product is compute-bound at its tile-quantized share of the SMs, a thin one streams its bytes") {
  const Machine d = roofline_device();
  // 1,280 × 12,800 output: 10 × 100 tiles of 128 × 128, ten full waves over 100 SMs.
  const Work w = gemm(1280, 12800, 4096);
  const double full = 2.0 * 1280 * 12800 * 4096 / (1e15 * 0.5);
  CHECK(roofline_seconds(d, w, ir::Op::F, 1, 1, true) == exactly(full));
  // One row more: an 11th row of tiles, an 11th wave, mostly empty.
  const double used = 1281.0 * 12800 / (11 * 100 * 128 * 128);
  CHECK(roofline_seconds(d, gemm(1281, 12800, 4096), ir::Op::F, 1, 1, true) ==
        exactly(2.0 * 1281 * 12800 * 4096 / (1e15 * 0.5 * used)));
  // The backward's two products: the input gradient [M×N]·[N×K] and the weight gradient [N×M]·[M×K].
  CHECK(roofline_seconds(d, w, ir::Op::B, 1, 1, true) ==
        exactly(roofline_seconds(d, w, ir::Op::BI, 1, 1, true) + roofline_seconds(d, w, ir::Op::BW, 1, 1, true)));
  // Column-parallel over tp = 2: half the output columns, half the time (still whole waves).
  CHECK(roofline_seconds(d, gemm(1280, 12800, 4096, 'n'), ir::Op::F, 1, 2, true) == exactly(full / 2));
  // fp32 runs at the fp32 peak.
  CHECK(roofline_seconds(d, w, ir::Op::F, 1, 1, false) == exactly(2.0 * 1280 * 12800 * 4096 / (1e14 * 0.5)));
  // One token through the same weights: reading the 4096 × 12800 bf16 matrix is the time.
  const double bytes = (1.0 * 4096 + 4096.0 * 12800 + 12800) * 2;
  CHECK(roofline_seconds(d, gemm(1, 12800, 4096), ir::Op::F, 1, 1, true) == exactly(bytes / 3e12));
}

TEST_CASE("roofline: a norm is priced by its bytes, read and written forward, twice that backward, nothing for weights") {
  const Machine d = roofline_device();
  Work norm;
  norm.kind = Work::Kind::Memory;
  norm.elements = 2048 * 4096;  // one sample's tokens × hidden
  const double f = 2.0 * 2048 * 4096 * 2 / 3e12;  // two samples, bf16
  CHECK(roofline_seconds(d, norm, ir::Op::F, 2, 1, true) == exactly(f));
  CHECK(roofline_seconds(d, norm, ir::Op::B, 2, 1, true) == exactly(2 * f));
  CHECK(roofline_seconds(d, norm, ir::Op::BW, 2, 1, true) == 0);
  // In fp32 the same elements are twice the bytes.
  CHECK(roofline_seconds(d, norm, ir::Op::F, 2, 1, false) == exactly(2 * f));
}

TEST_CASE("roofline: causal attention grows with the square of the sequence, and at 8k tokens it is over a tenth of a layer") {
  const Machine d = roofline_device();
  auto attention = [](int64_t seq) {
    Work w;
    w.kind = Work::Kind::Attention;
    w.heads = 32, w.head_dim = 128, w.v_dim = 128, w.q = seq, w.kv = seq, w.causal = true;
    return w;
  };
  const double at2k = roofline_seconds(d, attention(2048), ir::Op::F, 1, 1, true);
  const double at8k = roofline_seconds(d, attention(8192), ir::Op::F, 1, 1, true);
  // Scores and values: 2 × q × kv × heads × (head_dim + v_dim) FLOPs, half under the causal mask.
  CHECK(at2k == exactly(2.0 * 2048 * 2048 * 32 * 256 / 2 / (1e15 * 0.6)));
  CHECK(at8k == exactly(16 * at2k));
  // The backward: 2.5 forwards' FLOPs (FlashAttention's recomputation) at the backward's efficiency.
  CHECK(roofline_seconds(d, attention(8192), ir::Op::B, 1, 1, true) == exactly(2.5 * at8k * 0.6 / 0.4));
  // A Llama-3 8B layer's products per sample (q, kv, o, gate+up, down) at sequence s. Per token
  // they are 2 × 218M FLOPs; causal attention is 2 × s × 4096 (17M at 2k, 67M at 8k): its share of
  // the layer's forward grows from a few percent at 2k to over a tenth at 8k.
  auto products = [&](int64_t s) {
    double t = 0;
    for (const Work& w : {gemm(s, 4096, 4096), gemm(s, 2048, 4096), gemm(s, 4096, 4096), gemm(s, 28672, 4096), gemm(s, 4096, 14336)})
      t += roofline_seconds(d, w, ir::Op::F, 1, 1, true);
    return t;
  };
  const double share2k = at2k / (at2k + products(2048)), share8k = at8k / (at8k + products(8192));
  MESSAGE("attention share of a Llama-3 8B layer's forward: ", share2k, " at 2k, ", share8k, " at 8k");
  CHECK(share2k > 0.02);
  CHECK(share2k < 0.06);
  CHECK(share8k > 0.09);
  CHECK(share8k < 0.2);
}

// ranks_per_host puts a dp group of 8 inside one node (NVLink) or a group of 16 over two (each
// member's NIC carries its share); with one rank per host every hop crosses at one NIC's bandwidth.
TEST_CASE("collectives are priced on the tiers their group spans: inside a node, across nodes on its members' NICs") {
  const std::string node = R"({"name": "node", "flops": 1e14, "memory_bytes": 1e11, "memory_bandwidth": 1e12,
    "link": {"bandwidth": 4e11, "latency": 2e-6}, "network": {"bandwidth": 4e10, "latency": 5e-6}, "ranks_per_host": )";
  auto all_reduce = [&](int dp, int per_host, const std::string& model) {
    Planner f(model);
    MachineFile file(node + std::to_string(per_host) + "}");
    PlanOptions opt;
    opt.cmd.batch_size = 16;
    opt.machine_path = file.path;
    auto p = f.compile(fmt::format("mesh dp = {};\nreplicate * over dp;\n", dp), opt);
    REQUIRE_MESSAGE(p, f.errors());
    for (const ir::Node& n : p->dag.nodes)
      if (n.op == ir::Op::AllReduce) return std::pair{p->costs.cost(p->dag, n, dp), static_cast<double>(n.bytes)};
    FAIL("no all-reduce");
    return std::pair{0.0, 0.0};
  };
  const auto [inside, b] = all_reduce(8, 8, "gpt8");
  CHECK(inside == exactly(2 * 7 * 2e-6 + 2 * 7.0 / 8 * b / 4e11));  // a ring on NVLink
  // Two nodes of 8: the ring's network hops carry an inside hop's share over 8 NICs; log2(16) steps.
  const auto [two_nodes, b16] = all_reduce(16, 8, "gpt8");
  CHECK(b16 == b);
  CHECK(two_nodes == exactly(2 * 4 * 5e-6 + 2 * 15.0 / 16 * b / std::min(4e11, 8 * 4e10)));
  // Sixteen hosts of one: each rank's own NIC carries it all, ten times slower than NVLink.
  const auto [spread, unused] = all_reduce(16, 1, "gpt8");
  CHECK(spread == exactly(2 * 4 * 5e-6 + 2 * 15.0 / 16 * b / 4e10));
  // Past the same latency, its bandwidth term is 8 times two nodes': one NIC where those had eight.
  CHECK(spread - 2 * 4 * 5e-6 == exactly(8 * (two_nodes - 2 * 4 * 5e-6)));
}
