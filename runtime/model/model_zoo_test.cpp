#include "runtime/model/model_zoo.h"

#include <torch/script.h>  // before doctest: its CHECK must be the one in effect

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/model/region_model.h"

using namespace piper::runtime;
namespace fs = std::filesystem;

namespace {
std::string read(const std::string& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
// Equal, except that measured activation memory may differ: the fp32 records ("memory") by `tol`
// relatively or 8 KiB (which temporaries a kernel allocates depends on the processor: 4,224 bytes
// more on one than where the files were made); the bf16 records ("memory_bf16") in value entirely,
// only their shape is compared — on a processor with AMX-BF16, oneDNN's bf16 backward keeps a
// workspace that grows with the batch (+38% at 2 samples), so no tolerance holds across processors.
// Everything else — regions, shapes, parameters, FLOPs — must be identical.
bool same_manifest(const nlohmann::json& a, const nlohmann::json& b, double tol, double slack, std::string& where) {
  if (slack != 0 && a.is_number() && b.is_number()) {
    if (slack < 0) return true;  // bf16: any value
    const double x = a.get<double>(), y = b.get<double>();
    if (std::abs(x - y) <= std::max(tol * std::max(std::abs(x), std::abs(y)), slack)) return true;
    where += fmt::format(": {} against {}", x, y);
    return false;
  }
  if (a.type() != b.type() || (!a.is_structured() && a != b) || a.size() != b.size()) {
    where += fmt::format(": {} against {}", a.dump().substr(0, 80), b.dump().substr(0, 80));
    return false;
  }
  if (a.is_object())
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key())) return where += "." + it.key() + " missing", false;
      std::string at = where + "." + it.key();
      const double inner = slack != 0                                 ? slack
                           : it.key().rfind("memory_bf16", 0) == 0 ? -1.0
                           : it.key().rfind("memory", 0) == 0      ? 8192.0
                                                                   : 0.0;
      if (!same_manifest(it.value(), b[it.key()], tol, inner, at)) return where = at, false;
    }
  if (a.is_array())
    for (size_t i = 0; i < a.size(); ++i) {
      std::string at = where + fmt::format("[{}]", i);
      if (!same_manifest(a[i], b[i], tol, slack, at)) return where = at, false;
    }
  return true;
}

void check_in_sync(const ModelConfig& c, const std::string& file) {
  std::string where = file;
  CHECK_MESSAGE(same_manifest(nlohmann::json::parse(measured_manifest_json(c)),
                              nlohmann::json::parse(read(std::string(PIPER_SOURCE_DIR) + "/tests/manifests/" + file)), 0.05, 0.0,
                              where),
                where);
}

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("piper-zoo-" + std::to_string(::getpid()) + "-" + name);
}
}  // namespace

TEST_CASE("the example manifests are the zoo's (tests/manifests/regenerate.sh keeps them in sync)") {
  ModelConfig gpt;
  check_in_sync(gpt, "gpt8.json");
  ModelConfig moe;
  moe.arch = "moe";
  check_in_sync(moe, "moe8.json");
  ModelConfig tied;
  tied.tie_embeddings = true;
  check_in_sync(tied, "gpt8_tied.json");
  // The comparison is not blind: a 10% memory change (of more than 8 KiB), a bf16 record of another
  // shape, or another region kind is caught, 2% is not.
  nlohmann::json m = nlohmann::json::parse(read(std::string(PIPER_SOURCE_DIR) + "/tests/manifests/gpt8.json"));
  std::string where;
  CHECK(same_manifest(m, m, 0.05, 0.0, where));
  nlohmann::json other = m;
  other["regions"][1]["memory"]["saved"][0] = m["regions"][1]["memory"]["saved"][0].get<double>() * 1.02;
  CHECK(same_manifest(m, other, 0.05, 0.0, where));
  other["regions"][1]["memory"]["saved"][0] = m["regions"][1]["memory"]["saved"][0].get<double>() * 1.1;
  CHECK(!same_manifest(m, other, 0.05, 0.0, where));
  other = m;  // bf16: any value, not any shape
  auto& bf16 = other["regions"][1]["memory_bf16"]["backward_peak"];
  bf16[0] = bf16[0].get<double>() * 1.5;
  CHECK(same_manifest(m, other, 0.05, 0.0, where));
  bf16.push_back(0);
  CHECK(!same_manifest(m, other, 0.05, 0.0, where));
  other = m;
  other["regions"][1]["kind"] = "mlp";
  CHECK(!same_manifest(m, other, 0.05, 0.0, where));
}

TEST_CASE("zoo models: regions chained equal the whole model, forward and gradients") {
  for (const char* arch : {"gpt", "moe"}) {
    CAPTURE(arch);
    ModelConfig c;
    c.arch = arch;
    c.layers = 2;
    c.d_model = 32;
    c.ffn = 64;
    c.seq = 16;
    c.experts = 4;
    auto p = temp(std::string(arch) + ".pt");
    save_model(c, p.string());
    RegionModel m(p.string());
    CHECK(m.sequence() == std::vector<std::string>{"embed", "layers.0", "layers.1", "head"});
    auto r = m.check_regions(2, 1);
    CHECK(r.max_output_diff == 0);
    CHECK(r.max_grad_diff == 0);
    CHECK(r.loss == doctest::Approx(std::log(256.0)).epsilon(0.05));  // near-uniform at initialisation
    fs::remove(p);
  }
}

