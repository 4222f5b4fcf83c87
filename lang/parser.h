// Parses strategy text into the syntax tree; syntax errors become plain-worded diagnostics.
#pragma once
#include <memory>

#include "lang/ast.h"
#include "lang/diagnostic.h"

namespace piper {

struct ParseLimits {
  size_t max_bytes = 1 << 20;       // a strategy is a page of text, not a data file
  size_t max_tokens = 200000;
  size_t max_nesting = 64;          // brackets and blocks; deeper input is an error, not a stack overflow
  size_t max_tree_depth = 4000;     // long operator chains nest too (the builder and evaluator recurse)
};

// What piper-check's canonical form (`--emit ast`) starts with. Such text was printed from a checked
// strategy, so it is a strategy, however long its orders made it: it is read under kCanonicalLimits
// instead (the canonical form must always check again).
inline constexpr const char* kCanonicalHeader = "# checked strategy: ";
inline constexpr ParseLimits kCanonicalLimits{64u << 20, 20000000, 64, 4000};

// Returns null when the file has syntax errors (all of them are reported).
std::unique_ptr<ast::File> parse_strategy(FileId file, const SourceManager& sources,
                                          DiagnosticEngine& diags, const ParseLimits& limits = {});

}  // namespace piper
