// Diagnostics: located, clang-style user errors with notes, collected so one run reports them all.
#pragma once
#include <deque>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "lang/source.h"

namespace piper {

enum class Severity { Error, Warning, Note };

struct Note {
  SourceLoc loc;
  std::string message;
};

struct Diagnostic {
  Severity severity = Severity::Error;
  SourceLoc loc;
  std::string message;
  std::vector<Note> notes;

  Diagnostic& note(SourceLoc at, std::string msg) {
    notes.push_back({at, std::move(msg)});
    return *this;
  }
};

class DiagnosticEngine {
 public:
  explicit DiagnosticEngine(const SourceManager& sources) : sources_(sources) {}

  // The returned reference stays valid (deque), so callers can chain .note(...).
  Diagnostic& error(SourceLoc loc, std::string message);
  Diagnostic& warning(SourceLoc loc, std::string message);

  // Notes appended to every diagnostic reported while a context is active (e.g. "used from here").
  void push_context(SourceLoc loc, std::string message) { context_.push_back({loc, std::move(message)}); }
  void pop_context() { context_.pop_back(); }
  const std::vector<Note>& context() const { return context_; }
  // The use chain that reached `file` (the active context, recorded the first time the file is
  // entered): errors found in the file later — whole-strategy checks, once the `use` has
  // returned — still get its "used here" notes.
  void enter_file(FileId file) { file_chain_.try_emplace(file, context_); }

  size_t error_count() const { return errors_; }
  bool has_errors() const { return errors_ > 0; }
  const std::deque<Diagnostic>& all() const { return diags_; }

  // `file:line:col: error: message`, the source line, a caret; then the notes alike.
  std::string render(const Diagnostic& d, bool color = false) const;
  void print_all(std::ostream& os, bool color = false) const;
  const SourceManager& sources() const { return sources_; }

 private:
  Diagnostic& add(Severity s, SourceLoc loc, std::string message);
  std::string render_one(Severity s, SourceLoc loc, const std::string& message, bool color) const;

  const SourceManager& sources_;
  std::deque<Diagnostic> diags_;
  std::vector<Note> context_;
  std::map<FileId, std::vector<Note>> file_chain_;
  size_t errors_ = 0;
};

}  // namespace piper
