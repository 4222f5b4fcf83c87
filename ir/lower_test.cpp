#include "ir/lower.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "ir/emit.h"
#include "ir/verifier.h"
#include "tests/lang_fixture.h"

using namespace piper;
using namespace piper::ir;
using piper::testing::Front;

namespace {
// Checks a strategy and lowers it with the verifier after every pass.
Graph lowered(Front& f, const std::string& text, CommandLine cmd = {}, bool global_norm = false) {
  auto s = f.check(text, cmd);
  REQUIRE_MESSAGE(s, f.errors());
  LowerOptions opt;
  opt.verify_each = true;
  opt.global_norm = global_norm;
  auto g = lower(*s, f.manifest, f.diags, opt);
  REQUIRE_MESSAGE(g, f.errors());
  return std::move(*g);
}

std::map<std::string, int> census(const Graph& g) {
  std::map<std::string, int> out;
  for (const Node& n : g.nodes) {
    std::string t = token(n);
    size_t i = 0;
    while (i < t.size() && isdigit(static_cast<unsigned char>(t[i]))) ++i;
    size_t j = i;
    while (j < t.size() && (isupper(static_cast<unsigned char>(t[j])) || t[j] == '_' || (t[j] == '2' && t[j - 1] == 'A'))) ++j;
    out[t.substr(i, j - i)]++;
  }
  return out;
}

const Node& find(const Graph& g, const std::string& tok) {
  for (const Node& n : g.nodes)
    if (token(n) == tok) return n;
  FAIL("no node " << tok);
  return g.nodes.front();
}

bool has(const Node& n, NodeFlag f) { return (n.flags & f) != 0; }

int temporal_edges(const Graph& g) {
  return static_cast<int>(std::count_if(g.edges.begin(), g.edges.end(), [](const Edge& e) { return e.kind == EdgeKind::Temporal; }));
}
}  // namespace

TEST_CASE("build: one device is a forward, a backward and an update") {
  Front f;
  Graph g = lowered(f, "split batch into 1;\n");
  CHECK(census(g) == std::map<std::string, int>{{"F", 1}, {"B", 1}, {"U", 1}});
  CHECK(find(g, "0F0").bytes == f.manifest.param_bytes(0));
}

TEST_CASE("split copies the forward and backward per microbatch, all into one update") {
  Front f;
  Graph g = lowered(f, "split batch into 3;\n");
  CHECK(census(g) == std::map<std::string, int>{{"F", 3}, {"B", 3}, {"U", 1}});
}

TEST_CASE("1F1B over pp=2 with 4 microbatches: chunks, paired send/recv, temporal edges") {
  Front f;
  CommandLine cmd;
  cmd.sets = {"pp=2", "mb=4"};
  Graph g = lowered(f, "use \"1f1b.piper\";\n", cmd);
  auto c = census(g);
  CHECK(c["F"] == 8);
  CHECK(c["B"] == 8);
  CHECK(c["U"] == 2);
  CHECK(c["SEND_F"] == 4);
  CHECK(c["RECV_F"] == 4);
  CHECK(c["SEND_B"] == 4);
  CHECK(c["RECV_B"] == 4);
  CHECK(g.ranks(find(g, "0SEND_F2").ranks) == std::vector<int32_t>{0});
  CHECK(g.ranks(find(g, "1RECV_F2").ranks) == std::vector<int32_t>{1});
  CHECK(g.streams[find(g, "0SEND_F2").stream] == "p2p_send");
  CHECK(g.streams[find(g, "1RECV_F2").stream] == "p2p_recv");
  // fwd->fwd and bwd->bwd chains (3 per stage each) plus the 1F1B bound (2 + 3).
  CHECK(temporal_edges(g) == 2 * 3 * 2 + 2 + 3);
  // The activation crossing the cut is a [64, 64] float32 sample.
  CHECK(find(g, "0SEND_F0").bytes == 64 * 64 * 4);
}

TEST_CASE("data parallelism: one all-reduce per bucket over dp, after every backward") {
  Front f;
  Graph g = lowered(f, "mesh dp = 2;\nsplit batch into 2;\nreplicate * over dp bucket 512KiB;\n");
  const int64_t total = f.manifest.param_bytes(0);
  int64_t sum = 0;
  int buckets = 0;
  for (const Node& n : g.nodes)
    if (n.op == Op::AllReduce) {
      sum += n.bytes, ++buckets;
      CHECK(g.ranks(n.ranks) == std::vector<int32_t>{0, 1});
      CHECK(g.axis_name(n.axis) == "dp");
    }
  CHECK(buckets == (total + (512 << 10) - 1) / (512 << 10));
  CHECK(sum == total);
}

