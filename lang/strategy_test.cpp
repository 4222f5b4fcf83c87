#include "lang/strategy.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>

#include "lang/parser.h"
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

// bench/fuzz.sh found a valid strategy whose canonical text (50,000 orders, 1.5 MB) the parser then
// refused for its size. Orders in arithmetic progression print as one loop; whatever else is long
// still checks, because the canonical form is read under its own limits.
TEST_CASE("the canonical form of a strategy with many orders is short and checks again") {
  Front f("gpt8");
  auto s = f.check("split batch into 8;\nfor k in 0..49999 { order fwd(0, 0) -> fwd(0, 1); }\n"
                   "for k in 0..6 { order bwd(0, k + 1) -> bwd(0, k); }\n");
  REQUIRE_MESSAGE(s, f.errors());
  CHECK(s->directives.size() == 50008);
  std::string printed = print_strategy(*s, f.manifest);
  CHECK(printed.find("for i in 0..49999 { order fwd(0, 0) -> fwd(0, 1); }") != std::string::npos);
  CHECK(printed.find("for i in 0..6 { order bwd(0, i + 1) -> bwd(0, i); }") != std::string::npos);
  auto again = f.check(printed);
  REQUIRE_MESSAGE(again, f.errors());
  CHECK(again->directives.size() == s->directives.size());
  CHECK(print_strategy(*again, f.manifest) == printed);

  // 60,000 orders in no progression: 1.6 MB of canonical text, over the limit for what a user writes.
  Front g("gpt8");
  auto t = g.check("split batch into 8;\nfor k in 0..59999 { order fwd(0, k % 2) -> fwd(0, 2 + k % 3); }\n");
  REQUIRE_MESSAGE(t, g.errors());
  std::string long_text = print_strategy(*t, g.manifest);
  CHECK(long_text.size() > ParseLimits{}.max_bytes);
  auto long_again = g.check(long_text);
  REQUIRE_MESSAGE(long_again, g.errors());
  CHECK(long_again->directives.size() == t->directives.size());
}