// Token dropping: with --capacity-factor each expert keeps at most its capacity of a sequence's tokens,
// those whose probability for it is highest; the gates it keeps are the dropless model's (same seed,
// same weights), the rest 0. At factor 1 with 4 experts top-2 over 16 tokens the capacity is 8.
TEST_CASE("moe capacity: an expert keeps the tokens of a sequence that score it highest, at most its capacity") {
  ModelConfig c;
  c.arch = "moe";
  c.layers = 1;
  c.d_model = 32;
  c.ffn = 64;
  c.seq = 16;
  c.experts = 4;
  auto dropless_path = temp("dropless.pt"), capped_path = temp("capped.pt");
  save_model(c, dropless_path.string());
  c.capacity_factor = 1.0;
  CHECK(nlohmann::json::parse(manifest_json(c))["model"]["config"]["expert_capacity"] == 8);
  save_model(c, capped_path.string());
  auto dropless = torch::jit::load(dropless_path.string()), capped = torch::jit::load(capped_path.string());
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({4, c.seq, c.d_model}) * 4;  // spread: routing far from uniform
  auto route = [&](torch::jit::Module& m) {
    return m.attr("layers_0").toModule().attr("moe").toModule().attr("router").toModule().forward({x}).toTuple()->elements();
  };
  const torch::Tensor free = route(dropless)[1].toTensor(), gates = route(capped)[1].toTensor();
  const torch::Tensor h = route(capped)[0].toTensor();
  const torch::Tensor probs = torch::softmax(torch::linear(h, capped.attr("layers_0").toModule().attr("moe").toModule()
                                                                   .attr("router").toModule().attr("weight").toTensor()), -1);
  CHECK((gates != 0).sum(1).max().item<int64_t>() <= 8);     // per sequence and expert
  CHECK((free != 0).sum(1).max().item<int64_t>() > 8);       // the dropless routing exceeds it somewhere
  CHECK(((gates == free) | (gates == 0)).all().item<bool>());  // kept gates unchanged, not renormalised
  const torch::Tensor dropped = (free != 0) & (gates == 0);
  CHECK(dropped.sum().item<int64_t>() > 0);
  // Every dropped token scores its expert no higher than the lowest token the expert kept.
  const torch::Tensor kept_min = torch::where(gates != 0, probs, torch::full_like(probs, 2.0)).amin(1, true);
  CHECK((torch::where(dropped, probs, torch::zeros_like(probs)) <= kept_min).all().item<bool>());
  // A shorter sequence (piper-run --seq-len 8): the capacity follows its length, ceil(8 * 2 / 4) = 4.
  const torch::Tensor shorter = x.slice(1, 0, 8);
  auto route_short = [&](torch::jit::Module& m) {
    return m.attr("layers_0").toModule().attr("moe").toModule().attr("router").toModule().forward({shorter}).toTuple()->elements()[1].toTensor();
  };
  const torch::Tensor short_free = route_short(dropless), short_gates = route_short(capped);
  CHECK((short_gates != 0).sum(1).max().item<int64_t>() <= 4);
  CHECK((short_free != 0).sum(1).max().item<int64_t>() > 4);
  c.capacity_factor = 8.0;  // a sequence's tokens all fit: nothing to drop, no capacity recorded
  CHECK(nlohmann::json::parse(manifest_json(c))["model"]["config"]["expert_capacity"] == 0);
  fs::remove(dropless_path);
  fs::remove(capped_path);
}

TEST_CASE("the same seed gives the same weights") {
  ModelConfig c;
  c.layers = 1;
  auto a = temp("a.pt"), b = temp("b.pt");
  save_model(c, a.string());
  save_model(c, b.string());
  CHECK(RegionModel(a.string()).check_regions(1, 0).loss == RegionModel(b.string()).check_regions(1, 0).loss);
  c.seed = 1;
  save_model(c, b.string());
  CHECK(RegionModel(a.string()).check_regions(1, 0).loss != RegionModel(b.string()).check_regions(1, 0).loss);
  fs::remove(a);
  fs::remove(b);
}

TEST_CASE("a saved model's parameters require grad: it trains in PyTorch as it loads") {
  ModelConfig c;
  c.layers = 1;
  auto a = temp("rg.pt");
  save_model(c, a.string());
  auto m = torch::jit::load(a.string());
  int n = 0;
  for (const auto& p : m.parameters()) {
    CHECK(p.requires_grad());
    ++n;
  }
  CHECK(n > 0);
  fs::remove(a);
}

TEST_CASE("bad configurations and bad model files are clear errors") {
  ModelConfig c;
  c.heads = 5;
  CHECK_THROWS_WITH_AS(manifest_json(c), doctest::Contains("not divisible by --heads 5"), std::runtime_error);
  c.heads = 4;
  c.capacity_factor = -1;
  CHECK_THROWS_WITH_AS(manifest_json(c), doctest::Contains("--capacity-factor must be positive"), std::runtime_error);
  c.capacity_factor = 1;
  CHECK_THROWS_WITH_AS(manifest_json(c), doctest::Contains("--capacity-factor is for moe models"), std::runtime_error);
  auto p = temp("corrupt.pt");
  std::ofstream(p, std::ios::binary) << "PK\x03\x04 not really a zip";
  CHECK_THROWS_WITH_AS(RegionModel(p.string()), doctest::Contains("not a loadable TorchScript model"), std::runtime_error);
  fs::remove(p);
}
