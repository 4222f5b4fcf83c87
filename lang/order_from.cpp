// `order from "schedule.csv";`: a torch.distributed.pipelining schedule file as the plan's order.
// Each line is a pipeline rank's program: its actions run as one `sequence` (so the rank runs them in
// the file's order), and once stages are placed each line must hold exactly its own rank's tasks.
#include <fstream>
#include <sstream>

#include "lang/checker_impl.h"

namespace piper::check {

// `{name}` in the path is the integer `name` has here (a parameter, let or loop variable), so one
// strategy names a family of generated files, one per configuration (strategies/vhalf.piper).
std::optional<std::string> Checker::schedule_path(const ast::OrderFromStmt& o, const Env& env) {
  std::string out;
  for (size_t i = 0; i < o.path.size(); ++i) {
    if (o.path[i] != '{') {
      out += o.path[i];
      continue;
    }
    const size_t close = o.path.find('}', i);
    if (close == std::string::npos) {
      diags_.error(o.path_loc, fmt::format("'{{' in the schedule's path \"{}\" has no closing '}}'", o.path));
      return std::nullopt;
    }
    const std::string name = o.path.substr(i + 1, close - i - 1);
    const Var* v = env.find(name);
    if (!v || v->value.type != Value::Type::Int) {
      auto& d = diags_.error(o.path_loc, v ? fmt::format("'{{{}}}' in the schedule's path is {}, not an integer", name,
                                                         type_name(v->value.type))
                                           : fmt::format("'{{{}}}' in the schedule's path names nothing defined here", name));
      d.note(SourceLoc{}, "a path takes '{name}' for a parameter, let or loop variable with an integer value");
      return std::nullopt;
    }
    out += std::to_string(v->value.i);
    i = close;
  }
  return out;
}

void Checker::stmt(const ast::OrderFromStmt& o, const ast::Stmt& s, Env& env, UseContext& use, FileId file) {
  const auto named = schedule_path(o, env);
  if (!named) return;
  auto path = find_strategy(*named, file, o.path_loc, "schedule");
  if (!path) return;
  std::error_code ec;
  constexpr uintmax_t kMaxBytes = 16 << 20;  // thousands of microbatches × stages fit in far less
  if (auto size = fs::file_size(*path, ec); ec || size > kMaxBytes) {
    diags_.error(o.path_loc, ec ? fmt::format("cannot read schedule {}: {}", *path, ec.message())
                                : fmt::format("{} is {} bytes, too large for a schedule", *path, size));
    return;
  }
  std::ifstream in(*path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const FileId id = sources_.add(*path, text.str());
  auto csv = read_torch_csv(id, sources_, diags_);
  if (!csv) return;
  schedules_.push_back(std::make_unique<CsvSchedule>(std::move(*csv)));
  diags_.push_context(s.loc, fmt::format("in schedule \"{}\" read here", *named));
  for (const ast::StmtPtr& line : schedules_.back()->sequences)
    stmt(std::get<ast::SequenceStmt>(line->node), *line, env, use, file);
  diags_.pop_context();
}

void Checker::finish_schedule_files() {
  int64_t ranks = 0;
  for (const Stage& st : out_.stages) ranks = std::max(ranks, st.coord + 1);
  for (const auto& c : schedules_) {
    if (static_cast<int64_t>(c->lines.size()) != ranks) {
      const SourceLoc at = c->line_locs.empty() ? SourceLoc{} : c->line_locs.front();
      diags_.error(at, fmt::format("the schedule has {} line{}, one per pipeline rank, but the plan has {} pipeline rank{}",
                                   c->lines.size(), c->lines.size() == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s"));
      continue;
    }
    for (size_t r = 0; r < c->lines.size(); ++r) check_schedule_line(*c, r);
  }
}

// Line r holds only stages placed on pipeline rank r, each task once, and every task of them: a
// forward per microbatch, and a backward, whole (B) or as both halves (I and W).
void Checker::check_schedule_line(const CsvSchedule& c, size_t r) {
  std::map<std::tuple<char, int64_t, int64_t>, SourceLoc> seen;
  for (const auto& step : c.lines[r])
    for (const CsvAction& a : step) {
      const int64_t coord = out_.task_coord(a.stage, a.microbatch);  // in range: expansion checked it
      if (coord != static_cast<int64_t>(r)) {
        diags_.error(a.loc, fmt::format("stage {} runs on pipeline rank {}, but this is line {}, rank {}'s", a.stage, coord,
                                        r + 1, r));
        return;
      }
      auto [it, fresh] = seen.emplace(std::make_tuple(a.type, a.stage, a.microbatch), a.loc);
      if (!fresh) {
        diags_.error(a.loc, fmt::format("{}{}{} appears twice", a.stage, a.type, a.microbatch)).note(it->second, "first here");
        return;
      }
    }
  for (size_t s = 0; s < out_.stages.size(); ++s) {
    for (int64_t mb = 0; mb < out_.microbatches; ++mb) {
      if (out_.task_coord(static_cast<int64_t>(s), mb) != static_cast<int64_t>(r)) continue;
      auto has = [&](char t) { return seen.count(std::make_tuple(t, static_cast<int64_t>(s), mb)) > 0; };
      std::string missing;
      if (!has('F')) missing = "forward";
      else if (!has('B') && !has('I') && !has('W')) missing = "backward";
      else if (!has('B') && has('I') != has('W')) missing = has('I') ? "weight gradient (W)" : "input gradient (I)";
      if (missing.empty()) continue;
      diags_.error(c.line_locs[r], fmt::format("line {} (pipeline rank {}) has no {} of stage {} for microbatch {}", r + 1, r,
                                               missing, s, mb))
          .note(SourceLoc{}, "a schedule runs every task of the rank's stages: F, and B or both I and W, per microbatch");
      return;
    }
  }
}

}  // namespace piper::check
