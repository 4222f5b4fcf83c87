#include "lang/checker.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "tests/lang_fixture.h"

using namespace piper;
using piper::testing::directives_of;
using piper::testing::Front;

namespace {
std::vector<std::string> stage_text(const CheckedStrategy& s, const Manifest& m) {
  std::vector<std::string> out;
  for (const auto& st : s.stages)
    out.push_back(fmt::format("{}@{}.{}", print_regions(st.regions, m), st.coord, st.chunk));
  return out;
}
}  // namespace

TEST_CASE("contiguous placement cuts the pipeline into pp stages, embed and head join their neighbours") {
  Front f;
  auto s = f.check("mesh pp = 4;\nplace layers[*] over pp;\nplace embed on pp = 0;\nplace head on pp = 3;\n");
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(s->mesh.world() == 4);
  CHECK(s->pipeline_axis == "pp");
  CHECK(stage_text(*s, f.manifest) == std::vector<std::string>{"embed, layers[0..1]@0.0", "layers[2..3]@1.0",
                                                               "layers[4..5]@2.0", "layers[6..7], head@3.0"});
}

TEST_CASE("interleaved placement deals chunks round-robin and V-shape folds back") {
  Front f;
  auto il = f.check("mesh pp = 2;\nplace embed on pp = 0;\nplace layers[*] over pp interleaved(2);\n"
                    "place head on pp = 1;\n");
  REQUIRE_MESSAGE(il, f.errors());
  CHECK(stage_text(*il, f.manifest) == std::vector<std::string>{"embed, layers[0..1]@0.0", "layers[2..3]@1.0",
                                                                "layers[4..5]@0.1", "layers[6..7], head@1.1"});
  auto v = f.check("mesh pp = 2;\nplace embed on pp = 0;\nplace layers[*] over pp vshape;\nplace head on pp = 0;\n");
  REQUIRE_MESSAGE(v, f.errors());
  // Rank r holds stages r and 2p-1-r; the two stages at the bottom of the V stay two stages.
  CHECK(stage_text(*v, f.manifest) == std::vector<std::string>{"embed, layers[0..1]@0.0", "layers[2..3]@1.0",
                                                               "layers[4..5]@1.1", "layers[6..7], head@0.1"});
}

TEST_CASE("balanced placement cuts by cost, unevenly where that evens the stages") {
  Front f;
  const std::string text = "mesh pp = 3;\nplace embed on pp = 0;\nplace layers[*] over pp balanced;\nplace head on pp = 2;\n";
  // By FLOPs (gpt8: the blocks equal, the embedding free, the head about half a block): 8 blocks
  // over 3 stages, the head's stage takes fewer.
  auto s = f.check(text);
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(stage_text(*s, f.manifest) == std::vector<std::string>{"embed, layers[0..2]@0.0", "layers[3..5]@1.0",
                                                               "layers[6..7], head@2.0"});
  // Measured costs cut it again where lowering runs (ir/lower_test.cpp, the cut pass).
  // The checked strategy prints as it was written, and parses back to the same cut.
  CHECK(print_strategy(*s, f.manifest).find("place layers[*] over pp balanced;") != std::string::npos);
}

TEST_CASE("interleaved and V-shape balanced: chunks cut by cost, placed as the even modes place them") {
  // gpt1b by FLOPs: 24 blocks and a head as dear as about two blocks, into 8 chunks. Three blocks a
  // chunk would leave the head's chunk at five; the bound is four, and the cut stays near the even
  // share instead of crowding the first chunks.
  Front f("gpt1b");
  auto s = f.check("mesh pp = 4;\nplace embed on pp = 0;\nplace layers[*] over pp interleaved(2) balanced;\n"
                   "place head on pp = 3;\n");
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(stage_text(*s, f.manifest) ==
        std::vector<std::string>{"embed, layers[0..2]@0.0", "layers[3..5]@1.0", "layers[6..8]@2.0", "layers[9..11]@3.0",
                                 "layers[12..14]@0.1", "layers[15..18]@1.1", "layers[19..21]@2.1",
                                 "layers[22..23], head@3.1"});
  CHECK(print_strategy(*s, f.manifest).find("place layers[*] over pp interleaved(2) balanced;") != std::string::npos);
  auto v = f.check("mesh pp = 4;\nplace embed on pp = 0;\nplace layers[*] over pp vshape balanced;\nplace head on pp = 0;\n");
  REQUIRE_MESSAGE(v, f.errors());
  const auto stages = stage_text(*v, f.manifest);
  REQUIRE(stages.size() == 8);
  CHECK(stages[4] == "layers[12..14]@3.1");  // down the V and back up
  CHECK(stages[7] == "layers[22..23], head@0.1");
}

