#include "lang/strategy.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>

#include "tests/lang_fixture.h"

using namespace piper;
using piper::testing::Front;

// The canonical text is itself a strategy: checking it again gives the same records (and text).
TEST_CASE("every library strategy prints back to text that checks to the same strategy") {
  for (const auto& entry : std::filesystem::directory_iterator(PIPER_STRATEGY_DIR)) {
    if (entry.path().extension() != ".piper") continue;
    std::string text = testing::read_file(entry.path().string());
    std::string model = text.find("experts") != std::string::npos ? "moe8" : "gpt8";
    CAPTURE(entry.path().filename().string());
    Front f(model);
    CommandLine cmd;
    cmd.search_path.push_back(PIPER_STRATEGY_DIR);
    FileId id = f.sources.add(entry.path().string(), text);
    auto first = check_text(id, f.manifest, cmd, f.sources, f.diags);
    REQUIRE_MESSAGE(first, f.errors());
    std::string printed = print_strategy(*first, f.manifest);
    auto second = f.check(printed);
    REQUIRE_MESSAGE(second, std::string(f.errors() + "\n" + printed));
    // Parameters are inlined in the canonical text, so only their header comment differs.
    auto without_params = [](std::string t) {
      size_t at = t.find("# params:");
      return at == std::string::npos ? t : t.erase(at, t.find('\n', at) - at + 1);
    };
    CHECK(print_strategy(*second, f.manifest) == without_params(printed));
    CHECK(second->directives.size() == first->directives.size());
    CHECK(second->stages.size() == first->stages.size());
    for (size_t i = 0; i < first->stages.size(); ++i) {
      CHECK(second->stages[i].regions == first->stages[i].regions);
      CHECK(second->stages[i].coord == first->stages[i].coord);
    }
  }
}

TEST_CASE("region lists print compactly") {
  Front f("moe8");
  const Manifest& m = f.manifest;
  std::vector<RegionId> layers;
  for (int i = 0; i < 8; ++i) layers.push_back(*m.find(fmt::format("layers.{}", i)));
  CHECK(print_regions(layers, m) == "layers[*]");
  CHECK(print_regions({layers[2], layers[3], layers[4]}, m) == "layers[2..4]");
  CHECK(print_regions({*m.find("embed"), layers[0], *m.find("head")}, m) == "embed, layers[0], head");
  CHECK(print_regions({*m.find("layers.1.moe.experts")}, m) == "layers[1].moe.experts");
  std::vector<RegionId> experts;
  for (int i = 0; i < 8; ++i) experts.push_back(*m.find(fmt::format("layers.{}.moe.experts", i)));
  CHECK(print_regions(experts, m) == "layers[*].moe.experts");
  CHECK(print_regions({experts[1], experts[2]}, m) == "layers[1..2].moe.experts");
}
