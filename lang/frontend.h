// The front end in one call: read a model's manifest, then parse and check a strategy against it.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lang/checker.h"
#include "lang/diagnostic.h"
#include "lang/manifest.h"
#include "lang/strategy.h"

namespace piper {

// The command-line settings as one source buffer, so `--set` and `--np` errors get a caret too.
struct CommandLine {
  std::optional<int64_t> np;
  std::vector<std::string> sets;  // "NAME=VALUE"
  std::optional<int64_t> batch_size;
  std::vector<std::string> search_path;
};

enum class FrontendStatus { Ok, Invalid, IoError };

struct FrontendResult {
  FrontendStatus status = FrontendStatus::Ok;
  std::string io_error;  // for IoError: what could not be read
  std::optional<Manifest> manifest;
  std::optional<CheckedStrategy> strategy;
};

// Reads MODEL (a manifest .json or a model.pt) into `sources` and parses it.
FrontendResult load_model(const std::string& model_path, SourceManager& sources, DiagnosticEngine& diags);

FrontendResult run_frontend(const std::string& model_path, const std::string& strategy_path, const CommandLine& cmd,
                            SourceManager& sources, DiagnosticEngine& diags);

// Checks strategy text already in `sources` against a manifest (used by tests and the fuzzer).
std::optional<CheckedStrategy> check_text(FileId strategy, const Manifest& m, const CommandLine& cmd,
                                          SourceManager& sources, DiagnosticEngine& diags);

// Where `use` looks after the using file's folder: PIPER_STRATEGY_PATH, then the strategy library
// (installed beside the tools, or in the source tree).
std::vector<std::string> default_search_path();

}  // namespace piper