TEST_CASE("parameters: use arguments beat inherited names, which beat --set, which beats defaults") {
  Front f;
  CommandLine cmd;
  cmd.sets = {"pp=2", "mb=4"};
  auto s = f.check("use \"1f1b.piper\";\n", cmd);
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(s->axis_size("pp") == 2);
  CHECK(s->microbatches == 4);

  auto inherited = f.check("param pp = 2;\nuse \"1f1b.piper\";\n");
  REQUIRE_MESSAGE(inherited, f.errors());
  CHECK(inherited->axis_size("pp") == 2);
  // Through a composition that declares nothing (1f1b_zero3.piper uses 1f1b.piper and zero3.piper).
  auto through = f.check("param pp = 2;\nparam dp = 2;\nuse \"1f1b_zero3.piper\";\n");
  REQUIRE_MESSAGE(through, f.errors());
  CHECK(through->axis_size("pp") == 2);
  CHECK(through->axis_size("dp") == 2);

  cmd.sets = {"mb=4"};
  auto arg = f.check("param mb = 2;\nuse \"1f1b.piper\" (pp = 2, mb = 3 * mb);\n", cmd);
  REQUIRE_MESSAGE(arg, f.errors());
  CHECK(arg->microbatches == 12);  // the outer mb took --set 4, then the argument tripled it
}

TEST_CASE("composing 1f1b with zero3 unions the meshes and keeps every directive") {
  Front f;
  CommandLine cmd;
  cmd.np = 8;
  cmd.sets = {"pp=4", "dp=2"};
  auto s = f.check("use \"1f1b.piper\";\nuse \"zero3.piper\";\n", cmd);
  REQUIRE_MESSAGE(s, f.errors());
  REQUIRE(s->mesh.axes().size() == 2);
  CHECK(s->mesh.axes()[0].name == "pp");
  CHECK(s->mesh.axes()[1].name == "dp");
  auto reps = directives_of<ReplicateDirective>(*s);
  REQUIRE(reps.size() == 1);
  CHECK(reps[0]->zero == 3);
  CHECK(reps[0]->prefetch == 0);
  CHECK(reps[0]->units.size() == 8);  // layers[*]: each layer a unit of its own
  CHECK(reps[0]->regions == std::vector<RegionId>{0});
}

TEST_CASE("free variables in an order range over stages and microbatches, out-of-range instances drop") {
  Front f;
  auto s = f.check("param pp = 4;\nparam mb = 8;\nmesh pp = pp;\nsplit batch into mb;\nplace embed on pp = 0;\n"
                   "place layers[*] over pp;\nplace head on pp = 3;\norder bwd(s, i) -> fwd(s, i + pp - s);\n");
  REQUIRE_MESSAGE(s, f.errors());
  auto orders = directives_of<OrderDirective>(*s);
  // Stage s has mb - (pp - s) instances: 4 + 5 + 6 + 7.
  CHECK(orders.size() == 22);
  CHECK(orders.front()->chain == std::vector<std::vector<Task>>{{{TaskKind::Bwd, 0, 0}}, {{TaskKind::Fwd, 0, 4}}});
  CHECK(orders.back()->chain == std::vector<std::vector<Task>>{{{TaskKind::Bwd, 3, 6}}, {{TaskKind::Fwd, 3, 7}}});
}

TEST_CASE("the design card's line checks: experts sharded over ep=8, fwd(i) || bwd(i-1) on stream comm") {
  Front f("moe8");
  auto s = f.check("mesh ep = 8;\nsplit batch into 4;\nreplicate * over ep;\n"
                   "shard layers[*].moe.experts over ep=8; order fwd(i) || bwd(i-1) on stream comm;\n");
  REQUIRE_MESSAGE(s, f.errors());
  auto orders = directives_of<OrderDirective>(*s);
  REQUIRE(orders.size() == 3);  // i = 1, 2, 3 on the single stage
  CHECK(orders[0]->chain == std::vector<std::vector<Task>>{{{TaskKind::Fwd, 0, 1}, {TaskKind::Bwd, 0, 0}}});
  CHECK(orders[0]->stream == "comm");
  auto shards = directives_of<ShardDirective>(*s);
  REQUIRE(shards.size() == 1);
  CHECK(shards[0]->regions.size() == 8);
}

