#include "scheduler/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "lang/domain.h"
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

// Walks a strategy file and the files it uses: each parameter once (first declaration), and which
// ones size a mesh axis (`mesh pp = pp;`): those multiply to the world.
void collect_params(const fs::path& file, const std::vector<std::string>& path, int64_t np, std::vector<SearchParam>& out,
                    std::vector<std::string>& axes, int depth) {
  if (depth > 8) return;  // `use` cycles are the checker's error, not the search's
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  SourceManager sm;
  DiagnosticEngine diags(sm);
  auto ast = parse_strategy(sm.add(file.string(), text.str()), sm, diags);
  if (!ast) return;
  std::function<void(const ast::Block&)> walk = [&](const ast::Block& block) {
    for (const auto& st : block) {
      if (const auto* p = std::get_if<ast::ParamStmt>(&st->node)) {
        if (std::any_of(out.begin(), out.end(), [&](const SearchParam& q) { return q.name == p->name; })) continue;
        SearchParam sp{p->name, {}, p->value->kind == ast::Expr::Kind::Bool, false};
        if (!p->domain.empty()) {
          const DomainValues d = eval_domain(p->domain, np);
          if (d.error.empty()) sp.values = d.values;  // a bad domain is the checker's error: nothing searched
        }
        out.push_back(std::move(sp));
      } else if (const auto* m = std::get_if<ast::MeshStmt>(&st->node)) {
        for (const auto& a : m->axes)
          if (a.value->kind == ast::Expr::Kind::Name) axes.push_back(a.value->name);
      } else if (const auto* i = std::get_if<ast::IfStmt>(&st->node)) {
        walk(i->then_block);
        walk(i->else_block);
      } else if (const auto* u = std::get_if<ast::UseStmt>(&st->node)) {
        auto next = fs::exists(file.parent_path() / u->path) ? std::optional(file.parent_path() / u->path) : find_in(u->path, path);
        if (next) collect_params(*next, path, np, out, axes, depth + 1);
      }
    }
  };
  walk(ast->stmts);
}

// Every combination of the file's searched parameters whose mesh-sizing ones multiply to np.
void enumerate(const std::string& file, const std::vector<SearchParam>& all_params, const TuneOptions& o,
               std::vector<Candidate>& out) {
  std::vector<SearchParam> params;
  for (const auto& p : all_params)
    if (!p.values.empty()) params.push_back(p);
  std::vector<size_t> idx(params.size(), 0);
  while (true) {
    Candidate c;
    c.strategy = file;
    int64_t world = 1;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t v = params[i].values[idx[i]];
      c.sets.push_back(Setting{params[i].name, v, params[i].boolean, params[i].values.front()});
      if (params[i].sizes_mesh) world *= v;
    }
    if (world == o.np) {
      if (o.recompute) {
        Candidate rc = c;
        rc.recompute = true;
        out.push_back(std::move(c));
        out.push_back(std::move(rc));
      } else {
        out.push_back(std::move(c));
      }
    }
    size_t i = params.size();
    while (i-- > 0) {
      if (++idx[i] < params[i].values.size()) break;
      idx[i] = 0;
    }
    if (i == size_t(-1)) break;
  }
}
}  // namespace

std::string Setting::text() const { return boolean ? (value ? "true" : "false") : std::to_string(value); }

std::string Candidate::label() const {
  std::string s = strategy.substr(0, strategy.rfind(".piper"));
  // A flag shows by its name when set and not at all otherwise: "1f1b pp=3 mb=8 balance".
  for (const auto& p : sets)
    if (!p.boolean) s += fmt::format(" {}={}", p.name, p.value);
    else if (p.value) s += " " + p.name;
  return recompute ? s + " +recompute" : s;
}

