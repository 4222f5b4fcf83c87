#include "lang/manifest.h"

#include <doctest/doctest.h>

#include "tests/lang_fixture.h"

using namespace piper;
using piper::testing::Front;

TEST_CASE("the dense example manifest: region tree, sequence, lists and sizes") {
  Front f("gpt8");
  const Manifest& m = f.manifest;
  CHECK(m.version == 1);
  CHECK(m.model_name == "gpt-8L");
  REQUIRE(m.sequence.size() == 10);
  CHECK(m.regions[m.sequence.front()].name == "embed");
  CHECK(m.regions[m.sequence.back()].name == "head");
  auto layers = m.find("layers");
  REQUIRE(layers);
  CHECK(m.regions[*layers].implicit);
  CHECK(m.is_list(*layers));
  CHECK(m.regions[*layers].children.size() == 8);
  auto attn = m.find("layers.3.attn");
  REQUIRE(attn);
  CHECK(m.selector_text(*attn) == "layers[3].attn");
  CHECK(m.is_ancestor(*m.find("layers.3"), *attn));
  CHECK(!m.is_ancestor(*attn, *m.find("layers.3")));
  // wte 256x64 + wpe 64x64 floats.
  CHECK(m.param_bytes(*m.find("embed")) == (256 * 64 + 64 * 64) * 4);
  CHECK(m.param_bytes(0) == m.param_count(0) * 4);
}

TEST_CASE("the MoE example manifest has 8 experts a layer under moe.experts") {
  Front f("moe8");
  auto experts = f.manifest.find("layers.5.moe.experts");
  REQUIRE(experts);
  CHECK(f.manifest.is_list(*experts));
  CHECK(f.manifest.regions[*experts].children.size() == 8);
  CHECK(f.manifest.regions[*f.manifest.find("layers.5.moe.experts.7")].kind == "expert");
}

namespace {
std::string manifest_error(const std::string& json) {
  SourceManager sm;
  DiagnosticEngine diags(sm);
  FileId id = sm.add("m.json", json);
  auto m = parse_manifest(id, sm, diags);
  CHECK(!m);
  REQUIRE(diags.has_errors());
  return diags.render(diags.all().front());
}
const char* kHeader = R"("format": "piper-manifest", "version": 1, )";
}  // namespace

TEST_CASE("manifest errors say where and what") {
  CHECK(manifest_error("{ \"format\": \"piper-manifest\",\n  \"version\": }").find("m.json:2:14: error: manifest is not valid JSON") == 0);
  CHECK(manifest_error("[1, 2]").find("a manifest is a JSON object") != std::string::npos);
  CHECK(manifest_error(R"({"version": 1})").find("missing \"format\"") != std::string::npos);
  CHECK(manifest_error(R"({"format": "piper-manifest", "version": 7})").find("version 7 is not supported") !=
        std::string::npos);
  std::string base = std::string("{") + kHeader;
  CHECK(manifest_error(base + R"("sequence": ["a"], "regions": [{"name": "a", "params": [{"name": "w", "shape": [2, 3], "dtype": "float32", "bytes": 20}]}]})")
            .find("at regions[0] ('a').params[0].bytes: says 20 but shape and dtype give 24 bytes") != std::string::npos);
  CHECK(manifest_error(base + R"("sequence": ["b"], "regions": [{"name": "a"}]})").find("'b' is not a region") !=
        std::string::npos);
  CHECK(manifest_error(base + R"("sequence": ["a"], "regions": [{"name": "a"}, {"name": "a"}]})")
            .find("region is listed twice") != std::string::npos);
  CHECK(manifest_error(base + R"("sequence": ["a", "a.b"], "regions": [{"name": "a"}, {"name": "a.b"}]})")
            .find("overlaps") != std::string::npos);
  CHECK(manifest_error(base + R"("sequence": ["a"], "regions": [{"name": "a"}, {"name": "x", "params": [{"name": "w", "shape": [1]}]}]})")
            .find("'x' has parameters but is not in") != std::string::npos);
  CHECK(manifest_error(base + R"("sequence": ["a"], "regions": [{"name": "a", "params": [{"name": "w", "shape": [1], "dtype": "float8"}]}]})")
            .find("dtype must be one of") != std::string::npos);
  CHECK(manifest_error(base + R"("sequence": ["a"], "regions": [{"name": "a..b"}]})").find("without empty parts") !=
        std::string::npos);
}