TEST_CASE("`sms` on a stream: recorded once per stream (a param may give it), printed with every clause that names the stream") {
  Front f("moe8");
  auto s = f.check("param comm_sms = 20;\nmesh ep = 8;\nsplit batch into 4;\nreplicate * over ep on stream comm sms comm_sms;\n"
                   "shard layers[*].moe.experts over ep on stream comm sms 20;\norder fwd(i) || bwd(i-1) on stream comm;\n");
  REQUIRE_MESSAGE(s, f.errors());
  REQUIRE(s->stream_sms.size() == 1);
  CHECK(s->stream_sms[0].stream == "comm");
  CHECK(s->stream_sms[0].sms == 20);
  CHECK(s->stream_sms[0].loc.line == 4);
  const std::string text = print_strategy(*s, f.manifest);
  CHECK(text.find("shard layers[*].moe.experts over ep on stream comm sms 20;") != std::string::npos);
  CHECK(text.find("|| bwd(0, i) on stream comm sms 20;") != std::string::npos);
  Front again("moe8");
  auto t = again.check(text);
  REQUIRE_MESSAGE(t, again.errors());
  REQUIRE(t->stream_sms.size() == 1);
  CHECK(t->stream_sms[0].sms == 20);
}

TEST_CASE("a sequence chains its orders in evaluation order") {
  Front f;
  auto s = f.check("mesh pp = 2;\nsplit batch into 2;\nplace * over pp;\n"
                   "sequence { for i in 0..1 { order fwd(0, i); } order bwd(0, 0) || fwd(1, 1); order bwd(0, 1); }\n");
  REQUIRE_MESSAGE(s, f.errors());
  auto orders = directives_of<OrderDirective>(*s);
  REQUIRE(orders.size() == 4);
  using G = std::vector<std::vector<Task>>;
  CHECK(orders[0]->chain == G{{{TaskKind::Fwd, 0, 0}}});
  CHECK(orders[1]->chain == G{{{TaskKind::Fwd, 0, 0}}, {{TaskKind::Fwd, 0, 1}}});
  CHECK(orders[2]->chain == G{{{TaskKind::Fwd, 0, 1}}, {{TaskKind::Bwd, 0, 0}, {TaskKind::Fwd, 1, 1}}});
  CHECK(orders[3]->chain == G{{{TaskKind::Bwd, 0, 0}, {TaskKind::Fwd, 1, 1}}, {{TaskKind::Bwd, 0, 1}}});
}

TEST_CASE("integer arithmetic: floor division, min/max, len, size units, short-circuit guards") {
  Front f;
  auto s = f.check(
      "let a = -7 / 2;\nlet b = -7 % 2;\nlet n = len(layers);\nlet e = min(n, 3, max(1, 2));\n"
      "assert a == -4 and b == 1 and n == 8 and e == 2, \"arithmetic\";\n"
      "assert 1KiB == 1024 and 1MB == 1000000, \"units\";\n"
      "let z0 = 0;\nassert z0 == 0 or 1 / z0 == 1, \"or short-circuits\";\n"
      "assert not (z0 != 0 and 1 / z0 == 1), \"and short-circuits\";\n"
      // The floored remainder of the one quotient that overflows still fits.
      "assert (-9223372036854775807 - 1) % -1 == 0, \"min % -1\";\n");
  CHECK_MESSAGE(s, f.errors());
}

TEST_CASE("the world size: --np decides, mesh must match, and `world` needs it") {
  Front f;
  CommandLine cmd;
  cmd.np = 8;
  auto s = f.check("mesh pp = 2, dp = world / 2;\nplace * over pp;\nreplicate * over dp;\n", cmd);
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(s->axis_size("dp") == 4);
  CHECK(s->mesh.world() == 8);

  Front g;
  CHECK(!g.check("mesh dp = world;\nreplicate * over dp;\n"));
  CHECK(g.first_error().find("world size is not known") != std::string::npos);
}

