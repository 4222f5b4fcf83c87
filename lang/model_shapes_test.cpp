#include "lang/model_shapes.h"

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

#include "lang/manifest.h"

using namespace piper;

namespace {
Manifest parse(const std::string& json) {
  SourceManager sm;
  DiagnosticEngine diags(sm);
  auto m = parse_manifest(sm.add("shape.json", json), sm, diags);
  for (const auto& d : diags.all()) FAIL_CHECK(diags.render(d));
  REQUIRE(m);
  return *m;
}
double work_flops(const Region& r, Work::Kind kind) {
  double f = 0;
  for (const Work& w : r.work)
    if (w.kind == kind) f += w.flops();
  return f;
}
}  // namespace

TEST_CASE("published shapes: parameter counts within 1% of the published sizes") {
  for (const std::string& name : shape_presets()) {
    CAPTURE(name);
    const ShapeConfig c = *shape_preset(name);
    const Manifest m = parse(shape_manifest_json(c));
    const double params = static_cast<double>(m.param_count(0)), published = static_cast<double>(c.published_params);
    CHECK(std::abs(params / published - 1) < 0.01);
  }
}

TEST_CASE("Llama-3 8B: GQA and SwiGLU shapes, FLOPs per matrix product and causal attention score") {
  const Manifest m = parse(shape_manifest_json(*shape_preset("llama3-8b")));
  const Region& attn = m.regions[*m.find("layers.0.attn")];
  REQUIRE(attn.tp);
  CHECK(attn.tp->count == 8);  // tensor parallelism is bound by the 8 key/value heads
  CHECK(attn.params[2].name == "wk");
  CHECK(attn.params[2].shape == std::vector<int64_t>{1024, 4096});
  const double s = 8192, d = 4096;
  // q, k, v (4096 + 2·1024 outputs) and o, per token 2 FLOPs per weight.
  CHECK(work_flops(attn, Work::Kind::Gemm) == doctest::Approx(2 * s * d * (4096 + 2048 + 4096)));
  // QKᵀ and PV: 2·s²·d each, causal half.
  CHECK(work_flops(attn, Work::Kind::Attention) == doctest::Approx(2 * s * s * d));
  CHECK(attn.flops == static_cast<int64_t>(work_flops(attn, Work::Kind::Gemm) + work_flops(attn, Work::Kind::Attention)));
  const Region& mlp = m.regions[*m.find("layers.31.mlp")];
  CHECK(mlp.flops == static_cast<int64_t>(2 * s * 3 * d * 14336));
  CHECK(mlp.memory.has_value());
  CHECK(mlp.memory_tp2->saved.at1 < mlp.memory->saved.at1);
  // Per token the forward is about 2N FLOPs plus attention (the 6N + 12·L·d·s rule of thumb over 3).
  const double n = static_cast<double>(m.param_count(0)) - 128256.0 * 4096;  // the embedding's lookup is free
  CHECK(static_cast<double>(m.flops(0)) / s == doctest::Approx(2 * n + 2 * 32 * s * d).epsilon(0.01));
}

TEST_CASE("DeepSeek-V3: latent attention, 3 dense layers, 256 routed experts top-8 and a shared one") {
  const Manifest m = parse(shape_manifest_json(*shape_preset("deepseek-v3")));
  CHECK(m.find("layers.2.mlp"));
  CHECK(!m.find("layers.3.mlp"));
  const RegionId experts = *m.find("layers.3.moe.experts");
  CHECK(m.is_list(experts));
  CHECK(m.regions[experts].children.size() == 256);
  CHECK(m.regions[*m.find("layers.60.moe.shared")].kind == "shared_expert");
  // Activated parameters: the published 37B (report §4.2) within 2%: all but 248 of 256 experts a layer.
  const double all = static_cast<double>(m.param_count(0));
  const double expert = static_cast<double>(m.param_count(*m.find("layers.3.moe.experts.0")));
  const double active = all - 58 * 248 * expert - 129280.0 * 7168;  // less the embedding lookup
  CHECK(std::abs(active / 37e9 - 1) < 0.02);
  // An expert's products see top_k / experts of a sample's tokens: 4096 · 8 / 256 = 128.
  CHECK(m.regions[*m.find("layers.3.moe.experts.0")].work[0].m == 128);
}

TEST_CASE("a tied shape shares its embedding with the output projection") {
  ShapeConfig c = *shape_preset("llama3-8b");
  c.tie_embeddings = true;
  const Manifest m = parse(shape_manifest_json(c));
  REQUIRE(m.ties.size() == 1);
  CHECK(m.unique_param_count({0}) == m.param_count(0) - 128256LL * 4096);
}

TEST_CASE("inconsistent shapes are refused with the reason") {
  ShapeConfig c;
  c.kv_heads = 5;
  CHECK_THROWS_WITH_AS(shape_manifest_json(c), "--heads 32 is not a multiple of --kv-heads 5", std::invalid_argument);
  c = ShapeConfig{};
  c.experts = 8;
  CHECK_THROWS_AS(shape_manifest_json(c), std::invalid_argument);
}

TEST_CASE("a region's work must add up to its flops") {
  SourceManager sm;
  DiagnosticEngine diags(sm);
  const char* json = R"({"format": "piper-manifest", "version": 1, "sequence": ["a"], "regions": [
    {"name": "a", "flops": 100, "work": [{"op": "gemm", "m": 2, "n": 3, "k": 4}]}]})";
  CHECK(!parse_manifest(sm.add("m.json", json), sm, diags));
  REQUIRE(diags.has_errors());
  CHECK(diags.render(diags.all().front()).find("adds up to 48 FLOPs per sample, but the region's \"flops\" says 100") !=
        std::string::npos);
}