std::vector<SearchParam> strategy_params(const std::string& path, const std::vector<std::string>& search_path, int64_t np) {
  std::vector<SearchParam> out;
  std::vector<std::string> axes;
  collect_params(path, search_path, np, out, axes, 0);
  for (auto& p : out) p.sizes_mesh = std::find(axes.begin(), axes.end(), p.name) != axes.end();
  return out;
}

namespace {
// The library folder's files: the last entry of the search path that holds single.piper.
std::vector<std::string> library_files(const TuneOptions& o, const std::vector<std::string>& path) {
  std::vector<std::string> library = o.library;
  if (!library.empty()) return library;
  for (const auto& dir : path)
    if (fs::exists(fs::path(dir) / "single.piper")) {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".piper") library.push_back(e.path().filename().string());
      break;
    }
  std::sort(library.begin(), library.end());
  return library;
}

// Compiles one candidate as `use "FILE";` with its settings would (the first error in `rejected`).
std::optional<Plan> compile_candidate(const Candidate& c, const Manifest& m, const TuneOptions& o,
                                      const std::vector<std::string>& path, std::string* rejected) {
  SourceManager sm;
  DiagnosticEngine diags(sm);
  PlanOptions po;
  po.cmd.np = o.np;
  po.cmd.batch_size = o.batch_size;
  po.cmd.search_path = path;
  for (const auto& p : c.sets) po.cmd.sets.push_back(fmt::format("{}={}", p.name, p.text()));
  po.machine_path = o.machine_path;
  po.cost_spec = o.cost_spec;
  po.memory_budget = o.memory_budget;
  const FileId id = sm.add(fmt::format("{}/tune.piper", path.front()),
                           fmt::format("use \"{}\";\n{}", c.strategy, c.recompute ? "recompute layers[*];\n" : ""));
  auto res = compile_plan(id, m, po, sm, diags);
  if (!res.plan) *rejected = diags.all().empty() ? res.io_error : diags.all().front().message;
  return std::move(res.plan);
}

// Compiles and simulates one candidate: its step, bubble and peak, or why it is no plan.
void evaluate(Candidate& c, const Manifest& m, const TuneOptions& o, const std::vector<std::string>& path, bool& unit_costs) {
  const std::optional<Plan> plan = compile_candidate(c, m, o, path, &c.rejected);
  if (!plan) return;
  const Plan& p = *plan;
  unit_costs = p.costs.is_unit();
  c.step_time = p.schedule.step_time;
  c.plan_hash = p.hash;
  const auto stats = rank_stats(p.dag, p.schedule);
  for (const auto& s : stats) c.bubble += s.bubble() / double(stats.size());
  for (const auto& u : p.memory) c.peak_bytes = std::max(c.peak_bytes, u.peak);
  if (o.batch_size) {
    double forward = 0;  // per sample
    for (RegionId r : m.sequence) forward += static_cast<double>(m.flops(r));
    c.model_flops = 3 * forward * static_cast<double>(*o.batch_size);
  }
  // Only where the roofline priced the chunks: a region without `work` runs at the file's one
  // sustained rate whatever the precision, and a fraction of a peak it never used means nothing.
  if (const auto& mc = p.costs.machine_desc(); mc && mc->roofline && p.costs.roofline())
    c.peak_flops = p.dag.stage(0).precision == DType::BF16 ? mc->roofline->peak_bf16 : mc->roofline->peak_fp32;
}

// A parameter that changed nothing (a balanced cut equal to the even one, prefetch with one unit)
// gives the same plan under a longer name: among candidates of one file that compile to the same
// plan and simulate to the same step and peak, the first enumerated is kept (a domain lists its
// plainest value first).
size_t drop_twins(std::vector<Candidate>& ranked) {
  std::map<std::pair<std::string, uint64_t>, std::vector<size_t>> groups;  // (file, plan hash) -> kept
  std::vector<Candidate> kept;
  size_t twins = 0;
  for (auto& c : ranked) {
    auto& group = groups[{c.strategy + (c.recompute ? "+r" : ""), c.plan_hash}];
    if (std::any_of(group.begin(), group.end(), [&](size_t k) {
          return kept[k].step_time == c.step_time && kept[k].peak_bytes == c.peak_bytes;
        })) {
      ++twins;
      continue;
    }
    group.push_back(kept.size());
    kept.push_back(std::move(c));
  }
  ranked = std::move(kept);
  return twins;
}