TEST_CASE("ZeRO-3 gathers each unit per microbatch and direction, frees it after, reduce-scatters per microbatch") {
  Front f;
  Graph g = lowered(f, "mesh dp = 2;\nsplit batch into 2;\nreplicate * over dp zero 3;\n");
  // gpt8: embed, 8 layers, head — one unit (and one piece) each.
  const auto& facts = g.stage(0);
  REQUIRE(facts.replication.units.size() == 10);
  CHECK(facts.segments.size() == 10);
  CHECK(facts.replication.buckets.front() == facts.replication.units.back());  // reduced last-first
  auto c = census(g);
  CHECK(c["ALLGATHER_PF"] == 20);
  CHECK(c["ALLGATHER_PB"] == 20);
  CHECK(c["REDUCESCATTER_G"] == 20);
  CHECK(c.count("ALLGATHER_P") == 0);  // parameters stay sharded between steps
  CHECK(has(find(g, "0ALLGATHER_PF1.b3"), kMaterialize));
  CHECK(has(find(g, "0F1.s3"), kFreeParams));
  CHECK(has(find(g, "0REDUCESCATTER_G1.b0"), kShardGrads));
  // One unit of prefetch: the gather for piece 3 waits for piece 1; the first two wait for nothing.
  auto preds = [&](const std::string& tok) {
    std::vector<std::string> out;
    for (const Edge& e : g.edges)
      if (token(g.nodes[static_cast<size_t>(e.dst)]) == tok) out.push_back(token(g.nodes[static_cast<size_t>(e.src)]));
    return out;
  };
  CHECK(preds("0ALLGATHER_PF1.b3") == std::vector<std::string>{"0F1.s1"});
  CHECK(preds("0ALLGATHER_PF1.b1").empty());
  CHECK(preds("0ALLGATHER_PB1.b7") == std::vector<std::string>{"0B1.s9"});
}

TEST_CASE("ZeRO-1 reduce-scatters once and all-gathers after the update") {
  Front f;
  Graph g = lowered(f, "mesh dp = 2;\nsplit batch into 4;\nreplicate * over dp zero 1;\n");
  auto c = census(g);
  CHECK(c["REDUCESCATTER_G"] == 1);
  CHECK(c["ALLGATHER_P"] == 1);
}

TEST_CASE("pipeline × ZeRO-2: per stage and microbatch reduce-scatters on the stage's dp group") {
  Front f;
  CommandLine cmd;
  cmd.sets = {"pp=2", "dp=2", "mb=2"};
  Graph g = lowered(f, "use \"1f1b_zero2.piper\";\n", cmd);
  CHECK(census(g)["REDUCESCATTER_G"] == 4);
  // pp is declared first, so it varies slowest: stage 0 lives on ranks 0 and 1.
  CHECK(g.ranks(find(g, "0REDUCESCATTER_G1.b0").ranks) == std::vector<int32_t>{0, 1});
  CHECK(g.ranks(find(g, "1REDUCESCATTER_G1.b0").ranks) == std::vector<int32_t>{2, 3});
  CHECK(g.ranks(find(g, "0SEND_F1").ranks) == std::vector<int32_t>{0, 1});
}

TEST_CASE("expert parallelism: all-to-all around every layer's experts, forward and backward") {
  Front f("moe8");
  Graph g = lowered(f, "mesh ep = 2;\nsplit batch into 2;\nreplicate * over ep;\nshard layers[*].moe.experts over ep;\n");
  auto c = census(g);
  // 8 layers × 2 microbatches, dispatch and combine, in each direction.
  CHECK(c["A2A_DF"] == 16);
  CHECK(c["A2A_CF"] == 16);
  CHECK(c["A2A_DB"] == 16);
  CHECK(c["A2A_CB"] == 16);
  const RegionId experts = *f.manifest.find("layers.0.moe.experts");
  CHECK(find(g, "0F0.s1").bytes == f.manifest.param_bytes(experts) / 2);
  // The all-reduce over ep skips the experts (they are sharded, not replicated, over ep).
  int64_t reduced = 0;
  for (const Node& n : g.nodes)
    if (n.op == Op::AllReduce) reduced += n.bytes;
  int64_t expert_bytes = 0;
  for (int l = 0; l < 8; ++l) expert_bytes += f.manifest.param_bytes(*f.manifest.find(fmt::format("layers.{}.moe.experts", l)));
  CHECK(reduced == f.manifest.param_bytes(0) - expert_bytes);
}

