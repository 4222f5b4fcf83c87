#include "lang/torch_csv.h"

#include <fmt/format.h>

#include <charconv>
#include <regex>

namespace piper {

namespace {

const char* task_name(char type) {
  switch (type) {
    case 'F': return "fwd";
    case 'B': return "bwd";
    case 'I': return "bwd_input";
    default: return "bwd_weight";
  }
}

ast::ExprPtr literal(int64_t v, SourceLoc loc) {
  auto e = std::make_unique<ast::Expr>();
  e->kind = ast::Expr::Kind::Int;
  e->int_value = v;
  e->loc = loc;
  return e;
}

// `{stage}{F|B|I|W}{microbatch}` at `loc`; an error (and nothing) otherwise.
std::optional<CsvAction> action(std::string_view text, SourceLoc loc, DiagnosticEngine& diags) {
  static const std::regex kAction(R"((\d+)([A-Z_]+)(\d*))");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_match(text.begin(), text.end(), m, kAction)) {
    diags.error(loc, fmt::format("'{}' is not a schedule action", text))
        .note(SourceLoc{}, "actions are {stage}{F|B|I|W}{microbatch}, e.g. 0F1 or 2I0, and (0F3;3B1)OVERLAP_F_B");
    return std::nullopt;
  }
  const std::string type = m[2].str();
  if (type.size() != 1 || std::string_view("FBIW").find(type[0]) == std::string_view::npos) {
    const bool comm = type == "SEND_F" || type == "RECV_F" || type == "SEND_B" || type == "RECV_B" || type == "UNSHARD" ||
                      type == "RESHARD" || type == "REDUCE_GRAD";
    auto& d = diags.error(loc, comm ? fmt::format("'{}' is a communication action: Piper places communication itself", text)
                                    : fmt::format("unknown action type '{}' in '{}'", type, text));
    d.note(SourceLoc{}, comm ? "give the compute-only schedule (F, B, I, W and OVERLAP_F_B), as torch writes it before "
                               "adding communication"
                             : "action types are F (forward), B (backward), I (input gradient), W (weight gradient)");
    return std::nullopt;
  }
  if (m[3].length() == 0) {
    diags.error(loc, fmt::format("'{}' names no microbatch", text));
    return std::nullopt;
  }
  CsvAction a{type[0], 0, 0, loc};
  auto num = [](const auto& sub, int64_t& out) {
    const std::string s = sub.str();
    return std::from_chars(s.data(), s.data() + s.size(), out).ec == std::errc{};
  };
  if (!num(m[1], a.stage) || !num(m[3], a.microbatch)) {
    diags.error(loc, fmt::format("'{}': a number out of range", text));
    return std::nullopt;
  }
  return a;
}

// One cell: an action, or `(a;b)OVERLAP_F_B` (a forward and a backward run together).
std::optional<std::vector<CsvAction>> step(std::string_view cell, SourceLoc loc, DiagnosticEngine& diags) {
  constexpr std::string_view kOverlap = ")OVERLAP_F_B";
  if (cell.empty() || cell.front() != '(') {
    auto a = action(cell, loc, diags);
    if (!a) return std::nullopt;
    return std::vector<CsvAction>{*a};
  }
  if (!cell.ends_with(kOverlap) || cell.find(';') == std::string_view::npos) {
    diags.error(loc, fmt::format("'{}' is not an overlapped pair", cell)).note(SourceLoc{}, "write (0F3;3B1)OVERLAP_F_B");
    return std::nullopt;
  }
  const std::string_view inner = cell.substr(1, cell.size() - 1 - kOverlap.size());
  const size_t semi = inner.find(';');
  std::vector<CsvAction> pair;
  for (auto [part, offset] : {std::pair{inner.substr(0, semi), size_t{1}}, std::pair{inner.substr(semi + 1), semi + 2}}) {
    SourceLoc at{loc.file, loc.line, loc.col + static_cast<uint32_t>(offset), static_cast<uint32_t>(std::max<size_t>(part.size(), 1))};
    auto a = action(part, at, diags);
    if (!a) return std::nullopt;
    pair.push_back(*a);
  }
  const int forwards = (pair[0].type == 'F') + (pair[1].type == 'F');
  if (forwards != 1 || pair[0].type == 'W' || pair[1].type == 'W') {
    diags.error(loc, fmt::format("'{}' overlaps {} and {}: OVERLAP_F_B pairs a forward with a backward", cell,
                                 std::string(1, pair[0].type), std::string(1, pair[1].type)));
    return std::nullopt;
  }
  return pair;
}

// The line's steps as `sequence { order A; order B || C; ... }`.
ast::StmtPtr sequence(const std::vector<std::vector<CsvAction>>& steps, SourceLoc line) {
  ast::SequenceStmt seq;
  for (const auto& s : steps) {
    ast::OrderStmt o;
    ast::TaskGroup group;
    for (const CsvAction& a : s) {
      ast::Task t{task_name(a.type), {}, a.loc};
      t.args.push_back(literal(a.stage, a.loc));
      t.args.push_back(literal(a.microbatch, a.loc));
      group.push_back(std::move(t));
    }
    o.chain.push_back(std::move(group));
    seq.body.push_back(std::make_unique<ast::Stmt>(ast::Stmt{s.front().loc, std::move(o)}));
  }
  return std::make_unique<ast::Stmt>(ast::Stmt{line, std::move(seq)});
}

}  // namespace

std::optional<CsvSchedule> read_torch_csv(FileId file, const SourceManager& sources, DiagnosticEngine& diags) {
  const std::string& text = sources.text(file);
  CsvSchedule out;
  const size_t errors = diags.error_count();
  uint32_t line_no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    if (line.ends_with('\r')) line.remove_suffix(1);  // csv.writer ends rows with \r\n
    ++line_no;
    out.line_locs.push_back(SourceLoc{file, line_no, 1, static_cast<uint32_t>(std::max<size_t>(line.size(), 1))});
    std::vector<std::vector<CsvAction>> steps;
    for (size_t c = 0; c <= line.size();) {
      size_t comma = line.find(',', c);
      if (comma == std::string_view::npos) comma = line.size();
      std::string_view cell = line.substr(c, comma - c);
      uint32_t col = static_cast<uint32_t>(c + 1);
      while (!cell.empty() && cell.front() == ' ') cell.remove_prefix(1), ++col;
      while (!cell.empty() && cell.back() == ' ') cell.remove_suffix(1);
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = cell.substr(1, cell.size() - 2), ++col;
      if (!cell.empty())
        if (auto s = step(cell, SourceLoc{file, line_no, col, static_cast<uint32_t>(cell.size())}, diags)) steps.push_back(std::move(*s));
      c = comma + 1;
    }
    out.lines.push_back(std::move(steps));
    begin = end + 1;
  }
  if (diags.error_count() > errors) return std::nullopt;
  for (size_t r = 0; r < out.lines.size(); ++r)
    if (!out.lines[r].empty()) out.sequences.push_back(sequence(out.lines[r], out.line_locs[r]));
  return out;
}

}  // namespace piper