// A rejected candidate is a twin when one of its flags (a boolean: a variant of a plan, not another
// plan), set back to its plainest value, gives a candidate rejected for the same reason: `balance` on
// a batch that does not split, say. Other parameters make other plans (mb=2 and mb=1 may both fail
// to cut the model evenly: both are listed).
size_t drop_rejected_twins(std::vector<Candidate>& rejected) {
  std::map<std::string, const Candidate*> by_label;
  for (const auto& c : rejected) by_label[c.label()] = &c;
  std::vector<bool> twin(rejected.size(), false);
  for (size_t k = 0; k < rejected.size(); ++k) {
    const Candidate& c = rejected[k];
    for (size_t i = 0; i < c.sets.size() && !twin[k]; ++i) {
      if (!c.sets[i].boolean || c.sets[i].value == c.sets[i].plain) continue;
      Candidate plainer = c;
      plainer.sets[i].value = c.sets[i].plain;
      auto it = by_label.find(plainer.label());
      twin[k] = it != by_label.end() && it->second->rejected == c.rejected;
    }
  }
  std::vector<Candidate> kept;
  for (size_t k = 0; k < rejected.size(); ++k)
    if (!twin[k]) kept.push_back(std::move(rejected[k]));
  const size_t twins = rejected.size() - kept.size();
  rejected = std::move(kept);
  return twins;
}
}  // namespace

TuneResult tune(const Manifest& m, const TuneOptions& o) {
  const auto path = search_path_of(o);
  std::vector<Candidate> all;
  for (const auto& file : library_files(o, path))
    if (auto where = find_in(file, path)) enumerate(file, strategy_params(where->string(), path, o.np), o, all);
  TuneResult r;
  for (size_t k = 0; k < all.size(); ++k) {
    if (o.progress) o.progress(k, all.size());
    evaluate(all[k], m, o, path, r.unit_costs);
    (all[k].rejected.empty() ? r.ranked : r.rejected).push_back(std::move(all[k]));
  }
  if (o.progress) o.progress(all.size(), all.size());
  r.twins = drop_twins(r.ranked) + drop_rejected_twins(r.rejected);
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    if (a.step_time != b.step_time) return a.step_time < b.step_time;
    if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
    return a.label() < b.label();
  });
  return r;
}

std::optional<Plan> candidate_plan(const Candidate& c, const Manifest& m, const TuneOptions& o, std::string* errors) {
  return compile_candidate(c, m, o, search_path_of(o), errors);
}

std::string candidate_text(const Candidate& c, const std::string& model, const TuneOptions& o) {
  std::string s = fmt::format("# {}: the fastest plan piper-tune found for {} on {} ranks{}{}.\n", c.label(), model, o.np,
                              o.batch_size ? fmt::format(", batch {}", *o.batch_size) : "",
                              o.memory_budget ? fmt::format(", within {} per device", human_bytes(*o.memory_budget)) : "");
  s += fmt::format("# Predicted step {:.6g} ({}), bubble {:.1f}%, peak {} on the fullest rank.\n", c.step_time,
                   o.machine_path.empty() ? "unit costs" : o.machine_path, 100 * c.bubble, human_bytes(double(c.peak_bytes)));
  for (const auto& p : c.sets) s += fmt::format("param {} = {};\n", p.name, p.text());
  s += fmt::format("use \"{}\";\n", c.strategy);
  if (c.recompute) s += "recompute layers[*];  # activations recomputed in the backward: less memory, more time\n";
  return s;
}

}  // namespace piper::sched
