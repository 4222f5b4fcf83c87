#include "lang/diagnostic.h"

#include <fmt/format.h>

#include <ostream>

namespace piper {

Diagnostic& DiagnosticEngine::add(Severity s, SourceLoc loc, std::string message) {
  Diagnostic& d = diags_.emplace_back();
  d.severity = s;
  d.loc = loc;
  d.message = std::move(message);
  // Innermost use-site first, like clang's "in file included from".
  const std::vector<Note>* chain = &context_;
  if (auto it = file_chain_.find(loc.file); context_.empty() && it != file_chain_.end()) chain = &it->second;
  for (auto it = chain->rbegin(); it != chain->rend(); ++it) d.notes.push_back(*it);
  if (s == Severity::Error) ++errors_;
  return d;
}

Diagnostic& DiagnosticEngine::error(SourceLoc loc, std::string message) {
  return add(Severity::Error, loc, std::move(message));
}
Diagnostic& DiagnosticEngine::warning(SourceLoc loc, std::string message) {
  return add(Severity::Warning, loc, std::move(message));
}

std::string DiagnosticEngine::render_one(Severity s, SourceLoc loc, const std::string& message,
                                         bool color) const {
  const char* word = s == Severity::Error ? "error" : s == Severity::Warning ? "warning" : "note";
  const char* tint = s == Severity::Error ? "\033[1;31m" : s == Severity::Warning ? "\033[1;35m" : "\033[1;36m";
  std::string out;
  std::string where = loc.file < sources_.size() ? sources_.name(loc.file) + ": " : "";
  if (loc.valid() && !where.empty()) where.insert(where.size() - 2, fmt::format(":{}:{}", loc.line, loc.col));
  if (color)
    out += fmt::format("\033[1m{}{}{}:\033[0m\033[1m {}\033[0m\n", where, tint, word, message);
  else
    out += fmt::format("{}{}: {}\n", where, word, message);
  if (!loc.valid() || loc.file >= sources_.size()) return out;
  std::string_view line = sources_.line(loc.file, loc.line);
  if (line.empty()) return out;
  // Show a window of very long lines around the column, so a caret stays readable.
  constexpr uint32_t kWidth = 160;
  std::string clipped;
  if (line.size() > kWidth) {
    uint32_t start = loc.col > kWidth / 2 ? loc.col - kWidth / 2 : 1;
    clipped = (start > 1 ? "..." : "") + std::string(line.substr(start - 1, kWidth)) + "...";
    loc.col = loc.col - start + 1 + (start > 1 ? 3 : 0);
    line = clipped;
  }
  out += fmt::format("{}\n", line);
  // Keep tabs so the caret lines up under the same column in a terminal.
  std::string pad;
  for (uint32_t i = 1; i < loc.col && i - 1 < line.size(); ++i) pad += line[i - 1] == '\t' ? '\t' : ' ';
  uint32_t avail = loc.col - 1 < line.size() ? static_cast<uint32_t>(line.size()) - (loc.col - 1) : 1;
  uint32_t len = std::max<uint32_t>(1, std::min(loc.length, avail));
  std::string marks = "^" + std::string(len - 1, '~');
  out += color ? fmt::format("{}\033[1;32m{}\033[0m\n", pad, marks) : fmt::format("{}{}\n", pad, marks);
  return out;
}

std::string DiagnosticEngine::render(const Diagnostic& d, bool color) const {
  std::string out = render_one(d.severity, d.loc, d.message, color);
  for (const Note& n : d.notes) out += render_one(Severity::Note, n.loc, n.message, color);
  return out;
}

void DiagnosticEngine::print_all(std::ostream& os, bool color) const {
  for (const Diagnostic& d : diags_) os << render(d, color);
  if (errors_ > 0) os << fmt::format("{} error{} generated.\n", errors_, errors_ == 1 ? "" : "s");
}

}  // namespace piper
