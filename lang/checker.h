// Type-checks a strategy file (and the files it uses) against a manifest into a CheckedStrategy.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lang/diagnostic.h"
#include "lang/manifest.h"
#include "lang/strategy.h"

namespace piper {

struct Override {
  std::string name;
  std::string value;  // integer or true/false
  SourceLoc loc;      // into the command-line buffer
};

struct CheckOptions {
  std::optional<int64_t> world;         // --np; when absent the mesh decides
  std::vector<Override> overrides;      // --set NAME=VALUE
  std::optional<int64_t> batch_size;    // global batch, to check it splits evenly
  std::vector<std::string> search_path; // where `use "x.piper"` looks after the using file's folder
  SourceLoc world_loc;                  // where --np was given, for notes
  int64_t max_steps = 2'000'000;        // statements and order instances evaluated, so nothing hangs
};

// Checks the strategy in `file` (already added to `sources`). Returns nothing when any error was reported.
std::optional<CheckedStrategy> check_strategy(FileId file, const Manifest& manifest, const CheckOptions& options,
                                              SourceManager& sources, DiagnosticEngine& diags);

}  // namespace piper