// The design card's line: `on stream` after an order puts the ordered tasks' exchanges on that
// stream, where one's all-to-all can run while the other computes; their pieces stay on compute.
TEST_CASE("an order's stream takes its tasks' all-to-alls, and the tasks' pieces stay on the compute stream") {
  Front f("moe8");
  Graph g = lowered(f, "mesh ep = 2;\nsplit batch into 4;\nstream a2a_f, a2a_b;\nreplicate * over ep;\n"
                       "shard layers[*].moe.experts over ep;\norder fwd(i) || bwd(i - 1) on stream comm;\n"
                       "order fwd(3) on stream a2a_f;\norder bwd(3) on stream a2a_b;\n");
  auto stream_of = [&](const std::string& token) { return g.streams[find(g, token).stream]; };
  for (const char* piece : {"0F1.s0", "0F1.s1", "0B0.s1", "0F3.s2", "0B3.s2"}) CHECK_MESSAGE(stream_of(piece) == "compute", piece);
  for (const char* a2a : {"0A2A_DF1.s1", "0A2A_CF1.s1", "0A2A_DB0.s1", "0A2A_CB2.s1"}) CHECK_MESSAGE(stream_of(a2a) == "comm", a2a);
  CHECK(stream_of("0A2A_DF3.s1") == "a2a_f");  // the later order wins for microbatch 3
  CHECK(stream_of("0A2A_CB3.s1") == "a2a_b");
  // An order without a stream moves nothing: the exchanges stay where `shard` put them (comm).
  Front h("moe8");
  Graph plain = lowered(h, "mesh ep = 2;\nsplit batch into 4;\nreplicate * over ep;\nshard layers[*].moe.experts over ep;\n"
                           "order fwd(i) || bwd(i - 1);\n");
  CHECK(plain.streams[find(plain, "0A2A_DF1.s1").stream] == "comm");
  CHECK(plain.streams[find(plain, "0F1.s1").stream] == "compute");
}

TEST_CASE("zero-bubble: backwards named as bwd_input/bwd_weight split, weights feed the update") {
  Front f;
  CommandLine cmd;
  cmd.sets = {"pp=2", "mb=4"};
  Graph g = lowered(f, "use \"zb1p.piper\";\n", cmd);
  auto c = census(g);
  CHECK(c.count("B") == 0);
  CHECK(c["BI"] == 8);
  CHECK(c["BW"] == 8);
  CHECK(c["SEND_B"] == 4);
}

TEST_CASE("interleaved placement: chunk index per rank, overlap groups from ||") {
  Front f;
  CommandLine cmd;
  cmd.sets = {"pp=2", "v=2", "mb=2"};
  Graph g = lowered(f, "use \"interleaved_1f1b.piper\";\n", cmd);
  CHECK(find(g, "2F0").chunk == 1);
  CHECK(g.ranks(find(g, "2F0").ranks) == std::vector<int32_t>{0});
  Front h;
  Graph d = lowered(h, "mesh pp = 2;\nsplit batch into 4;\nplace embed on pp = 0;\nplace layers over pp vshape;\n"
                       "place head on pp = 0;\n"
                       "order fwd(0, 1) || bwd(3, 0);\n");
  CHECK(find(d, "0F1").overlap == find(d, "3B0").overlap);
  CHECK(find(d, "0F1").overlap >= 0);
}

TEST_CASE("recompute marks the forwards of the selected regions") {
  Front f;
  Graph g = lowered(f, "mesh pp = 2;\nplace embed, layers[0..3] on pp = 0;\nplace layers[4..7], head on pp = 1;\n"
                       "recompute layers[5];\n");
  CHECK(!has(find(g, "0F0"), kRecompute));
  CHECK(has(find(g, "1F0"), kRecompute));
}

TEST_CASE("an order that closes a cycle is the user's error, at the directive") {
  Front f;
  auto s = f.check("split batch into 2;\norder bwd(0, 0) -> fwd(0, 0);\n");
  REQUIRE(s);
  CHECK(!lower(*s, f.manifest, f.diags));
  CHECK(f.first_error() == "this order creates a cycle: 0B0 -> 0F0 -> 0B0");
}

TEST_CASE("dag-json carries the documented fields") {
  Front f;
  Graph g = lowered(f, "mesh dp = 2;\nreplicate * over dp;\n");
  auto j = nlohmann::json::parse(emit_dag_json(g));
  REQUIRE(j["nodes"].size() == g.nodes.size());
  for (const char* key : {"id", "kind", "op", "ranks", "stream", "stage", "microbatch", "chunk", "bytes"})
    CHECK(j["nodes"][0].contains(key));
  bool all_reduce = false;
  for (const auto& n : j["nodes"]) all_reduce |= n["op"] == "all_reduce" && n["kind"] == "comm";
  CHECK(all_reduce);
  CHECK(j["edges"][0].contains("src"));
  CHECK(j["edges"][0]["kind"] == "data");
}

