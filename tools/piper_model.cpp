// piper-model: builds the zoo's models as model.pt (or just their manifest), and verifies that any
// model.pt's regions chain to the whole model (forward and gradients).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <tuple>

#include "lang/model_shapes.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/region_memory.h"
#include "runtime/model/region_model.h"
#include "runtime/model/region_model_impl.h"

// `verify --tp N`: one line for the regions that pass, one per region that does not.
bool verify_tensor_parallel(piper::runtime::RegionModel& m, const std::string& path, int64_t tp, int64_t batch) {
  const auto checks = m.check_tensor_parallel(tp, batch, 0);
  double out = 0, grad = 0;
  bool ok = !checks.empty();
  for (const auto& c : checks) {
    const bool good = c.error.empty() && c.max_output_diff <= 1e-5 && c.max_grad_diff <= 1e-5;
    if (!good && c.error.empty())
      fmt::print("{}: region '{}' as {} slices: max |output diff| {:.3g}, max |grad diff| {:.3g}: MISMATCH\n", path, c.region,
                 tp, c.max_output_diff, c.max_grad_diff);
    if (!c.error.empty())
      fmt::print("{}: region '{}' does not run on a slice of {} (its code must take head and hidden counts from its "
                 "weights' shapes, docs/models.md):\n{}\n", path, c.region, tp, c.error);
    out = std::max(out, c.max_output_diff);
    grad = std::max(grad, c.max_grad_diff);
    ok = ok && good;
  }
  if (checks.empty()) fmt::print("{}: no region has a tensor-parallel layout (`tp` in its manifest)\n", path);
  else
    fmt::print("{}: {} regions as {} slices summed vs whole: max |output diff| {:.3g}, max |grad diff| {:.3g}: {}\n", path,
               checks.size(), tp, out, grad, ok ? "ok" : "MISMATCH");
  return ok;
}

// `verify`: the regions chained against the whole model, then (with --tp) each region as slices.
bool verify_model(const std::string& path, int64_t batch, int64_t tp) {
  piper::runtime::RegionModel m(path);
  auto r = m.check_regions(batch, 0);
  bool ok = r.max_output_diff <= 1e-5 && r.max_grad_diff <= 1e-5;
  fmt::print("{}: {} regions, {} parameters; loss {:.4f}; whole vs chained: max |output diff| {:.3g}, "
             "max |grad diff| {:.3g}: {}\n",
             path, r.regions, r.parameters, r.loss, r.max_output_diff, r.max_grad_diff, ok ? "ok" : "MISMATCH");
  if (tp > 0) ok = verify_tensor_parallel(m, path, tp, batch) && ok;
  return ok;
}

// `piper-model llama|deepseek`: a published shape (--preset) or one of its own, as a manifest for
// planning (lang/model_shapes.h); every size option overrides the preset's.
struct ShapeCommand {
  std::string preset, out;
  bool manifest_only = false, tie = false;
  std::vector<std::pair<int64_t piper::ShapeConfig::*, std::optional<int64_t>>> sizes;
  CLI::App* sub = nullptr;

  void add(CLI::App& app, const std::string& family) {
    const bool moe = family == "deepseek";
    sub = app.add_subcommand(family, moe ? "DeepSeek-style mixture of experts (latent attention, shared and routed experts): a manifest for planning"
                                         : "Llama-style dense transformer (GQA, SwiGLU, RMSNorm, RoPE): a manifest for planning");
    std::string presets;
    for (const auto& n : piper::shape_presets())
      if ((n.rfind("deepseek", 0) == 0) == moe) presets += (presets.empty() ? "" : ", ") + n;
    sub->add_option("--preset", preset, "a published configuration: " + presets + " (default: the first; size options override it)");
    using C = piper::ShapeConfig;
    std::vector<std::tuple<const char*, int64_t C::*, const char*>> opts = {
        {"--layers", &C::layers, "transformer blocks"}, {"--d-model", &C::d_model, "hidden size"},
        {"--heads", &C::heads, "query heads"}, {"--kv-heads", &C::kv_heads, "key/value heads (grouped-query attention)"},
        {"--head-dim", &C::head_dim, "per-head size (default d-model / heads)"}, {"--ffn", &C::ffn, "dense MLP inner size"},
        {"--vocab", &C::vocab, "vocabulary"}, {"--seq", &C::seq, "sequence length"}};
    if (moe)
      opts.insert(opts.end(), {{"--experts", &C::experts, "routed experts per layer"}, {"--top-k", &C::top_k, "experts per token"},
                               {"--shared-experts", &C::shared_experts, "shared experts (every token)"},
                               {"--expert-ffn", &C::expert_ffn, "an expert's inner size"},
                               {"--dense-layers", &C::dense_layers, "leading layers with a dense MLP"},
                               {"--q-lora", &C::q_lora, "latent attention: query bottleneck"},
                               {"--kv-lora", &C::kv_lora, "latent attention: key/value bottleneck"},
                               {"--qk-rope-dim", &C::qk_rope_dim, "latent attention: per-head RoPE part"},
                               {"--qk-nope-dim", &C::qk_nope_dim, "latent attention: per-head part without RoPE"},
                               {"--v-head-dim", &C::v_head_dim, "latent attention: per-head value size"}});
    sizes.reserve(opts.size());
    for (const auto& [flag, member, help] : opts) {
      sizes.push_back({member, std::nullopt});
      sub->add_option(flag, sizes.back().second, help);
    }
    sub->add_flag("--tie-embeddings", tie, "the output projection is the token embedding");
    sub->add_option("-o,--output", out, "the manifest .json to write")->required();
    sub->add_flag("--manifest-only", manifest_only, "write the region manifest (required: these shapes are for planning)");
  }

