#include "scheduler/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "lang/parser.h"
#include "lang/units.h"
#include "scheduler/emit.h"

namespace piper::sched {

namespace fs = std::filesystem;

namespace {
std::vector<std::string> search_path_of(const TuneOptions& o) {
  return o.search_path.empty() ? default_search_path() : o.search_path;
}

std::optional<fs::path> find_in(const std::string& name, const std::vector<std::string>& path) {
  for (const auto& dir : path)
    if (fs::exists(fs::path(dir) / name)) return fs::path(dir) / name;
  return std::nullopt;
}

void collect_params(const fs::path& file, const std::vector<std::string>& path, std::vector<std::string>& out,
                    int depth) {
  if (depth > 8) return;  // `use` cycles are the checker's error, not the search's
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  SourceManager sm;
  DiagnosticEngine diags(sm);
  auto ast = parse_strategy(sm.add(file.string(), text.str()), sm, diags);
  if (!ast) return;
  for (const auto& st : ast->stmts) {
    if (const auto* p = std::get_if<ast::ParamStmt>(&st->node)) {
      if (std::find(out.begin(), out.end(), p->name) == out.end()) out.push_back(p->name);
    } else if (const auto* u = std::get_if<ast::UseStmt>(&st->node)) {
      auto next = fs::exists(file.parent_path() / u->path) ? std::optional(file.parent_path() / u->path) : find_in(u->path, path);
      if (next) collect_params(*next, path, out, depth + 1);
    }
  }
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The values each library parameter takes in the search. The library shares these names (docs/
// language.md): mesh axes multiply to the world; microbatches and chunks from short ladders; the
// boolean knobs (even or balanced cuts, ZeRO-3 units by layer or by stage) both ways, and ZeRO-3's
// prefetch at 0 (least memory) and 1 (the gather hidden behind one unit's compute).
std::vector<int64_t> values_of(const std::string& name, int64_t np) {
  if (name == "pp" || name == "dp" || name == "ep") return divisors(np);
  if (name == "mb") return {1, 2, 4, 8, 16, 32};
  if (name == "v") return {2, 4};
  if (name == "ahead" || is_flag(name)) return {0, 1};
  return {};  // any other parameter keeps its default
}
bool is_axis(const std::string& n) { return n == "pp" || n == "dp" || n == "ep"; }
bool is_knob(const std::string& n) { return n == "ahead" || is_flag(n); }  // tunes a plan without reshaping it

int64_t value_of(const Candidate& c, const std::string& name, int64_t otherwise) {
  for (const auto& [n, v] : c.sets)
    if (n == name) return v;
  return otherwise;
}

// A knob that cannot change the plan is not varied, so the table holds no twins: how stages are cut
// needs more than one stage; ZeRO-3's units and prefetch need more than one replica.
bool varies_nothing(const Candidate& c) {
  for (const auto& [n, v] : c.sets) {
    if (v == 0) continue;
    if (n == "balance" && value_of(c, "pp", 1) == 1) return true;
    if ((n == "ahead" || n == "stage_unit") && value_of(c, "dp", 1) == 1) return true;
  }
  return false;
}
}  // namespace

bool is_flag(const std::string& name) { return name == "balance" || name == "stage_unit"; }

std::string param_text(const std::string& name, int64_t v) {
  return is_flag(name) ? (v ? "true" : "false") : std::to_string(v);
}

std::string Candidate::label() const {
  std::string s = strategy.substr(0, strategy.rfind(".piper"));
  // A flag shows by its name when set and not at all otherwise: "1f1b pp=3 mb=8 balance".
  for (const auto& [n, v] : sets)
    if (!is_flag(n)) s += fmt::format(" {}={}", n, v);
    else if (v) s += " " + n;
  return recompute ? s + " +recompute" : s;
}

std::vector<std::string> strategy_params(const std::string& path, const std::vector<std::string>& search_path) {
  std::vector<std::string> out;
  collect_params(path, search_path, out, 0);
  return out;
}

TuneResult tune(const Manifest& m, const TuneOptions& o) {
  const auto path = search_path_of(o);
  std::vector<std::string> library = o.library;
  if (library.empty()) {
    // The library folder: the last entry of the search path that holds single.piper.
    for (const auto& dir : path)
      if (fs::exists(fs::path(dir) / "single.piper")) {
        for (const auto& e : fs::directory_iterator(dir))
          if (e.path().extension() == ".piper") library.push_back(e.path().filename().string());
        break;
      }
    std::sort(library.begin(), library.end());
  }
  // Enumerate: per file, every combination of its parameters' values whose mesh axes multiply to np.
  std::vector<Candidate> all;
  for (const auto& file : library) {
    auto where = find_in(file, path);
    if (!where) continue;
    std::vector<std::string> params;
    for (const auto& n : strategy_params(where->string(), path))
      if (!values_of(n, o.np).empty()) params.push_back(n);
    std::vector<size_t> idx(params.size(), 0);
    while (true) {
      Candidate c;
      c.strategy = file;
      int64_t world = 1;
      for (size_t i = 0; i < params.size(); ++i) {
        const int64_t v = values_of(params[i], o.np)[idx[i]];
        c.sets.emplace_back(params[i], v);
        if (is_axis(params[i])) world *= v;
      }
      if (world == o.np && !varies_nothing(c)) {
        if (o.recompute) {
          Candidate rc = c;
          rc.recompute = true;
          all.push_back(std::move(c));
          all.push_back(std::move(rc));
        } else {
          all.push_back(std::move(c));
        }
      }
      size_t i = params.size();
      while (i-- > 0) {
        if (++idx[i] < values_of(params[i], o.np).size()) break;
        idx[i] = 0;
      }
      if (i == size_t(-1)) break;
    }
  }
  TuneResult r;
  for (size_t k = 0; k < all.size(); ++k) {
    Candidate& c = all[k];
    if (o.progress) o.progress(k, all.size());
    SourceManager sm;
    DiagnosticEngine diags(sm);
    PlanOptions po;
    po.cmd.np = o.np;
    po.cmd.batch_size = o.batch_size;
    po.cmd.search_path = path;
    for (const auto& [n, v] : c.sets) po.cmd.sets.push_back(fmt::format("{}={}", n, param_text(n, v)));
    po.machine_path = o.machine_path;
    po.cost_spec = o.cost_spec;
    po.memory_budget = o.memory_budget;
    const FileId id = sm.add(fmt::format("{}/tune.piper", path.front()),
                             fmt::format("use \"{}\";\n{}", c.strategy, c.recompute ? "recompute layers[*];\n" : ""));
    auto res = compile_plan(id, m, po, sm, diags);
    if (!res.plan) {
      c.rejected = diags.all().empty() ? res.io_error : diags.all().front().message;
      r.rejected.push_back(std::move(c));
      continue;
    }
    const Plan& p = *res.plan;
    r.unit_costs = p.costs.is_unit();
    c.step_time = p.schedule.step_time;
    const auto stats = rank_stats(p.dag, p.schedule);
    for (const auto& s : stats) c.bubble += s.bubble() / double(stats.size());
    for (const auto& u : p.memory) c.peak_bytes = std::max(c.peak_bytes, u.peak);
    r.ranked.push_back(std::move(c));
  }
  if (o.progress) o.progress(all.size(), all.size());
  // A knob that changed nothing — a balanced cut equal to the even one, prefetch with one unit — gives
  // the same plan under a longer name. Among candidates that differ only in knobs and simulate to the
  // same step and peak, keep the first enumerated (knobs lowest: the plain one).
  std::map<std::string, std::vector<size_t>> groups;  // label with knobs at 0 → candidates kept so far
  std::vector<Candidate> kept;
  for (auto& c : r.ranked) {
    Candidate base = c;
    for (auto& [n, v] : base.sets)
      if (is_knob(n)) v = 0;
    auto& group = groups[base.label()];
    if (std::any_of(group.begin(), group.end(), [&](size_t k) {
          return kept[k].step_time == c.step_time && kept[k].peak_bytes == c.peak_bytes;
        })) {
      ++r.twins;
      continue;
    }
    group.push_back(kept.size());
    kept.push_back(std::move(c));
  }
  r.ranked = std::move(kept);
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    if (a.step_time != b.step_time) return a.step_time < b.step_time;
    if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
    return a.label() < b.label();
  });
  return r;
}

std::string candidate_text(const Candidate& c, const std::string& model, const TuneOptions& o) {
  std::string s = fmt::format("# {}: the fastest plan piper-tune found for {} on {} ranks{}{}.\n", c.label(), model, o.np,
                              o.batch_size ? fmt::format(", batch {}", *o.batch_size) : "",
                              o.memory_budget ? fmt::format(", within {} per device", human_bytes(*o.memory_budget)) : "");
  s += fmt::format("# Predicted step {:.6g} ({}), bubble {:.1f}%, peak {} on the fullest rank.\n", c.step_time,
                   o.machine_path.empty() ? "unit costs" : o.machine_path, 100 * c.bubble, human_bytes(double(c.peak_bytes)));
  for (const auto& [n, v] : c.sets) s += fmt::format("param {} = {};\n", n, param_text(n, v));
  s += fmt::format("use \"{}\";\n", c.strategy);
  if (c.recompute) s += "recompute layers[*];  # activations recomputed in the backward: less memory, more time\n";
  return s;
}

}  // namespace piper::sched
