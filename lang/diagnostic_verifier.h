// MLIR-style `# expected-error {{...}}` checking: the diagnostics a run produced against a file's comments.
#pragma once
#include <string>
#include <vector>

#include "lang/diagnostic.h"

namespace piper {

// Scans every source buffer for expectations:
//   # expected-error {{text}}        on this line      # expected-error@+1 {{text}}  on the next line
//   # expected-note@-2 {{text}}      two lines above   # expected-error@cmdline {{text}}  in --set/--np
//   # expected-note@* {{text}}       anywhere (notes without a location)
// Every error and warning must be expected; expected notes must appear. Returns the mismatches.
std::vector<std::string> verify_diagnostics(const DiagnosticEngine& diags);

}  // namespace piper