  int run(const std::string& family) const {
    if (!manifest_only)
      throw std::runtime_error(family + " shapes are for planning: pass --manifest-only (the zoo's trainable models are gpt and moe)");
    // Without --preset: the family's first published shape (llama3-8b, deepseek-v3), sizes overridden.
    const std::string base = !preset.empty() ? preset : family == "llama" ? "llama3-8b" : "deepseek-v3";
    piper::ShapeConfig c;
    {
      auto p = piper::shape_preset(base);
      if (!p || p->family != family) throw std::runtime_error(fmt::format("--preset: no {} configuration '{}'", family, preset));
      c = *p;
    }
    for (const auto& [member, value] : sizes)
      if (value) c.*member = *value;
    c.tie_embeddings = c.tie_embeddings || tie;
    std::ofstream f(out);
    if (!(f << piper::shape_manifest_json(c))) throw std::runtime_error("cannot write " + out);
    return 0;
  }
};

int main(int argc, char** argv) {
  CLI::App app{"piper-model: build GPT and MoE models with their region manifest, write the manifests of Llama and DeepSeek shapes, or verify a model.pt"};
  app.require_subcommand(1);
  piper::runtime::ModelConfig c;
  std::string out;
  bool manifest_only = false, no_measure = false;
  for (const char* arch : {"gpt", "moe"}) {
    auto* sub = app.add_subcommand(arch, std::string(arch) == "gpt" ? "GPT-2-style dense transformer"
                                                                    : "the same with a top-k mixture of experts per layer");
    sub->add_option("--layers", c.layers, "transformer blocks")->capture_default_str();
    sub->add_option("--d-model", c.d_model, "hidden size")->capture_default_str();
    sub->add_option("--heads", c.heads, "attention heads")->capture_default_str();
    sub->add_option("--ffn", c.ffn, "MLP (or expert) inner size")->capture_default_str();
    sub->add_option("--vocab", c.vocab, "vocabulary (256 for byte-level text)")->capture_default_str();
    sub->add_option("--seq", c.seq, "sequence length")->capture_default_str();
    if (std::string(arch) == "moe") {
      sub->add_option("--experts", c.experts, "experts per layer")->capture_default_str();
      sub->add_option("--top-k", c.top_k, "experts per token")->capture_default_str();
      sub->add_option("--capacity-factor", c.capacity_factor,
                      "each expert takes at most ceil(F * seq * top-k / experts) tokens of a sequence, those scoring it "
                      "highest; the rest skip it (token dropping; 0: dropless)")
          ->capture_default_str();
    }
    sub->add_flag("--tie-embeddings", c.tie_embeddings,
                  "the output head's projection is the token embedding itself (tied weights, declared in the manifest)");
    sub->add_option("--seed", c.seed, "weight initialisation seed")->capture_default_str();
    sub->add_option("--name", c.name, "model name in the manifest");
    sub->add_option("-o,--output", out, "model.pt to write (or the manifest .json with --manifest-only)")->required();
    sub->add_flag("--manifest-only", manifest_only, "write only the region manifest (no weights allocated)");
    sub->add_flag("--no-measure", no_measure,
                  "with --manifest-only: leave out the measured activation memory (for models too large to probe)");
    sub->callback([&c, arch] { c.arch = arch; });
  }
  ShapeCommand llama, deepseek;
  llama.add(app, "llama");
  deepseek.add(app, "deepseek");
  std::string verify_path, measure_path, measure_out;
  int64_t batch = 2;
  auto* verify = app.add_subcommand("verify", "check that the regions chained equal the whole model (forward and gradients)");
  verify->add_option("MODEL", verify_path, "model.pt")->required();
  verify->add_option("--batch", batch, "samples in the check batch")->capture_default_str();
  int64_t tp = 0;
  verify->add_option("--tp", tp, "also run every region with a tensor-parallel layout as N slices summed, against it whole")
      ->check(CLI::Range(int64_t{2}, int64_t{1024}));
  auto* measure = app.add_subcommand("measure", "measure each region's activation memory and record it in the manifest "
                                                  "(for models exported from PyTorch)");
  measure->add_option("MODEL", measure_path, "model.pt")->required();
  measure->add_option("-o,--output", measure_out, "where to write the model (default: in place)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (measure->parsed()) {
      const std::string manifest = piper::runtime::measure_manifest(measure_path);
      piper::runtime::RegionModel m(measure_path);
      m.impl().root.save(measure_out.empty() ? measure_path : measure_out, {{"piper/manifest.json", manifest}});
      fmt::print("{}: activation memory measured for every region\n", measure_out.empty() ? measure_path : measure_out);
      return 0;
    }
    if (llama.sub->parsed()) return llama.run("llama");
    if (deepseek.sub->parsed()) return deepseek.run("deepseek");
    if (verify->parsed()) return verify_model(verify_path, batch, tp) ? 0 : 1;
    if (manifest_only) {
      std::ofstream f(out);
      if (!(f << (no_measure ? piper::runtime::manifest_json(c) : piper::runtime::measured_manifest_json(c))))
        throw std::runtime_error("cannot write " + out);
    } else {
      piper::runtime::save_model(c, out);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "piper-model: error: {}\n", e.what());
    return 1;
  }
}