TEST_CASE("--batch-size must split over data-parallel replicas and microbatches") {
  Front f;
  CommandLine cmd;
  cmd.batch_size = 12;
  CHECK(!f.check("mesh dp = 2;\nreplicate * over dp;\nsplit batch into 4;\n", cmd));
  CHECK(f.first_error().find("does not split into 2 data-parallel replicas × 4 microbatches") != std::string::npos);
  Front g;
  cmd.batch_size = 16;
  CHECK_MESSAGE(g.check("mesh dp = 2;\nreplicate * over dp;\nsplit batch into 4;\n", cmd), g.errors());
}

TEST_CASE("runaway loops stop with an error instead of hanging") {
  Front f;
  CHECK(!f.check("for i in 0..1000000000000 { let x = i; }\n"));
  CHECK(f.first_error().find("exceeded") != std::string::npos);
}

TEST_CASE("orders are expanded after all placement, so they may precede place") {
  Front f;
  auto s = f.check("mesh pp = 2;\nsplit batch into 2;\norder fwd(1, 0) -> fwd(1, 1);\nplace * over pp;\n");
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(directives_of<OrderDirective>(*s).size() == 1);
}

// A tied parameter is kept whole on every stage and its copies summed element by element, so a
// layout that would slice it is refused where the shard is written (the zoo ties only embedding
// and head, which no layout slices; this manifest ties two layers' sliced projections).
TEST_CASE("a tensor shard of a region whose sliced parameter is tied is refused, naming both") {
  Front f;
  const RegionId a = *f.manifest.find("layers.0.attn"), b = *f.manifest.find("layers.1.attn");
  int32_t sliced = -1;
  for (size_t k = 0; k < f.manifest.regions[static_cast<size_t>(a)].params.size(); ++k)
    if (f.manifest.regions[static_cast<size_t>(a)].params[k].sharded()) sliced = static_cast<int32_t>(k);
  REQUIRE(sliced >= 0);
  f.manifest.ties.push_back(Tie{{TiedParam{a, sliced}, TiedParam{b, sliced}}});
  auto s = f.check("mesh tp = 2;\nshard layers[1].attn over tp heads;\n");
  CHECK(!s);
  const std::string name = f.manifest.regions[static_cast<size_t>(a)].params[static_cast<size_t>(sliced)].name;
  CHECK(f.first_error() == fmt::format("cannot shard 'layers[1].attn' over tp: its parameter 'layers[1].attn.{}' is tied "
                                       "to 'layers[0].attn.{}', and a tied parameter is kept whole", name, name));
  Front g;  // the same shard without the tie checks
  CHECK(g.check("mesh tp = 2;\nshard layers[1].attn over tp heads;\n"));
}

TEST_CASE("sequence parallelism on a tensor shard is recorded, prints back, and needs a sequence the axis divides") {
  Front f;
  auto s = f.check("mesh tp = 2;\nshard layers[*].attn over tp heads sequence;\nshard layers[*].mlp over tp;\n");
  REQUIRE_MESSAGE(s, f.errors());
  auto t = directives_of<TensorShardDirective>(*s);
  REQUIRE(t.size() == 2);
  CHECK(t[0]->sequence);
  CHECK(!t[1]->sequence);
  const std::string text = print_strategy(*s, f.manifest);
  CHECK(text.find("shard layers[*].attn over tp heads sequence;") != std::string::npos);
  Front again;
  auto back = again.check(text);
  REQUIRE_MESSAGE(back, again.errors());
  CHECK(directives_of<TensorShardDirective>(*back)[0]->sequence);
  Front odd;  // 63 tokens do not split over 2 ranks (4 heads do)
  for (Region& r : odd.manifest.regions)
    if (r.kind == "attention" && r.input) r.input->shape[0] = 63;
  CHECK(!odd.check("mesh tp = 2;\nshard layers[*].attn over tp heads sequence;\n"));
  CHECK(odd.first_error() == "'layers[0].attn' has a sequence of 63, which does not divide evenly over tp=2 for sequence parallelism");
  Front plain;  // without `sequence` the sequence need not divide
  for (Region& r : plain.manifest.regions)
    if (r.kind == "attention" && r.input) r.input->shape[0] = 63;
  CHECK(plain.check("mesh tp = 2;\nshard layers[*].attn over tp heads;\n"));
}

