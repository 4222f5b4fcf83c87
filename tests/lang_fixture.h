// Test helpers for the front end: load an example manifest and check strategy text in memory.
#pragma once
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "lang/frontend.h"
#include "lang/manifest.h"
#include "lang/strategy.h"

namespace piper::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string source_path(const std::string& rel) { return std::string(PIPER_SOURCE_DIR) + "/" + rel; }

struct Front {
  SourceManager sources;
  DiagnosticEngine diags{sources};
  Manifest manifest;

  explicit Front(const std::string& model = "gpt8") {
    FileId id = sources.add(model + ".json", read_file(source_path("tests/manifests/" + model + ".json")));
    auto m = parse_manifest(id, sources, diags);
    REQUIRE_MESSAGE(m.has_value(), errors());
    manifest = std::move(*m);
  }

  // Checks `text` as if it were a file in strategies/ (so `use "1f1b.piper"` finds the library).
  std::optional<CheckedStrategy> check(const std::string& text, CommandLine cmd = {}) {
    cmd.search_path.push_back(PIPER_STRATEGY_DIR);
    FileId id = sources.add(source_path("strategies/<test>.piper"), text);
    return check_text(id, manifest, cmd, sources, diags);
  }

  std::string errors() const {
    std::string out;
    for (const auto& d : diags.all()) out += diags.render(d);
    return out;
  }

  // The first error's message (for tests of one diagnostic).
  std::string first_error() const {
    for (const auto& d : diags.all())
      if (d.severity == Severity::Error) return d.message;
    return "";
  }
};

template <typename T>
std::vector<const T*> directives_of(const CheckedStrategy& s) {
  std::vector<const T*> out;
  for (const auto& d : s.directives)
    if (const auto* x = std::get_if<T>(&d.body)) out.push_back(x);
  return out;
}

}  // namespace piper::testing
