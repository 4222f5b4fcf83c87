#include "lang/diagnostic_verifier.h"

#include <fmt/format.h>

#include <regex>

namespace piper {

namespace {
struct Expectation {
  Severity severity;
  FileId file;
  uint32_t line;  // 0: any line
  bool cmdline = false, anywhere = false;
  std::string text;
  SourceLoc where;  // the comment itself, for messages
  bool matched = false;
};

const char* word(Severity s) { return s == Severity::Error ? "error" : s == Severity::Warning ? "warning" : "note"; }
}  // namespace

std::vector<std::string> verify_diagnostics(const DiagnosticEngine& diags) {
  const SourceManager& sm = diags.sources();
  std::vector<Expectation> expects;
  static const std::regex kRe(R"(expected-(error|warning|note)(@([+-]?\d+|cmdline|\*))?\s*\{\{(.*?)\}\})");
  for (FileId f = 0; f < sm.size(); ++f) {
    const std::string& text = sm.text(f);
    if (text.find("expected-") == std::string::npos) continue;
    uint32_t line_no = 0;
    size_t start = 0;
    while (start <= text.size()) {
      ++line_no;
      size_t end = text.find('\n', start);
      std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
      size_t hash = line.find('#');
      if (hash != std::string::npos) {
        std::string comment = line.substr(hash);
        for (auto it = std::sregex_iterator(comment.begin(), comment.end(), kRe); it != std::sregex_iterator(); ++it) {
          const std::smatch& m = *it;
          Expectation e;
          e.severity = m[1] == "error" ? Severity::Error : m[1] == "warning" ? Severity::Warning : Severity::Note;
          e.file = f;
          e.line = line_no;
          std::string at = m[3];
          if (at == "cmdline") e.cmdline = true;
          else if (at == "*") e.anywhere = true;
          else if (!at.empty()) e.line = static_cast<uint32_t>(static_cast<int64_t>(line_no) + std::stoll(at));
          e.text = m[4];
          e.where = SourceLoc{f, line_no, static_cast<uint32_t>(hash + 1), 1};
          expects.push_back(std::move(e));
        }
      }
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }

  auto matches = [&](Expectation& e, Severity s, SourceLoc loc, const std::string& msg) {
    if (e.matched || e.severity != s || msg.find(e.text) == std::string::npos) return false;
    if (e.anywhere) return true;
    if (e.cmdline) return loc.valid() && sm.name(loc.file) == "<command line>";
    return loc.file == e.file && loc.line == e.line;
  };

  std::vector<std::string> problems;
  for (const Diagnostic& d : diags.all()) {
    bool found = false;
    for (auto& e : expects)
      if (matches(e, d.severity, d.loc, d.message)) {
        e.matched = found = true;
        break;
      }
    if (!found && d.severity != Severity::Note)
      problems.push_back("unexpected " + diags.render(d));
    for (const Note& n : d.notes)
      for (auto& e : expects)
        if (matches(e, Severity::Note, n.loc, n.message)) {
          e.matched = true;
          break;
        }
  }
  for (const auto& e : expects)
    if (!e.matched)
      problems.push_back(fmt::format("{}:{}: expected {} \"{}\" was not produced", sm.name(e.file), e.where.line,
                                     word(e.severity), e.text));
  return problems;
}

}  // namespace piper