TEST_CASE("a context shard records the regions' leaves, prints back, and makes its axis a model axis") {
  Front f;
  auto s = f.check("mesh dp = 2, cp = 2;\nreplicate * over dp;\nshard layers[*] over cp sequence ring;\n");
  REQUIRE_MESSAGE(s, f.errors());
  auto c = directives_of<ContextShardDirective>(*s);
  REQUIRE(c.size() == 1);
  CHECK(c[0]->regions.size() == 8);
  REQUIRE(c[0]->leaves.size() == 16);  // each block: its attention, then its MLP
  CHECK(f.manifest.regions[static_cast<size_t>(c[0]->leaves[0])].kind == "attention");
  CHECK(f.manifest.regions[static_cast<size_t>(c[0]->leaves[1])].kind == "mlp");
  CHECK(c[0]->axis == "cp");
  CHECK(c[0]->exchange == "ring");
  CHECK(s->mesh.axes()[1].model);
  CHECK(s->replicas() == 2);  // cp's ranks read the same samples
  const std::string text = print_strategy(*s, f.manifest);
  CHECK(text.find("shard layers[*] over cp sequence ring;") != std::string::npos);
  Front again;
  auto back = again.check(text);
  REQUIRE_MESSAGE(back, again.errors());
  CHECK(directives_of<ContextShardDirective>(*back).at(0)->leaves == c[0]->leaves);
}

TEST_CASE("a context shard needs 2×cp to divide the sequence, a known exchange, and no tensor parallelism beside it") {
  Front odd;  // 2×cp = 4 chunks; 62 tokens split over 2 ranks but not into 4 balanced chunks
  for (Region& r : odd.manifest.regions)
    if (r.kind == "block" && r.input) r.input->shape[0] = 62;
  CHECK(!odd.check("mesh cp = 2;\nshard layers[*] over cp sequence ring;\n"));
  CHECK(odd.first_error() == "'layers[0]' has a sequence of 62, which does not divide into 2×cp=4 chunks for load-balanced ring attention");
  Front a2a;
  CHECK(!a2a.check("mesh cp = 2;\nshard layers[*] over cp sequence a2a;\n"));
  CHECK(a2a.first_error() == "unknown context-parallel exchange 'a2a'");
  Front both;
  CHECK(!both.check("mesh tp = 2, cp = 2;\nshard layers[*].mlp over tp;\nshard layers[*].attn over cp sequence ring;\n"));
  CHECK(both.first_error() == "context and tensor parallelism in one strategy are not built yet");
  Front twice;
  CHECK(!twice.check("mesh cp = 2;\nshard layers[*] over cp sequence ring;\nshard layers[0].attn over cp sequence ring;\n"));
  CHECK(twice.first_error() == "'layers[0].attn' is split by the sequence twice");
  Front pipe;  // the pipeline's axis cannot also split the sequence
  CHECK(!pipe.check("mesh pp = 2;\nplace layers[*] over pp;\nshard layers[*] over pp sequence ring;\n"));
}

TEST_CASE("a tensor shard records the regions and their layout's dimension, and makes its axis a model axis") {
  Front f;
  auto s = f.check("mesh dp = 2, tp = 2;\nreplicate * over dp;\nshard layers[*].attn over tp heads;\n"
                   "shard layers[*].mlp over tp;\n");
  REQUIRE_MESSAGE(s, f.errors());
  auto t = directives_of<TensorShardDirective>(*s);
  REQUIRE(t.size() == 2);
  CHECK(t[0]->regions.size() == 8);
  CHECK(t[0]->axis == "tp");
  CHECK(t[0]->dim == "heads");
  CHECK(t[1]->dim == "hidden");  // the layout's own, when not written
  CHECK(directives_of<ShardDirective>(*s).empty());
  CHECK(s->mesh.axes()[1].model);
  CHECK(!s->mesh.axes()[0].model);
  CHECK(s->replicas() == 2);  // dp reads its own samples; tp does not
  CHECK(s->mesh.replica_of(1, -1) == 0);
  CHECK(s->mesh.replica_of(2, -1) == 1);
  // The canonical text checks back to the same records.
  const std::string text = print_strategy(*s, f.manifest);
  CHECK(text.find("shard layers[*].attn over tp heads;") != std::string::npos);
  Front g;
  auto again = g.check(text);
  REQUIRE_MESSAGE(again, g.errors());
  CHECK(directives_of<TensorShardDirective>(*again).size() == 2);
}
