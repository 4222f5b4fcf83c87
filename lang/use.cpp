// `use "file.piper" (args)`: finding a strategy file on the search path, loading it once, running it.
#include <fstream>
#include <sstream>
#include <utility>

#include "lang/checker_impl.h"
#include "lang/parser.h"

namespace piper::check {

std::optional<std::string> Checker::find_strategy(const std::string& path, FileId from, SourceLoc loc, const char* what) {
  std::vector<fs::path> dirs{fs::path(sources_.name(from)).parent_path()};
  for (const auto& d : opt_.search_path) dirs.emplace_back(d);
  std::vector<std::string> tried;
  for (const auto& d : dirs) {
    fs::path p = fs::path(path).is_absolute() ? fs::path(path) : d / path;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
    tried.push_back(p.parent_path().string());
    if (fs::path(path).is_absolute()) break;
  }
  diags_.error(loc, fmt::format("cannot find {} \"{}\"", what, path))
      .note(SourceLoc{}, fmt::format("looked in: {}", fmt::join(tried, ", ")));
  return std::nullopt;
}

void Checker::stmt(const ast::UseStmt& u, const ast::Stmt& s, Env& env, UseContext& outer, FileId file) {
  auto path = find_strategy(u.path, file, u.path_loc);
  if (!path) return;
  std::string canon = fs::weakly_canonical(*path).string();
  if (auto it = std::find(stack_.begin(), stack_.end(), canon); it != stack_.end()) {
    std::vector<std::string> names;
    for (auto i = it; i != stack_.end(); ++i) names.push_back(fs::path(*i).filename().string());
    names.push_back(fs::path(canon).filename().string());
    diags_.error(u.path_loc, fmt::format("use cycle: {}", fmt::join(names, " uses ")));
    return;
  }
  if (stack_.size() >= 32) {
    diags_.error(u.path_loc, "strategies are used more than 32 levels deep");
    return;
  }
  UseContext inner;
  for (const auto& a : u.args) {
    auto v = eval(*a.value, env);
    if (!v) return;
    if (inner.args.count(a.name)) {
      diags_.error(a.loc, fmt::format("argument '{}' is given twice", a.name));
      return;
    }
    inner.args[a.name] = {*v, a.loc};
  }
  // What this file sees, and what it inherited itself: a composition (1f1b_zero3.piper uses
  // 1f1b.piper and zero3.piper, declaring nothing) passes the user's `pp`, `mb`, `dp` through.
  inner.inherited = outer.inherited;
  for (auto& [n, v] : env.flatten()) inner.inherited[n] = std::move(v);
  const ast::File* used = load(canon);
  if (!used) return;
  stack_.push_back(canon);
  diags_.push_context(s.loc, fmt::format("in strategy \"{}\" used here", u.path));
  diags_.enter_file(used->id);
  auto outer_sequences = std::exchange(sequences_, {});  // a used file's orders are its own
  run_file(*used, inner);
  sequences_ = std::move(outer_sequences);
  diags_.pop_context();
  stack_.pop_back();
  for (const auto& [name, arg] : inner.args) {
    if (inner.consumed.count(name)) continue;
    diags_.error(arg.second, fmt::format("\"{}\" has no parameter '{}'", u.path, name));
  }
}

const ast::File* Checker::load(const std::string& canon) {
  if (auto it = parsed_.find(canon); it != parsed_.end()) return it->second;
  std::error_code ec;
  if (auto size = fs::file_size(canon, ec); ec || size > kCanonicalLimits.max_bytes) {  // the parser applies the limit the text's kind has
    diags_.error(SourceLoc{}, ec ? fmt::format("cannot read strategy {}: {}", canon, ec.message())
                                 : fmt::format("{} is {} bytes, too large for a strategy", canon, size));
    parsed_[canon] = nullptr;
    return nullptr;
  }
  std::ifstream in(canon, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  FileId id = sources_.add(canon, text.str());
  auto file = parse_strategy(id, sources_, diags_);
  const ast::File* raw = file.get();
  parsed_[canon] = raw;
  if (file) owned_.push_back(std::move(file));
  return raw;
}

}  // namespace piper::check
