#include "runtime/model_zoo.h"

#include <torch/script.h>  // before doctest: its CHECK must be the one in effect

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/region_model.h"

using namespace piper::runtime;
namespace fs = std::filesystem;

namespace {
std::string read(const std::string& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("piper-zoo-" + std::to_string(::getpid()) + "-" + name);
}
}  // namespace

TEST_CASE("the example manifests are the zoo's (tests/manifests/regenerate.sh keeps them in sync)") {
  ModelConfig gpt;
  CHECK(measured_manifest_json(gpt) == read(std::string(PIPER_SOURCE_DIR) + "/tests/manifests/gpt8.json"));
  ModelConfig moe;
  moe.arch = "moe";
  CHECK(measured_manifest_json(moe) == read(std::string(PIPER_SOURCE_DIR) + "/tests/manifests/moe8.json"));
  ModelConfig tied;
  tied.tie_embeddings = true;
  CHECK(measured_manifest_json(tied) == read(std::string(PIPER_SOURCE_DIR) + "/tests/manifests/gpt8_tied.json"));
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
  auto p = temp("corrupt.pt");
  std::ofstream(p, std::ios::binary) << "PK\x03\x04 not really a zip";
  CHECK_THROWS_WITH_AS(RegionModel(p.string()), doctest::Contains("not a loadable TorchScript model"), std::runtime_error);
  fs::remove(p);
}
