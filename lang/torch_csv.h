// torch.distributed.pipelining's schedule CSV (a line per pipeline rank, actions like 0F1, 2I0, 3W0,
// (0F3;3B1)OVERLAP_F_B) read as `sequence` blocks of `order` statements, every action located in the file.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "lang/ast.h"
#include "lang/diagnostic.h"
#include "lang/source.h"

namespace piper {

struct CsvAction {
  char type = 'F';  // F, B, I (input gradient), W (weight gradient)
  int64_t stage = 0, microbatch = 0;
  SourceLoc loc;
};

// One file: per line (pipeline rank), its steps in order, a step being one action or an overlapped
// F/B pair; and the same as one `sequence` block per line, for the checker to run.
struct CsvSchedule {
  std::vector<std::vector<std::vector<CsvAction>>> lines;
  std::vector<SourceLoc> line_locs;  // each whole line, for errors about what a line lacks
  ast::Block sequences;
};

// Reads the file's text (registered in the source manager); every malformed action is an error at
// its line and column, and nothing is returned when there was one. Empty cells (torch's idle steps)
// are skipped; communication actions (SEND_F, UNSHARD, ...) are refused: Piper places communication.
std::optional<CsvSchedule> read_torch_csv(FileId file, const SourceManager& sources, DiagnosticEngine& diags);

}  // namespace piper