TEST_CASE("tied weights: one stage lays the tensor out once, copies in two stages are summed before each update") {
  Front f("gpt8_tied");
  const RegionId embed = *f.manifest.find("embed"), head = *f.manifest.find("head");
  {
    Graph g = lowered(f, "split batch into 2;\n");
    const auto& st = g.stage(0);
    CHECK(st.tied.size() == 1);
    CHECK(std::none_of(st.dense.begin(), st.dense.end(), [&](const ParamSlot& p) { return p.region == head && p.index == 2; }));
    CHECK(st.dense_elems * 4 == f.manifest.unique_param_bytes({0}));
    CHECK(census(g).count("ALLREDUCE_T") == 0);
    CHECK(g.facts.ties.empty());
  }
  CommandLine cmd;
  cmd.sets = {"pp=2", "mb=4"};
  Graph g = lowered(f, "use \"1f1b.piper\";\n", cmd);
  REQUIRE(g.facts.ties.size() == 1);
  CHECK(g.facts.ties[0].stages == std::vector<int32_t>{0, 1});
  CHECK(g.facts.ties[0].coords == std::vector<int64_t>{0, 1});
  CHECK(g.stage(0).tied.front().range.begin == 0);  // wte leads embed's layout
  CHECK(std::any_of(g.stage(1).dense.begin(), g.stage(1).dense.end(), [&](const ParamSlot& p) { return p.region == head && p.index == 2; }));
  CHECK(census(g)["ALLREDUCE_T"] == 2);
  auto edges = [&](const std::string& tok, bool in) {
    std::vector<std::string> out;
    for (const Edge& e : g.edges)
      if (token(g.nodes[static_cast<size_t>(in ? e.dst : e.src)]) == tok) out.push_back(token(g.nodes[static_cast<size_t>(in ? e.src : e.dst)]));
    std::sort(out.begin(), out.end());
    return out;
  };
  // Not replicated: after every backward that writes the copy, before the update.
  CHECK(edges("0ALLREDUCE_T.b0", true) == std::vector<std::string>{"0B0", "0B1", "0B2", "0B3"});
  CHECK(edges("0ALLREDUCE_T.b0", false) == std::vector<std::string>{"0U"});
  CHECK(edges("1ALLREDUCE_T.b0", false) == std::vector<std::string>{"1U"});
  CHECK(g.ranks(find(g, "1ALLREDUCE_T.b0").ranks) == std::vector<int32_t>{1});
  CHECK(g.streams[find(g, "0ALLREDUCE_T.b0").stream] == "tie");
  CHECK(parse_token("1ALLREDUCE_T.b0")->payload == Payload::Tied);
  (void)embed;
}

TEST_CASE("tied weights under ZeRO: the tied parameter is a bucket (and unit) of its own, summed after its reduction") {
  Front f("gpt8_tied");
  for (const char* strategy : {"1f1b_zero2.piper", "1f1b_zero3.piper"}) {
    CAPTURE(strategy);
    CommandLine cmd;
    cmd.sets = {"pp=2", "dp=2", "mb=2"};
    Graph g = lowered(f, fmt::format("use \"{}\";\n", strategy), cmd);
    for (int32_t s : {0, 1}) {
      const auto& st = g.stage(s);
      REQUIRE(st.tied.size() == 1);
      const auto& b = st.replication.buckets;
      CHECK(std::find(b.begin(), b.end(), st.tied.front().range) != b.end());
    }
    int reductions_in = 0;
    for (const Edge& e : g.edges)
      if (token(g.nodes[static_cast<size_t>(e.dst)]) == "1ALLREDUCE_T.b0")
        reductions_in += g.nodes[static_cast<size_t>(e.src)].op == Op::ReduceScatter;
    CHECK(reductions_in == 2);  // the tied bucket's reduce-scatter of each microbatch
    CHECK(g.ranks(find(g, "1ALLREDUCE_T.b0").ranks) == std::vector<int32_t>{2, 3});
  }
}

TEST_CASE("tied weights: copies replicated differently are the user's error, at the replicate statement") {
  Front f("gpt8_tied");
  auto s = f.check("mesh pp = 2, dp = 2;\nsplit batch into 2;\nplace embed on pp = 0;\nplace layers[*] over pp;\n"
                   "place head on pp = 1;\nreplicate embed over dp zero 1;\nreplicate layers[*], head over dp;\n");
  REQUIRE_MESSAGE(s, f.errors());
  LowerOptions opt;
  CHECK(!lower(*s, f.manifest, f.diags, opt));
  CHECK(f.errors().find("embed.wte and head.lm_head_weight are one tensor (tied in the manifest), but the stage holding "
                        "the first is replicated over 'dp' with zero(1) and stage 1 is replicated over 'dp'") != std::string::npos);
  CHECK(f.errors().find("<test>.piper:6:1: error:") != std::string::npos);
}

