// The checker's entry point: run a strategy file and then the whole-strategy checks.
#include "lang/checker_impl.h"
#include "lang/parser.h"

namespace piper::check {

std::optional<CheckedStrategy> Checker::run(FileId top) {
  top_ = top;
  size_t errors_before = diags_.error_count();
  if (auto file = parse_strategy(top, sources_, diags_)) {
    stack_.push_back(fs::weakly_canonical(sources_.name(top)).string());
    UseContext none;
    run_file(*file, none);
    stack_.pop_back();
    owned_.push_back(std::move(file));
  }
  if (diags_.error_count() > errors_before) return std::nullopt;
  finish();
  if (diags_.error_count() > errors_before) return std::nullopt;
  return std::move(out_);
}

}  // namespace piper::check

namespace piper {

std::optional<CheckedStrategy> check_strategy(FileId file, const Manifest& manifest, const CheckOptions& options,
                                              SourceManager& sources, DiagnosticEngine& diags) {
  return check::Checker(manifest, options, sources, diags).run(file);
}

}  // namespace piper