namespace {
// Two regions that list one [4, 2] tensor: an embedding `e.w` and a head `h.w` (with its own bias).
std::string tied(const std::string& ties, const std::string& head_w = R"("shape": [4, 2], "dtype": "float32")") {
  return std::string("{") + kHeader + R"("sequence": ["e", "h"], "regions": [
    {"name": "e", "params": [{"name": "w", "shape": [4, 2], "dtype": "float32"}]},
    {"name": "h", "params": [{"name": "b", "shape": [4], "dtype": "float32"}, {"name": "w", )" + head_w + R"(}]}],
    "ties": )" + ties + "}";
}
}  // namespace

TEST_CASE("ties: a tensor shared by regions, counted once where one device holds it") {
  SourceManager sm;
  DiagnosticEngine diags(sm);
  auto m = parse_manifest(sm.add("m.json", tied(R"([[{"region": "e", "param": "w"}, {"region": "h", "param": "w"}]])")), sm, diags);
  REQUIRE(m);
  REQUIRE(m->ties.size() == 1);
  const RegionId e = *m->find("e"), h = *m->find("h");
  CHECK(m->tie_of(e, 0) == 0);
  CHECK(m->tie_of(h, 1) == 0);
  CHECK(m->tie_of(h, 0) == -1);
  CHECK(m->param_bytes(0) == 32 + 16 + 32);  // each region's own view
  CHECK(m->unique_param_bytes({0}) == 32 + 16);
  CHECK(m->unique_param_count({e, h}) == 12);
  CHECK(m->unique_param_bytes({h}) == 48);  // a stage with the head alone holds the tensor too
}

TEST_CASE("ties: malformed ties are located and explained") {
  CHECK(manifest_error(tied(R"([[{"region": "e", "param": "w"}]])")).find("at ties[0]: a tie lists at least two") !=
        std::string::npos);
  CHECK(manifest_error(tied(R"([[{"region": "e", "param": "w"}, {"region": "x", "param": "w"}]])"))
            .find("at ties[0][1]: 'x' is not a region") != std::string::npos);
  CHECK(manifest_error(tied(R"([[{"region": "e", "param": "w"}, {"region": "h", "param": "v"}]])"))
            .find("region 'h' lists no parameter 'v'") != std::string::npos);
  CHECK(manifest_error(tied(R"([[{"region": "e", "param": "w"}, {"region": "h", "param": "w"}]])",
                            R"("shape": [2, 4], "dtype": "float32")"))
            .find("h.w is float32[2,4], but e.w is float32[4,2]") != std::string::npos);
  CHECK(manifest_error(tied(R"([[{"region": "e", "param": "w"}, {"region": "h", "param": "w"}], [{"region": "h", "param": "w"}, {"region": "e", "param": "w"}]])"))
            .find("at ties[1][0]: h.w is already tied") != std::string::npos);
  CHECK(manifest_error(tied(R"([[{"region": "h", "param": "b"}, {"region": "h", "param": "w"}]])"))
            .find("a tie joins different regions") != std::string::npos);
  // A tensor-parallel slice cannot be tied (the head sharded by rows, the embedding whole).
  std::string sharded = tied(R"([[{"region": "e", "param": "w"}, {"region": "h", "param": "w"}]])",
                             R"("shape": [4, 2], "dtype": "float32", "shard": {"dim": 0})");
  sharded.replace(sharded.find(R"({"name": "h", )"), 14, R"({"name": "h", "tp": {"dim": "hidden", "count": 2}, )");
  CHECK(manifest_error(sharded).find("at ties[0][1]: h.w says how it shards over tensor parallelism") != std::string::npos);
}