// The checker cuts a balanced placement by FLOPs; with a time for every region (a machine file's),
// the cut pass cuts it again by those, and the facts hold the stages the plan runs.
TEST_CASE("cut pass: balanced placements cut again by measured region costs") {
  Front f;
  const std::string text = "mesh pp = 3;\nplace embed on pp = 0;\nplace layers[*] over pp balanced;\nplace head on pp = 2;\n";
  auto s = f.check(text);
  REQUIRE_MESSAGE(s, f.errors());
  auto stages = [&](const Graph& g) {
    std::vector<std::string> out;
    for (const auto& st : g.facts.stages) out.push_back(fmt::format("{}@{}", print_regions(st.regions, f.manifest), st.coord));
    return out;
  };
  LowerOptions opt;
  opt.verify_each = true;
  auto by_flops = lower(*s, f.manifest, f.diags, opt);
  REQUIRE(by_flops);
  CHECK(stages(*by_flops) == std::vector<std::string>{"embed, layers[0..2]@0", "layers[3..5]@1", "layers[6..7], head@2"});
  // A head as dear as three blocks leaves its stage one block (loads 3.1, 4, 4 against 4.1, 3, 4
  // for the FLOPs cut).
  for (RegionId r : f.manifest.sequence) opt.region_costs[f.manifest.regions[static_cast<size_t>(r)].name] = 1.0;
  opt.region_costs["embed"] = 0.1;
  opt.region_costs["head"] = 3.0;
  auto measured = lower(*s, f.manifest, f.diags, opt);
  REQUIRE(measured);
  CHECK(stages(*measured) == std::vector<std::string>{"embed, layers[0..2]@0", "layers[3..6]@1", "layers[7], head@2"});
  // A region without a time: the checker's cut stands (FLOPs and seconds do not mix).
  opt.region_costs.erase("head");
  auto partial = lower(*s, f.manifest, f.diags, opt);
  REQUIRE(partial);
  CHECK(stages(*partial) == stages(*by_flops));
}

TEST_CASE("norm: one global-norm all-reduce per set of ranks, after every gradient is final, before every update") {
  Front f("gpt8_tied");
  CommandLine cmd;
  cmd.sets = {"pp=2", "dp=2", "mb=2"};
  CHECK(census(lowered(f, "use \"1f1b_zero2.piper\";\n", cmd)).count("ALLREDUCE_N") == 0);  // not asked for
  Graph g = lowered(f, "use \"1f1b_zero2.piper\";\n", cmd, /*global_norm=*/true);
  CHECK(census(g)["ALLREDUCE_N"] == 2);
  auto preds = [&](const std::string& tok) {
    std::set<std::string> out;
    for (const Edge& e : g.edges)
      if (token(g.nodes[static_cast<size_t>(e.dst)]) == tok) out.insert(token(g.nodes[static_cast<size_t>(e.src)]));
    return out;
  };
  for (int32_t s : {0, 1}) {
    const std::string norm = fmt::format("{}ALLREDUCE_N", s), update = fmt::format("{}U", s);
    CAPTURE(norm);
    const Node& n = find(g, norm);
    CHECK(n.axis == -1);  // the whole mesh
    CHECK(n.bytes == 8);
    CHECK(n.ranks == find(g, update).ranks);
    CHECK(g.streams[n.stream] == "norm");
    // Everything the update waits for (reductions, the tied sum), the norm waits for; then the update.
    std::set<std::string> before = preds(update);
    CHECK(before.erase(norm) == 1);
    CHECK(preds(norm) == before);
    CHECK(std::any_of(before.begin(), before.end(), [](const std::string& t) { return t.find("ALLREDUCE_T") != std::string::npos; }));
  }
  CHECK(parse_token("0ALLREDUCE_N")->payload == Payload::Norm);
  // The verifier refuses an update that does not wait for it.
  for (Edge& e : g.edges)
    if (g.nodes[static_cast<size_t>(e.src)].payload == Payload::Norm && g.nodes[static_cast<size_t>(e.dst)].op == Op::U)
      e.kind = EdgeKind::Dead;
  g.remove_dead_edges();
  auto problems = verify(g);
  CHECK(std::any_of(problems.begin(), problems.end(), [](const std::string& p) { return p.find("global norm") != std::string::npos; }));
}

TEST_CASE("tied weights on one stage under per-layer ZeRO-3: the head's piece gathers the embedding's unit too") {
  Front f("gpt8_tied");
  CommandLine cmd;
  cmd.sets = {"dp=2"};
  Graph g = lowered(f, "use \"zero3.piper\";\n", cmd);
  const auto& st = g.stage(0);
  REQUIRE(st.tied.size() == 1);
  const Range tied = st.tied.front().range;
  const Segment& head = st.segments.back();
  CHECK(head.tied == std::vector<Range>{tied});  // laid out in the embedding's piece, read by the head's
  CHECK(head.touches(tied));
  const auto& units = st.replication.units;
  const int32_t unit = int32_t(std::find(units.begin(), units.end(), tied) - units.begin());
  REQUIRE(size_t(unit) < units.size());
  const auto& buckets = st.replication.buckets;  // reductions go bucket by bucket, the units in backward order
  const int32_t bucket = int32_t(std::find(buckets.begin(), buckets.end(), tied) - buckets.begin());
  const std::string last = fmt::format("0F0.s{}", st.segments.size() - 1);
  const std::string back = fmt::format("0B0.s{}", st.segments.size() - 1);
  std::set<std::string> into_head, into_reduction;
  for (const Edge& e : g.edges) {
    const std::string dst = token(g.nodes[static_cast<size_t>(e.dst)]), src = token(g.nodes[static_cast<size_t>(e.src)]);
    if (dst == last) into_head.insert(src);
    if (dst == fmt::format("0REDUCESCATTER_G0.b{}", bucket)) into_reduction.insert(src);
  }
  CHECK(into_head.count(fmt::format("0ALLGATHER_PF0.b{}", unit)) == 1);
  // Its gradient is final after both pieces' backwards: the head's and the embedding's.
  CHECK(into_reduction == std::set<std::string>{"0B0.s0", back});
}

TEST_CASE("expert parallelism × dp: the update waits for the experts' backwards, which no reduction covers") {
  Front f("moe8");
  CommandLine cmd;
  cmd.sets = {"pp=2", "ep=2", "mb=4"};
  Graph g = lowered(f, "use \"dualpipev_ep.piper\";\n", cmd);
  for (const Node& u : g.nodes) {
    if (u.op != Op::U) continue;
    int experts_in = 0;
    for (const Edge& e : g.edges) {
      const Node& src = g.nodes[static_cast<size_t>(e.src)];
      if (&g.nodes[static_cast<size_t>(e.dst)] == &u && is_chunk(src.op) && g.segment_of(src).sharded >= 0) ++experts_in;
    }
    const auto& segs = g.stage(u.stage).segments;
    const auto pieces = std::count_if(segs.begin(), segs.end(), [](const Segment& s) { return s.sharded >= 0; });
    CHECK(pieces > 0);
    CHECK(experts_in == 4 * pieces);  // one per microbatch and expert piece
  }
}

TEST_CASE("tensor parallelism: each rank lays out its slices, its pieces run the sharded regions at 1/tp of their work") {
  Front f;
  Graph whole = lowered(f, "split batch into 1;\n");
  Graph g = lowered(f, "mesh tp = 2;\nshard layers[*].attn over tp heads;\nshard layers[*].mlp over tp hidden;\n");
  CHECK(g.facts.mesh.axes().front().model);
  CHECK(g.facts.mesh.replicas(-1) == 1);  // the tp ranks read the same samples
  const StageFacts& st = g.facts.stages.front();
  CHECK(st.tp.ways == 2);
  // Sliced: q/k/v, its bias, the output projection, the MLP's two matrices and first bias; the
  // norms, the biases added after the sum, embeddings and head stay whole.
  int64_t sliced = 0, kept = 0;
  for (const ParamSlot& p : st.dense) {
    const ParamSpec& spec = f.manifest.regions[static_cast<size_t>(p.region)].params[static_cast<size_t>(p.index)];
    const int64_t n = spec.bytes / 4;
    CHECK(p.numel == (p.sliced ? n / 2 : n));
    CHECK(p.sliced == spec.sharded());
    (p.sliced ? sliced : kept) += n;
  }
  CHECK(sliced > 0);
  CHECK(st.dense_elems == kept + sliced / 2);
  CHECK(whole.facts.stages.front().dense_elems == kept + sliced);
  // No communication node: the sums run inside the piece; the piece says which regions and how much.
  CHECK(census(g) == std::map<std::string, int>{{"F", 1}, {"B", 1}, {"U", 1}});
  const Segment& seg = st.segments.front();
  CHECK(seg.tp_regions.size() == 16);  // 8 layers × (attention, MLP)
  CHECK(seg.tp_reduce_bytes == 16 * 64 * 64 * 4);  // each region's [seq, d] fp32 output per sample
  int64_t tp_flops = 0;
  for (RegionId q : seg.tp_regions) tp_flops += f.manifest.flops(q);
  CHECK(find(g, "0F0").flops == find(whole, "0F0").flops - tp_flops + tp_flops / 2);
  CHECK(seg.sequence_regions.empty());
  // With `sequence` on the attention shards: those regions (not the MLPs) run on shares of the tokens.
  Graph sp = lowered(f, "mesh tp = 2;\nshard layers[*].attn over tp heads sequence;\nshard layers[*].mlp over tp hidden;\n");
  const Segment& sps = sp.facts.stages.front().segments.front();
  CHECK(sps.sequence_regions.size() == 8);
  for (RegionId q : sps.sequence_regions) CHECK(f.manifest.regions[static_cast<size_t>(q)].kind == "attention");
}

TEST_CASE("context parallelism: each piece's blocks run on a share of the tokens, their work over cp") {
  Front f;
  Graph whole = lowered(f, "split batch into 1;\n");
  Graph g = lowered(f, "mesh cp = 2;\nshard layers[*] over cp sequence ring;\n");
  const StageFacts& st = g.facts.stages.front();
  CHECK(st.cp.axis == 0);
  CHECK(st.cp.ways == 2);
  CHECK(st.tp.ways == 1);
  CHECK(st.dense_elems == whole.facts.stages.front().dense_elems);  // parameters whole
  const Segment& seg = st.segments.front();
  REQUIRE(seg.context_regions.size() == 16);  // 8 layers x (attention, MLP)
  int64_t cp_flops = 0;
  for (RegionId q : seg.context_regions) cp_flops += f.manifest.flops(q);
  CHECK(find(g, "0F0").flops == find(whole, "0F0").flops - cp_flops + cp_flops / 2);
  CHECK(seg.cp_kv_bytes == 8 * 2 * 64 * 64 * 4);  // per attention, [seq, d] fp32 keys and values
  CHECK(seg.cp_rings == 8);
  CHECK(seg.cp_gather_bytes == 64 * 64 * 4);
  CHECK(census(g) == std::map<std::string, int>{{"F", 1}, {"B", 1}, {"U", 1}});  // the ring runs inside the piece
  CHECK(whole.facts.stages.front().segments.front().context_regions.empty());
}

TEST_CASE("tensor parallelism composes: ZeRO shards the slices over dp, the pipeline cuts the sharded blocks") {
  Front f;
  Graph g = lowered(f, "use \"1f1b.piper\";\nuse \"zero1.piper\";\nuse \"tp.piper\";\n",
                    CommandLine{.sets = {"pp=2", "dp=2", "tp=2", "mb=2"}});
  CHECK(g.facts.mesh.replicas(g.facts.pipeline_axis) == 2);  // dp only
  for (const StageFacts& st : g.facts.stages) {
    CHECK(st.tp.ways == 2);
    CHECK(st.replication.ways == 2);
    CHECK(st.storage.members.size() == 2);
    int64_t stepped = 0;
    for (const MemberStorage& m : st.storage.members) stepped += m.stepped_elems();
    CHECK(stepped == st.dense_elems);  // the members' shards cover the rank's slices, once
  }
  // The tp ranks of a stage sit next to each other (mesh pp, dp, tp): rank 0's tp peer is rank 1.
  CHECK(g.facts.mesh.group_along(0, g.facts.mesh.index("tp")) == std::vector<int32_t>{0, 1});
}

TEST_CASE("hosts: which mesh axes and which pipeline handoffs go between hosts") {
  Front f;
  auto s = f.check("use \"1f1b_dp.piper\";\n", CommandLine{.sets = {"pp=4", "dp=2", "mb=4"}});
  REQUIRE_MESSAGE(s, f.errors());
  LowerOptions opt;
  opt.verify_each = true;
  opt.host_of = {0, 0, 0, 0, 1, 1, 1, 1};  // mesh pp = 4, dp = 2: stages 0-1 on host 0, 2-3 on host 1
  auto g = lower(*s, f.manifest, f.diags, opt);
  REQUIRE_MESSAGE(g, f.errors());
  const HostFacts& h = g->facts.hosts;
  CHECK(h.count == 2);
  CHECK(h.axis_crosses == std::vector<uint8_t>{1, 0});
  CHECK(h.next_crosses == std::vector<uint8_t>{0, 1, 0});  // only stage 1 -> 2 leaves its host
  CHECK(h.handoff(1, false));
  CHECK(h.handoff(2, true));
  CHECK_FALSE(h.handoff(2, false));
  const std::string report = emit_hosts(*g, {"a", "b"});
  CHECK(report.find("2 (a: ranks 0-3; b: ranks 4-7)") != std::string::npos);
  CHECK(report.find("axes inside a host: dp; across hosts: pp") != std::string::npos);
  CHECK(report.find("groups: pp 0,2,4,6 (a, b) 1,3,5,7 (a, b); dp 0-1 (a) 2-3 (a) 4-5 (b) 6-7 (b)\n") != std::string::npos);
  // A host per rank: the report folds hosts and groups rather than listing every one.
  opt.host_of = {0, 1, 2, 3, 4, 5, 6, 7};
  auto eight = lower(*s, f.manifest, f.diags, opt);
  REQUIRE(eight);
  const std::string folded = emit_hosts(*eight);
  CHECK(folded.find("8 (host 0: ranks 0; host 1: ranks 1; host 2: ranks 2; ... 4 more; host 7: ranks 7)") != std::string::npos);
  CHECK(folded.find("pp 0,2,4,6 (host 0, host 2, host 4, ... 4 hosts) 1,3,5,7 (host 1, host 3, host 5, ... 4 hosts);") !=
        std::string::npos);
  // One host: no facts, no report.
  opt.host_of.clear();
  auto one = lower(*s, f.manifest, f.diags, opt);
  REQUIRE(one);
  CHECK_FALSE(one->facts.hosts.any());
  CHECK(emit_hosts(*one).empty());
}

TEST_CASE("mirror: the copies' microbatches run at the mirrored coordinate, each copy's update waits for ALLREDUCE_C") {
  Front f;
  CommandLine cmd;
  cmd.np = 4;
  Graph g = lowered(f, "mesh pp = 4;\nsplit batch into 4;\nplace embed on pp = 0;\nplace layers[*] over pp;\n"
                       "place head on pp = 3;\nmirror over pp;\n", cmd);
  CHECK(g.facts.mirror_from == 2);
  for (int32_t s = 0; s < 4; ++s) {
    CAPTURE(s);
    CHECK(g.stage(s).copy_coord == 3 - s);
    CHECK(g.stage(s).copy_chunk == 1);  // after the rank's own stage
    // Microbatches 0, 1 down at the stage's own rank, 2, 3 up at the copy's.
    CHECK(g.ranks(find(g, fmt::format("{}F1", s)).ranks) == std::vector<int32_t>{s});
    CHECK(g.ranks(find(g, fmt::format("{}F2", s)).ranks) == std::vector<int32_t>{3 - s});
  }
  CHECK(census(g)["U"] == 8);
  CHECK(census(g)["ALLREDUCE_C"] == 8);
  // Each update is fed by one sum on its own ranks, which the backwards on those ranks feed; the
  // two sums a pair of ranks share run in stage order on both (they are one sequence of calls).
  std::map<int32_t, std::vector<int32_t>> sums_on;  // rank -> the stages it sums
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    if (n.payload != Payload::Copy) continue;
    bool feeds_update = false, after_backward = false;
    for (const Edge& e : g.edges) {
      const Node &src = g.nodes[static_cast<size_t>(e.src)], &dst = g.nodes[static_cast<size_t>(e.dst)];
      if (e.src == v && dst.op == Op::U && dst.ranks == n.ranks && dst.stage == n.stage) feeds_update = true;
      if (e.dst == v && (src.op == Op::B || src.op == Op::BW) && src.ranks == n.ranks) after_backward = true;
    }
    CHECK(feeds_update);
    CHECK(after_backward);
    sums_on[g.ranks(n.ranks).front()].push_back(n.stage);
  }
  const bool chained = std::any_of(g.edges.begin(), g.edges.end(), [&](const Edge& e) {
    const Node &a = g.nodes[static_cast<size_t>(e.src)], &b = g.nodes[static_cast<size_t>(e.dst)];
    return e.kind == EdgeKind::Temporal && a.payload == Payload::Copy && b.payload == Payload::Copy &&
           g.ranks(a.ranks) == std::vector<int32_t>{3} && a.stage == 0 && b.stage == 3;
  });
  CHECK(chained);  // on rank 3 the copy's sum (stage 0) before its own stage's (3), as on rank 0
  CHECK(sums_on[0] == std::vector<int32_t>{0, 3});
  CHECK(sums_on[3] == std::vector<int32_t>{0, 3});
  CHECK(sums_on[1] == std::vector<int32_t>{1, 2});
}

// Experts: replicate left each expert backward before the update by a temporal edge (no reduction
// covers its gradients); the copies' sum, which now adds them too, must wait for every one of them.
TEST_CASE("mirror x expert parallelism: each copy's sum waits for every expert backward of its copy, and counts the experts") {
  Front f("moe8");
  CommandLine cmd;
  cmd.sets = {"pp=2", "mb=4"};
  Graph g = lowered(f, "use \"dualpipe.piper\";\nmesh ep = 2;\nreplicate * over ep;\nshard layers[*].moe.experts over ep;\n", cmd);
  int sums = 0;
  for (NodeId v = 0; v < NodeId(g.nodes.size()); ++v) {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    if (n.payload != Payload::Copy) continue;
    ++sums;
    std::set<int32_t> expert_backwards_in;  // microbatches
    for (const Edge& e : g.edges) {
      const Node& src = g.nodes[static_cast<size_t>(e.src)];
      if (e.dst == v && is_chunk(src.op) && src.op != Op::F && g.segment_of(src).sharded >= 0) expert_backwards_in.insert(src.microbatch);
    }
    CHECK(expert_backwards_in.size() == 2);  // the copy's half of the 4 microbatches
    const StageFacts& st = g.stage(n.stage);
    int64_t experts = 0;
    for (const ExpertShard& e : st.experts) experts += e.member_bytes * static_cast<int64_t>(e.members.size()) / e.ways;
    CHECK(experts > 0);
    CHECK(n.bytes >= st.dense_elems * 4 + experts);
  }
  CHECK(sums == 4);  // two stages, two copies each
}
