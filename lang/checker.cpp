#include "lang/checker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "lang/internal_error.h"
#include "lang/parser.h"
#include "lang/suggest.h"

namespace piper {
namespace {

namespace fs = std::filesystem;

struct Value {
  enum class Type { Int, Bool };
  Type type = Type::Int;
  int64_t i = 0;
  bool b = false;
  static Value of(int64_t v) { return Value{Type::Int, v, false}; }
  static Value of_bool(bool v) { return Value{Type::Bool, 0, v}; }
  std::string text() const { return type == Type::Int ? std::to_string(i) : (b ? "true" : "false"); }
};

const char* type_name(Value::Type t) { return t == Value::Type::Int ? "an integer" : "a boolean"; }

struct Var {
  Value value;
  SourceLoc decl;
  const char* what;  // "parameter", "let binding", "loop variable"
};

// Lexical scopes of one file; a used file gets a fresh Env of its own.
struct Env {
  std::vector<std::map<std::string, Var>> frames{1};
  const Var* find(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it)
      if (auto v = it->find(name); v != it->end()) return &v->second;
    return nullptr;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& f : frames)
      for (const auto& [n, _] : f) out.push_back(n);
    return out;
  }
  std::map<std::string, Var> flatten() const {
    std::map<std::string, Var> out;
    for (const auto& f : frames)
      for (const auto& [n, v] : f) out[n] = v;
    return out;
  }
};

// What a `use` hands to the used file: explicit arguments and the user's visible names.
struct UseContext {
  std::map<std::string, std::pair<Value, SourceLoc>> args;
  std::set<std::string> consumed;
  std::map<std::string, Var> inherited;
};

struct PendingOrder {
  const ast::OrderStmt* stmt;
  SourceLoc loc;
  std::map<std::string, Var> env;
  std::vector<Note> context;
  std::string stream;
  std::optional<size_t> prev;  // the order before this one in its `sequence` block
  std::optional<std::vector<Task>> last_group;  // filled on expansion, for the next one in the sequence
  bool in_sequence = false;
  bool failed = false;
};

// Placement bookkeeping per pipeline region, for stages and "placed twice/never".
struct Placed {
  int64_t coord = 0;
  std::optional<std::pair<size_t, int64_t>> group;  // (place directive, stage group) for `over` forms
  SourceLoc loc;
};

class Checker {
 public:
  Checker(const Manifest& m, const CheckOptions& o, SourceManager& s, DiagnosticEngine& d)
      : m_(m), opt_(o), sources_(s), diags_(d) {
    for (const char* name : kBuiltinStreams) streams_[name] = SourceLoc{};
  }

  std::optional<CheckedStrategy> run(FileId top) {
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

 private:
  // ---------------------------------------------------------------- evaluation
  bool step(SourceLoc loc) {
    if (++steps_ <= opt_.max_steps) return true;
    if (!budget_reported_) {
      budget_reported_ = true;
      diags_.error(loc, fmt::format("strategy evaluation exceeded {} steps; is a loop bound much too large?",
                                    opt_.max_steps));
    }
    return false;
  }

  std::optional<Value> lookup(const ast::Expr& e, const Env& env) {
    if (const Var* v = env.find(e.name)) return v->value;
    if (e.name == "world") {
      if (opt_.world) return Value::of(*opt_.world);
      diags_.error(e.loc, "the world size is not known here: pass --np N (piper-check) or run under mpirun");
      return std::nullopt;
    }
    auto names = env.names();
    names.push_back("world");
    diags_.error(e.loc, fmt::format("unknown name '{}'{}", e.name, did_you_mean(e.name, names)));
    return std::nullopt;
  }

  std::optional<Value> eval(const ast::Expr& e, const Env& env) {
    using K = ast::Expr::Kind;
    switch (e.kind) {
      case K::Int: return Value::of(e.int_value);
      case K::Bool: return Value::of_bool(e.bool_value);
      case K::Name: return lookup(e, env);
      case K::Unary: {
        auto v = eval(*e.lhs, env);
        if (!v) return std::nullopt;
        if (e.name == "not") {
          if (!expect(*v, Value::Type::Bool, *e.lhs, "'not'")) return std::nullopt;
          return Value::of_bool(!v->b);
        }
        if (!expect(*v, Value::Type::Int, *e.lhs, "'-'")) return std::nullopt;
        if (v->i == INT64_MIN) return overflow(e);
        return Value::of(-v->i);
      }
      case K::Binary: return binary(e, env);
      case K::Call: return call(e, env);
    }
    PIPER_INTERNAL_ASSERT(false, "unknown expression kind");
  }

  std::optional<Value> overflow(const ast::Expr& e) {
    diags_.error(e.loc, "integer overflow");
    return std::nullopt;
  }

  bool expect(const Value& v, Value::Type t, const ast::Expr& where, const std::string& context) {
    if (v.type == t) return true;
    diags_.error(where.loc, fmt::format("{} needs {} here, but this is {}", context, type_name(t), type_name(v.type)));
    return false;
  }

  std::optional<Value> binary(const ast::Expr& e, const Env& env) {
    auto l = eval(*e.lhs, env);
    if (!l) return std::nullopt;
    const std::string& op = e.name;
    if (op == "and" || op == "or") {
      if (!expect(*l, Value::Type::Bool, *e.lhs, "'" + op + "'")) return std::nullopt;
      if (op == "and" && !l->b) return Value::of_bool(false);  // short-circuit, so guards can protect
      if (op == "or" && l->b) return Value::of_bool(true);
      auto r = eval(*e.rhs, env);
      if (!r || !expect(*r, Value::Type::Bool, *e.rhs, "'" + op + "'")) return std::nullopt;
      return Value::of_bool(r->b);
    }
    auto r = eval(*e.rhs, env);
    if (!r) return std::nullopt;
    if (op == "==" || op == "!=") {
      if (l->type != r->type) {
        diags_.error(e.loc, fmt::format("cannot compare {} with {}", type_name(l->type), type_name(r->type)));
        return std::nullopt;
      }
      bool eq = l->type == Value::Type::Int ? l->i == r->i : l->b == r->b;
      return Value::of_bool(op == "==" ? eq : !eq);
    }
    std::string ctx = "'" + op + "'";
    if (!expect(*l, Value::Type::Int, *e.lhs, ctx) || !expect(*r, Value::Type::Int, *e.rhs, ctx)) return std::nullopt;
    int64_t a = l->i, b = r->i, v = 0;
    if (op == "<") return Value::of_bool(a < b);
    if (op == "<=") return Value::of_bool(a <= b);
    if (op == ">") return Value::of_bool(a > b);
    if (op == ">=") return Value::of_bool(a >= b);
    if (op == "+") { if (__builtin_add_overflow(a, b, &v)) return overflow(e); return Value::of(v); }
    if (op == "-") { if (__builtin_sub_overflow(a, b, &v)) return overflow(e); return Value::of(v); }
    if (op == "*") { if (__builtin_mul_overflow(a, b, &v)) return overflow(e); return Value::of(v); }
    if (op == "/" || op == "%") {
      if (b == 0) {
        diags_.error(e.rhs->loc, fmt::format("{} by zero", op == "/" ? "division" : "remainder"));
        return std::nullopt;
      }
      if (a == INT64_MIN && b == -1) return overflow(e);
      // Floor semantics, so `(i - 1) % pp` stays in 0..pp-1 for negative i.
      int64_t q = a / b, rem = a % b;
      if (rem != 0 && ((rem < 0) != (b < 0))) --q, rem += b;
      return Value::of(op == "/" ? q : rem);
    }
    PIPER_INTERNAL_ASSERT(false, "unknown operator " + op);
  }

  std::optional<Value> call(const ast::Expr& e, const Env& env) {
    if (e.name == "min" || e.name == "max") {
      if (e.args.size() < 2) {
        diags_.error(e.loc, fmt::format("{}() takes two or more integers", e.name));
        return std::nullopt;
      }
      std::optional<int64_t> acc;
      for (const auto& a : e.args) {
        if (!a.expr) {
          diags_.error(a.selector->loc, fmt::format("{}() takes integers, not regions", e.name));
          return std::nullopt;
        }
        auto v = eval(*a.expr, env);
        if (!v || !expect(*v, Value::Type::Int, *a.expr, e.name + "()")) return std::nullopt;
        acc = !acc ? v->i : e.name == "min" ? std::min(*acc, v->i) : std::max(*acc, v->i);
      }
      return Value::of(*acc);
    }
    if (e.name == "len") {
      if (e.args.size() != 1) {
        diags_.error(e.loc, "len() takes one region, e.g. len(layers)");
        return std::nullopt;
      }
      ast::Selector from_name;
      const ast::Selector* sel = e.args[0].selector ? &*e.args[0].selector : nullptr;
      if (!sel) {
        const ast::Expr& a = *e.args[0].expr;
        if (a.kind != ast::Expr::Kind::Name) {
          diags_.error(a.loc, "len() takes a region, e.g. len(layers)");
          return std::nullopt;
        }
        from_name.loc = a.loc;
        from_name.parts.push_back(ast::SelectorPart{a.name, a.loc, ast::SelectorPart::Index::None, {}, {}});
        sel = &from_name;
      }
      auto regions = resolve(*sel, env);
      if (!regions) return std::nullopt;
      std::optional<size_t> n;
      for (RegionId r : *regions) {
        if (!m_.is_list(r)) {
          diags_.error(sel->loc, fmt::format("len() needs a list region such as 'layers'; '{}' is not a list",
                                             m_.selector_text(r)));
          return std::nullopt;
        }
        if (n && *n != m_.regions[r].children.size()) {
          diags_.error(sel->loc, "len(): the selected lists have different lengths");
          return std::nullopt;
        }
        n = m_.regions[r].children.size();
      }
      return Value::of(static_cast<int64_t>(n.value_or(0)));
    }
    diags_.error(e.loc, fmt::format("unknown function '{}'{}", e.name, did_you_mean(e.name, {"min", "max", "len"})));
    return std::nullopt;
  }

  std::optional<int64_t> eval_int(const ast::Expr& e, const Env& env, const std::string& what) {
    auto v = eval(e, env);
    if (!v || !expect(*v, Value::Type::Int, e, what)) return std::nullopt;
    return v->i;
  }

  // ---------------------------------------------------------------- regions
  std::vector<std::string> child_names(RegionId r) const {
    std::vector<std::string> out;
    for (RegionId c : m_.regions[r].children) out.push_back(m_.regions[c].leaf);
    return out;
  }

  // A path below `from` to a descendant named `leaf`, in selector syntax (`moe.experts`).
  std::optional<std::string> find_below(RegionId from, const std::string& leaf) const {
    std::vector<std::pair<RegionId, std::string>> queue{{from, ""}};
    for (size_t q = 0; q < queue.size() && q < 10000; ++q) {
      auto [r, path] = queue[q];
      for (RegionId c : m_.regions[r].children) {
        const std::string& l = m_.regions[c].leaf;
        bool numeric = !l.empty() && std::isdigit(static_cast<unsigned char>(l[0]));
        if (numeric && c != m_.regions[r].children.front()) continue;  // one list member is enough
        std::string p = numeric ? path + "[*]" : path + (path.empty() ? "" : ".") + l;
        if (l == leaf) return p;
        queue.emplace_back(c, p);
      }
    }
    return std::nullopt;
  }

  std::optional<std::vector<RegionId>> resolve(const ast::Selector& sel, const Env& env) {
    if (sel.whole_model) return std::vector<RegionId>{0};
    std::vector<RegionId> cur{0};
    std::string so_far;
    for (const ast::SelectorPart& part : sel.parts) {
      std::vector<RegionId> next;
      for (RegionId r : cur) {
        auto c = m_.child(r, part.name);
        if (!c) {
          SourceLoc at = part.loc;
          at.length = static_cast<uint32_t>(part.name.size());
          std::string hint = did_you_mean(part.name, child_names(r));
          if (hint.empty())
            if (auto below = find_below(r, part.name))
              hint = fmt::format("; did you mean '{}{}{}'?", so_far,
                                 so_far.empty() || below->front() == '[' ? "" : ".", *below);
          auto& d = diags_.error(at, r == 0 ? fmt::format("unknown region '{}'{}", part.name, hint)
                                            : fmt::format("'{}' has no region '{}'{}", m_.selector_text(r),
                                                          part.name, hint));
          if (hint.empty() && !m_.regions[r].children.empty()) {
            auto names = child_names(r);
            if (m_.is_list(r)) d.note(SourceLoc{}, fmt::format("'{}' is a list of {}: index it, e.g. {}[0]",
                                                                m_.selector_text(r), names.size(), part.name));
            else d.note(SourceLoc{}, fmt::format("regions here: {}", fmt::join(names, ", ")));
          }
          return std::nullopt;
        }
        next.push_back(*c);
      }
      so_far += (so_far.empty() ? "" : ".") + part.name;
      if (part.index != ast::SelectorPart::Index::None) {
        std::vector<RegionId> indexed;
        for (RegionId r : next) {
          if (!m_.is_list(r)) {
            diags_.error(part.loc, fmt::format("'{}' is not a list and cannot be indexed", m_.selector_text(r)));
            return std::nullopt;
          }
          const auto& ch = m_.regions[r].children;
          int64_t n = static_cast<int64_t>(ch.size());
          if (part.index == ast::SelectorPart::Index::All) {
            indexed.insert(indexed.end(), ch.begin(), ch.end());
            continue;
          }
          auto lo = eval_int(*part.lo, env, "an index");
          if (!lo) return std::nullopt;
          int64_t hi = *lo;
          if (part.index == ast::SelectorPart::Index::Range) {
            auto h = eval_int(*part.hi, env, "an index");
            if (!h) return std::nullopt;
            hi = *h;
            if (hi < *lo) {
              diags_.error(part.loc, fmt::format("empty range {}..{} (ranges include both ends)", *lo, hi));
              return std::nullopt;
            }
          }
          for (int64_t idx : {*lo, hi}) {
            if (idx < 0 || idx >= n) {
              diags_.error(part.loc, fmt::format("index {} is out of range: '{}' has {} entries (0..{})", idx,
                                                 m_.selector_text(r), n, n - 1));
              return std::nullopt;
            }
          }
          for (int64_t i = *lo; i <= hi; ++i) indexed.push_back(ch[static_cast<size_t>(i)]);
        }
        next = std::move(indexed);
        so_far += part.index == ast::SelectorPart::Index::All ? "[*]" : "[..]";
      }
      cur = std::move(next);
    }
    return cur;
  }

  std::optional<std::vector<RegionId>> resolve_all(const std::vector<ast::Selector>& sels, const Env& env) {
    std::vector<RegionId> out;
    for (const auto& s : sels) {
      auto r = resolve(s, env);
      if (!r) return std::nullopt;
      for (RegionId id : *r)
        if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    }
    return out;
  }

  // Pipeline regions (sequence members) covered by a selection, in sequence order.
  std::optional<std::vector<RegionId>> to_pipeline(const std::vector<RegionId>& sel, const ast::Selector& where) {
    std::vector<RegionId> out;
    for (RegionId seq : m_.sequence) {
      bool hit = false;
      for (RegionId r : sel) {
        if (m_.is_ancestor(r, seq)) hit = true;
        else if (m_.is_ancestor(seq, r) && r != seq) {
          diags_.error(where.loc, fmt::format("cannot place '{}' by itself: only the pipeline's regions are placed, "
                                              "and '{}' moves with '{}'",
                                              m_.selector_text(r), m_.selector_text(r), m_.selector_text(seq)));
          return std::nullopt;
        }
      }
      if (hit) out.push_back(seq);
    }
    return out;
  }

  // ---------------------------------------------------------------- statements
  void run_file(const ast::File& file, UseContext& use) {
    Env env;
    run_block(file.stmts, env, use, file.id);
  }

  void run_block(const ast::Block& block, Env& env, UseContext& use, FileId file) {
    for (const auto& s : block) {
      if (file == top_ && !first_stmt_.valid()) first_stmt_ = s->loc;
      if (!step(s->loc)) return;
      run_stmt(*s, env, use, file);
    }
  }

  bool declare(Env& env, const std::string& name, Value v, SourceLoc loc, const char* what) {
    if (const Var* old = env.find(name)) {
      diags_.error(loc, fmt::format("'{}' is already defined", name)).note(old->decl, fmt::format("{} '{}' defined here", old->what, name));
      return false;
    }
    env.frames.back()[name] = Var{v, loc, what};
    return true;
  }

  SourceLoc name_loc(SourceLoc stmt, const std::string& keyword, const std::string& name) {
    // `param NAME`: point at the name, just after the keyword and a space (good enough for carets).
    SourceLoc l = stmt;
    std::string_view line = sources_.line(stmt.file, stmt.line);
    size_t at = line.find(name, stmt.col - 1 + keyword.size());
    if (at != std::string_view::npos) l.col = static_cast<uint32_t>(at + 1);
    l.length = static_cast<uint32_t>(name.size());
    return l;
  }

  std::optional<Value> parse_override(const Override& o) {
    if (o.value == "true" || o.value == "false") return Value::of_bool(o.value == "true");
    int64_t v = 0;
    auto [p, ec] = std::from_chars(o.value.data(), o.value.data() + o.value.size(), v);
    if (ec != std::errc() || p != o.value.data() + o.value.size()) {
      diags_.error(o.loc, fmt::format("--set {}: '{}' is not an integer or true/false", o.name, o.value));
      return std::nullopt;
    }
    return Value::of(v);
  }

  void run_stmt(const ast::Stmt& s, Env& env, UseContext& use, FileId file) {
    std::visit([&](const auto& node) { this->stmt(node, s, env, use, file); }, s.node);
  }

  void stmt(const ast::ParamStmt& p, const ast::Stmt& s, Env& env, UseContext& use, FileId) {
    SourceLoc loc = name_loc(s.loc, "param", p.name);
    std::optional<Value> v;
    std::optional<Value> fallback = eval(*p.value, env);  // the default is checked even when overridden
    if (!fallback) return;
    if (auto a = use.args.find(p.name); a != use.args.end()) {
      use.consumed.insert(p.name);
      v = a->second.first;
    } else if (auto inh = use.inherited.find(p.name); inh != use.inherited.end()) {
      v = inh->second.value;
    } else {
      for (const Override& o : opt_.overrides) {
        if (o.name != p.name) continue;
        used_overrides_.insert(o.name);
        // A bad override is reported; the default stands in so later uses do not cascade.
        v = parse_override(o);
        if (v && v->type != fallback->type) {
          diags_.error(o.loc, fmt::format("--set {}: parameter '{}' is {}", o.name, o.name, type_name(fallback->type)))
              .note(loc, "declared here");
          v.reset();
        }
      }
    }
    if (!v) v = fallback;
    if (v->type != fallback->type) {
      diags_.error(loc, fmt::format("parameter '{}' defaults to {} but is given {}", p.name,
                                    type_name(fallback->type), type_name(v->type)));
      return;
    }
    declared_params_.emplace(p.name, loc);
    if (!declare(env, p.name, *v, loc, "parameter")) return;
    if (v->type == Value::Type::Int &&
        std::none_of(out_.params.begin(), out_.params.end(), [&](auto& kv) { return kv.first == p.name; }))
      out_.params.emplace_back(p.name, v->i);
  }

  void stmt(const ast::LetStmt& l, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto v = eval(*l.value, env);
    if (v) declare(env, l.name, *v, name_loc(s.loc, "let", l.name), "let binding");
  }

  void stmt(const ast::MeshStmt& m, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    if (!first_mesh_.valid()) first_mesh_ = s.loc;
    for (const auto& a : m.axes) {
      auto size = eval_int(*a.value, env, "a mesh axis size");
      if (!size) continue;
      if (*size < 1) {
        diags_.error(a.value->loc, fmt::format("mesh axis '{}' has size {}; sizes are at least 1", a.name, *size));
        continue;
      }
      auto it = std::find_if(out_.mesh.begin(), out_.mesh.end(), [&](auto& x) { return x.name == a.name; });
      if (it == out_.mesh.end()) {
        out_.mesh.push_back(MeshAxis{a.name, *size, a.loc});
      } else if (it->size != *size) {
        // Composed files may each declare the axes they use; they must agree.
        diags_.error(a.loc, fmt::format("mesh axis '{}' is declared with size {} here but {} before", a.name, *size,
                                        it->size))
            .note(it->loc, "first declared here");
      }
    }
  }

  void stmt(const ast::StreamStmt& st, const ast::Stmt&, Env&, UseContext&, FileId) {
    for (const auto& [name, loc] : st.names) {
      if (auto it = streams_.find(name); it != streams_.end()) {
        auto& d = diags_.error(loc, fmt::format("stream '{}' is already declared", name));
        if (it->second.valid()) d.note(it->second, "declared here");
        else d.note(SourceLoc{}, fmt::format("'{}' is built in", name));
        continue;
      }
      streams_[name] = loc;
      out_.streams.push_back(name);
    }
  }

  std::optional<std::string> check_stream(const std::optional<std::pair<std::string, SourceLoc>>& st) {
    if (!st) return std::string("");
    if (streams_.count(st->first)) return st->first;
    std::vector<std::string> names;
    for (auto& [n, _] : streams_) names.push_back(n);
    diags_.error(st->second, fmt::format("unknown stream '{}'{}", st->first, did_you_mean(st->first, names)))
        .note(SourceLoc{}, fmt::format("declare it first with `stream {};` (built in: compute, comm)", st->first));
    return std::nullopt;
  }

  std::optional<std::string> find_strategy(const std::string& path, FileId from, SourceLoc loc) {
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
    diags_.error(loc, fmt::format("cannot find strategy \"{}\"", path))
        .note(SourceLoc{}, fmt::format("looked in: {}", fmt::join(tried, ", ")));
    return std::nullopt;
  }

  void stmt(const ast::UseStmt& u, const ast::Stmt& s, Env& env, UseContext&, FileId file) {
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
    inner.inherited = env.flatten();
    const ast::File* used = load(canon);
    if (!used) return;
    stack_.push_back(canon);
    diags_.push_context(s.loc, fmt::format("in strategy \"{}\" used here", u.path));
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

  const ast::File* load(const std::string& canon) {
    if (auto it = parsed_.find(canon); it != parsed_.end()) return it->second;
    std::error_code ec;
    if (auto size = fs::file_size(canon, ec); ec || size > ParseLimits{}.max_bytes) {
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

  void stmt(const ast::AssertStmt& a, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto v = eval(*a.cond, env);
    if (!v || !expect(*v, Value::Type::Bool, *a.cond, "assert")) return;
    if (!v->b) {
      SourceLoc loc = s.loc;
      loc.length = 6;
      diags_.error(loc, a.message.empty() ? "assertion failed" : "assertion failed: " + a.message);
    }
  }

  void stmt(const ast::IfStmt& i, const ast::Stmt&, Env& env, UseContext& use, FileId file) {
    auto v = eval(*i.cond, env);
    if (!v || !expect(*v, Value::Type::Bool, *i.cond, "'if'")) return;
    env.frames.emplace_back();
    run_block(v->b ? i.then_block : i.else_block, env, use, file);
    env.frames.pop_back();
  }

  void stmt(const ast::ForStmt& f, const ast::Stmt& s, Env& env, UseContext& use, FileId file) {
    auto lo = eval_int(*f.lo, env, "a loop bound");
    auto hi = eval_int(*f.hi, env, "a loop bound");
    if (!lo || !hi) return;
    SourceLoc var_loc = name_loc(s.loc, "for", f.var);
    if (const Var* old = env.find(f.var)) {
      diags_.error(var_loc, fmt::format("loop variable '{}' hides an existing name", f.var))
          .note(old->decl, fmt::format("{} '{}' defined here", old->what, f.var));
      return;
    }
    for (int64_t i = *lo; i <= *hi; ++i) {
      if (!step(s.loc)) return;
      env.frames.emplace_back();
      env.frames.back()[f.var] = Var{Value::of(i), var_loc, "loop variable"};
      size_t errors = diags_.error_count();
      run_block(f.body, env, use, file);
      env.frames.pop_back();
      if (diags_.error_count() > errors) return;  // one report per loop, not one per iteration
      if (i == INT64_MAX) break;
    }
  }

  std::optional<std::string> check_axis(const ast::AxisRef& a, const Env& env) {
    auto it = std::find_if(out_.mesh.begin(), out_.mesh.end(), [&](auto& x) { return x.name == a.name; });
    if (it == out_.mesh.end()) {
      std::vector<std::string> names;
      for (auto& x : out_.mesh) names.push_back(x.name);
      auto& d = diags_.error(a.loc, fmt::format("unknown mesh axis '{}'{}", a.name, did_you_mean(a.name, names)));
      if (names.empty()) d.note(SourceLoc{}, fmt::format("declare the mesh first, e.g. `mesh {} = 2;`", a.name));
      else d.note(out_.mesh.front().loc, fmt::format("the mesh so far has: {}", fmt::join(names, ", ")));
      return std::nullopt;
    }
    if (a.size) {
      auto size = eval_int(*a.size, env, "an axis size");
      if (!size) return std::nullopt;
      if (*size != it->size) {
        diags_.error(a.size->loc, fmt::format("axis '{}' has size {} in the mesh, not {}", a.name, it->size, *size))
            .note(it->loc, "mesh axis declared here");
        return std::nullopt;
      }
    }
    used_axes_.insert(a.name);
    return a.name;
  }

  int64_t axis_size(const std::string& name) const { return out_.axis_size(name); }

  void stmt(const ast::PlaceStmt& p, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto sel = resolve_all(p.regions, env);
    if (!sel) return;
    auto regions = to_pipeline(*sel, p.regions.front());
    if (!regions) return;
    auto stream = check_stream(p.stream);
    if (!stream) return;
    PlaceDirective d;
    d.regions = *regions;
    d.stream = *stream;
    using M = ast::PlaceStmt::Mode;
    if (p.mode == M::On) {
      if (p.coords.size() != 1) {
        diags_.error(p.coords[1].loc, "place on one axis only (the pipeline axis); spread over other axes with "
                                      "replicate or shard");
        return;
      }
      const ast::Binding& c = p.coords[0];
      if (!check_axis(ast::AxisRef{c.name, nullptr, c.loc}, env)) return;
      auto coord = eval_int(*c.value, env, "a mesh coordinate");
      if (!coord) return;
      int64_t n = axis_size(c.name);
      if (*coord < 0 || *coord >= n) {
        diags_.error(c.value->loc, fmt::format("coordinate {} is outside axis '{}' (0..{})", *coord, c.name, n - 1));
        return;
      }
      d.mode = PlaceDirective::Mode::On;
      d.axis = c.name;
      d.coord = *coord;
    } else {
      auto axis = check_axis(p.axis, env);
      if (!axis) return;
      d.axis = *axis;
      int64_t n = axis_size(d.axis);
      int64_t groups = n;
      d.mode = p.mode == M::Contiguous ? PlaceDirective::Mode::Contiguous
             : p.mode == M::VShape     ? PlaceDirective::Mode::VShape
                                       : PlaceDirective::Mode::Interleaved;
      if (p.mode == M::Interleaved) {
        auto v = eval_int(*p.chunks, env, "interleaved()");
        if (!v) return;
        if (*v < 1) {
          diags_.error(p.chunks->loc, fmt::format("interleaved({}) needs at least 1 chunk per rank", *v));
          return;
        }
        d.chunks = *v;
        groups = n * *v;
      } else if (p.mode == M::VShape) {
        groups = 2 * n;
      }
      int64_t count = static_cast<int64_t>(d.regions.size());
      if (count % groups != 0) {
        diags_.error(p.regions.front().loc,
                     fmt::format("{} regions cannot be cut evenly into {} stages ({} over {}={}{})", count, groups,
                                 p.mode == M::VShape ? "V-shape: 2 per rank" : p.mode == M::Interleaved ? "interleaved" : "contiguous",
                                 d.axis, n, p.mode == M::Interleaved ? fmt::format(" × {} chunks", d.chunks) : ""))
            .note(SourceLoc{}, fmt::format("selected: {}", print_regions(d.regions, m_)));
        return;
      }
    }
    if (!out_.pipeline_axis.empty() && out_.pipeline_axis != d.axis) {
      diags_.error(s.loc, fmt::format("all regions are placed over one pipeline axis; this uses '{}' but "
                                      "earlier placement used '{}'", d.axis, out_.pipeline_axis))
          .note(first_place_, "first placed here");
      return;
    }
    out_.pipeline_axis = d.axis;
    if (!first_place_.valid()) first_place_ = s.loc;
    size_t index = ++place_count_;
    int64_t n = axis_size(d.axis);
    int64_t groups = d.mode == PlaceDirective::Mode::Interleaved ? n * d.chunks
                   : d.mode == PlaceDirective::Mode::VShape     ? 2 * n : n;
    int64_t per = std::max<int64_t>(1, static_cast<int64_t>(d.regions.size()) / groups);
    for (size_t j = 0; j < d.regions.size(); ++j) {
      RegionId r = d.regions[j];
      if (auto it = placed_.find(r); it != placed_.end()) {
        diags_.error(p.regions.front().loc, fmt::format("region '{}' is placed twice", m_.selector_text(r)))
            .note(it->second.loc, "first placed here");
        return;
      }
      Placed pl;
      pl.loc = s.loc;
      if (d.mode == PlaceDirective::Mode::On) {
        pl.coord = d.coord;
      } else {
        int64_t k = static_cast<int64_t>(j) / per;
        pl.group = std::make_pair(index, k);
        pl.coord = d.mode == PlaceDirective::Mode::Contiguous ? k
                 : d.mode == PlaceDirective::Mode::Interleaved ? k % n
                 : (k < n ? k : 2 * n - 1 - k);
      }
      placed_[r] = pl;
    }
    out_.directives.push_back(Directive{s.loc, std::move(d), diags_.context()});
  }

  void stmt(const ast::ReplicateStmt& r, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto sel = resolve_all(r.regions, env);
    if (!sel) return;
    auto axis = check_axis(r.axis, env);
    if (!axis) return;
    auto stream = check_stream(r.stream);
    if (!stream) return;
    ReplicateDirective d{*sel, *axis, 0, 0, *stream};
    if (r.zero) {
      auto z = eval_int(*r.zero, env, "zero");
      if (!z) return;
      if (*z < 0 || *z > 3) {
        diags_.error(r.zero->loc, fmt::format("ZeRO stage {} does not exist; use 0 (plain data parallel), 1, 2 or 3", *z));
        return;
      }
      d.zero = static_cast<int>(*z);
    }
    if (r.bucket) {
      auto b = eval_int(*r.bucket, env, "bucket");
      if (!b) return;
      if (*b <= 0) {
        diags_.error(r.bucket->loc, fmt::format("bucket size must be positive, e.g. 25MiB (got {})", *b));
        return;
      }
      d.bucket_bytes = *b;
    }
    replicate_axes_.emplace(*axis, s.loc);
    out_.directives.push_back(Directive{s.loc, std::move(d), diags_.context()});
  }

  void stmt(const ast::ShardStmt& sh, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto sel = resolve_all(sh.regions, env);
    if (!sel) return;
    auto axis = check_axis(sh.axis, env);
    if (!axis) return;
    auto stream = check_stream(sh.stream);
    if (!stream) return;
    int64_t n = axis_size(*axis);
    for (RegionId r : *sel) {
      if (!m_.is_list(r)) {
        diags_.error(sh.regions.front().loc,
                     fmt::format("cannot shard '{}': shard spreads the members of a list region (such as "
                                 "layers[*].moe.experts) over an axis",
                                 m_.selector_text(r)));
        return;
      }
      int64_t count = static_cast<int64_t>(m_.regions[r].children.size());
      if (count % n != 0) {
        diags_.error(sh.regions.front().loc, fmt::format("'{}' has {} members, which do not divide evenly over {}={}",
                                                         m_.selector_text(r), count, *axis, n));
        return;
      }
    }
    shard_axes_.emplace(*axis, s.loc);
    out_.directives.push_back(Directive{s.loc, ShardDirective{*sel, *axis, *stream}, diags_.context()});
  }

  void stmt(const ast::SplitStmt& sp, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto n = eval_int(*sp.microbatches, env, "split");
    if (!n) return;
    if (*n < 1) {
      diags_.error(sp.microbatches->loc, fmt::format("cannot split the batch into {} microbatches", *n));
      return;
    }
    if (split_loc_.valid()) {
      if (*n != out_.microbatches)
        diags_.error(s.loc, fmt::format("the batch is split into {} microbatches here but {} before", *n,
                                        out_.microbatches))
            .note(split_loc_, "first split here");
      return;
    }
    split_loc_ = s.loc;
    out_.microbatches = *n;
    out_.directives.push_back(Directive{s.loc, SplitDirective{*n}, diags_.context()});
  }

  void stmt(const ast::OrderStmt& o, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto stream = check_stream(o.stream);
    if (!stream) return;
    // Tasks name stages, which exist only once every place has run: expand at the end.
    PendingOrder p{&o, s.loc, env.flatten(), diags_.context(), *stream, std::nullopt, std::nullopt};
    if (!sequences_.empty()) {
      p.in_sequence = true;
      p.prev = sequences_.back();
      sequences_.back() = pending_.size();
    }
    pending_.push_back(std::move(p));
    out_.directives.push_back(Directive{s.loc, OrderDirective{}, diags_.context()});
    pending_slots_.push_back(out_.directives.size() - 1);
  }

  void stmt(const ast::SequenceStmt& q, const ast::Stmt&, Env& env, UseContext& use, FileId file) {
    sequences_.emplace_back();
    env.frames.emplace_back();
    run_block(q.body, env, use, file);
    env.frames.pop_back();
    sequences_.pop_back();
  }

  void stmt(const ast::RecomputeStmt& r, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    auto sel = resolve_all(r.regions, env);
    if (!sel) return;
    out_.directives.push_back(Directive{s.loc, RecomputeDirective{*sel}, diags_.context()});
  }

  void stmt(const ast::PrecisionStmt& p, const ast::Stmt& s, Env& env, UseContext&, FileId) {
    DType t;
    if (p.dtype == "fp32") t = DType::F32;
    else if (p.dtype == "bf16") t = DType::BF16;
    else {
      diags_.error(p.dtype_loc, fmt::format("unknown precision '{}'{}", p.dtype, did_you_mean(p.dtype, {"fp32", "bf16"})))
          .note(SourceLoc{}, "supported: fp32, bf16");
      return;
    }
    std::vector<RegionId> regions{0};
    if (!p.regions.empty()) {
      auto sel = resolve_all(p.regions, env);
      if (!sel) return;
      regions = *sel;
    }
    out_.directives.push_back(Directive{s.loc, PrecisionDirective{t, regions}, diags_.context()});
  }

  // ---------------------------------------------------------------- whole-strategy checks
  void finish() {
    for (const Override& o : opt_.overrides)
      if (!used_overrides_.count(o.name)) {
        std::vector<std::string> names;
        for (auto& [n, _] : declared_params_) names.push_back(n);
        diags_.error(o.loc, fmt::format("--set {}: the strategy has no parameter '{}'{}", o.name, o.name,
                                        did_you_mean(o.name, names)));
      }
    finish_mesh();
    finish_placement();
    finish_axes();
    finish_batch();
    if (diags_.has_errors()) return;
    finish_orders();
  }

  void finish_mesh() {
    int64_t product = 1;
    for (const auto& a : out_.mesh)
      if (__builtin_mul_overflow(product, a.size, &product)) {
        diags_.error(a.loc, "the mesh has more devices than fit in 64 bits");
        return;
      }
    out_.world = opt_.world.value_or(product);
    if (product == out_.world) return;
    std::vector<std::string> parts;
    for (const auto& a : out_.mesh) parts.push_back(fmt::format("{}={}", a.name, a.size));
    if (out_.mesh.empty()) {
      diags_.error(first_stmt_.valid() ? first_stmt_ : SourceLoc{top_, 1, 1, 1},
                   fmt::format("the strategy declares no mesh, so it runs on 1 device, but the world has {} ranks",
                               out_.world))
          .note(SourceLoc{}, fmt::format("declare one, e.g. `mesh dp = {};`", out_.world));
      return;
    }
    auto& d = diags_.error(first_mesh_, fmt::format("the mesh has {} devices ({}) but the world has {} ranks", product,
                                                    fmt::join(parts, " × "), out_.world));
    if (opt_.world_loc.valid()) d.note(opt_.world_loc, "world size given here");
  }

  void finish_placement() {
    if (place_count_ == 0) {
      Stage all;
      all.regions = m_.sequence;
      out_.stages.push_back(std::move(all));
      return;
    }
    std::vector<std::string> missing;
    for (RegionId r : m_.sequence)
      if (!placed_.count(r)) missing.push_back(m_.selector_text(r));
    if (!missing.empty()) {
      diags_.error(first_place_, fmt::format("{} never placed: {}", missing.size() == 1 ? "this region is" : "these regions are",
                                             fmt::join(missing, ", ")))
          .note(SourceLoc{}, "once any region is placed, every pipeline region must be placed exactly once");
      return;
    }
    // Walk the pipeline in order: a stage is a maximal run on one coordinate. Regions placed with
    // `on` join their neighbours; `over` groups stay apart (a V's two halves on the last rank are two stages).
    std::optional<std::pair<size_t, int64_t>> group;
    for (RegionId r : m_.sequence) {
      const Placed& p = placed_.at(r);
      bool join = !out_.stages.empty() && out_.stages.back().coord == p.coord &&
                  (!p.group || !group || *p.group == *group);
      if (!join) {
        Stage st;
        st.coord = p.coord;
        out_.stages.push_back(std::move(st));
        group.reset();
      }
      out_.stages.back().regions.push_back(r);
      if (p.group) group = p.group;
    }
    std::map<int64_t, int64_t> per_coord;
    for (Stage& st : out_.stages) st.chunk = per_coord[st.coord]++;
  }

  void finish_axes() {
    const std::string& pp = out_.pipeline_axis;
    for (auto* uses : {&replicate_axes_, &shard_axes_}) {
      if (auto it = uses->find(pp); !pp.empty() && it != uses->end())
        diags_.error(it->second, fmt::format("'{}' is the pipeline axis (regions are placed over it); {} over "
                                             "another axis",
                                             pp, uses == &replicate_axes_ ? "replicate" : "shard"))
            .note(first_place_, "placed over it here");
    }
    for (const auto& a : out_.mesh)
      if (a.size > 1 && !used_axes_.count(a.name))
        diags_.error(a.loc, fmt::format("mesh axis '{}' (size {}) is not used by any place, replicate or shard",
                                        a.name, a.size))
            .note(SourceLoc{}, fmt::format("e.g. `replicate * over {};` for data parallelism", a.name));
  }

  void finish_batch() {
    if (!opt_.batch_size) return;
    int64_t pp = out_.pipeline_axis.empty() ? 1 : axis_size(out_.pipeline_axis);
    int64_t data_ways = out_.world / std::max<int64_t>(1, pp);
    int64_t need = data_ways * out_.microbatches;
    if (need <= 0 || *opt_.batch_size % need == 0) return;  // need 0: the mesh error says why
    SourceLoc at = split_loc_.valid() ? split_loc_ : SourceLoc{top_, 1, 1, 1};
    diags_.error(at, fmt::format("the global batch of {} does not split into {} data-parallel replicas × {} "
                                 "microbatches",
                                 *opt_.batch_size, data_ways, out_.microbatches))
        .note(SourceLoc{}, fmt::format("use a batch size that is a multiple of {}", need));
  }

  // ---------------------------------------------------------------- order expansion
  static std::optional<TaskKind> task_kind(const std::string& name) {
    if (name == "fwd") return TaskKind::Fwd;
    if (name == "bwd") return TaskKind::Bwd;
    if (name == "bwd_input") return TaskKind::BwdInput;
    if (name == "bwd_weight") return TaskKind::BwdWeight;
    return std::nullopt;
  }

  void finish_orders() {
    const int64_t stages = static_cast<int64_t>(out_.stages.size());
    std::vector<Directive> expanded;
    size_t next_pending = 0;
    for (size_t i = 0; i < out_.directives.size(); ++i) {
      if (next_pending < pending_slots_.size() && pending_slots_[next_pending] == i) {
        PendingOrder& p = pending_[next_pending++];
        for (const Note& n : p.context) diags_.push_context(n.loc, n.message);
        size_t errors = diags_.error_count();
        expand(p, stages, expanded);
        p.failed = diags_.error_count() > errors;
        for (size_t k = 0; k < p.context.size(); ++k) diags_.pop_context();
      } else {
        expanded.push_back(std::move(out_.directives[i]));
      }
    }
    out_.directives = std::move(expanded);
  }

  void expand(PendingOrder& p, int64_t stages, std::vector<Directive>& out) {
    const int64_t mbs = out_.microbatches;
    // Validate task names and arities; find the free (quantified) variables and their domains.
    struct Free { std::string name; int64_t domain; };
    std::vector<Free> free;
    bool one_arg = false;
    auto is_bound = [&](const std::string& n) { return p.env.count(n) || n == "world"; };
    for (const auto& group : p.stmt->chain)
      for (const auto& t : group) {
        if (!task_kind(t.kind)) {
          static const std::map<std::string, std::string> kAliases = {
              {"forward", "fwd"}, {"backward", "bwd"}, {"F", "fwd"}, {"B", "bwd"}, {"I", "bwd_input"},
              {"W", "bwd_weight"}, {"backward_input", "bwd_input"}, {"backward_weight", "bwd_weight"}};
          auto alias = kAliases.find(t.kind);
          std::string hint = alias != kAliases.end() ? "; did you mean '" + alias->second + "'?"
                                                     : did_you_mean(t.kind, {"fwd", "bwd", "bwd_input", "bwd_weight"});
          SourceLoc at = t.loc;
          at.length = static_cast<uint32_t>(t.kind.size());
          diags_.error(at, fmt::format("unknown task '{}'{}", t.kind, hint))
              .note(SourceLoc{}, "tasks are fwd, bwd, bwd_input and bwd_weight, written as fwd(stage, microbatch)");
          return;
        }
        if (t.args.empty() || t.args.size() > 2) {
          diags_.error(t.loc, fmt::format("{}() takes (stage, microbatch) or (microbatch), not {} argument{}", t.kind,
                                          t.args.size(), t.args.size() == 1 ? "" : "s"));
          return;
        }
        if (t.args.size() == 1) one_arg = true;
        for (size_t a = 0; a < t.args.size(); ++a) {
          const ast::Expr& e = *t.args[a];
          if (e.kind != ast::Expr::Kind::Name || is_bound(e.name)) continue;
          if (std::none_of(free.begin(), free.end(), [&](auto& f) { return f.name == e.name; }))
            free.push_back({e.name, (t.args.size() == 2 && a == 0) ? stages : mbs});
        }
      }
    // One-argument tasks share an implicit stage: `fwd(i) || bwd(i-1)` pairs tasks of one stage.
    const std::string kImplicitStage = "$stage";
    if (one_arg) free.push_back({kImplicitStage, stages});

    if (p.in_sequence && !free.empty()) {
      diags_.error(p.loc, fmt::format("inside a sequence, orders name concrete tasks; '{}' is not defined",
                                      free.front().name == kImplicitStage ? std::string("the stage") : free.front().name))
          .note(SourceLoc{}, "bind it with a loop or let, or write fwd(stage, microbatch)");
      return;
    }
    const PendingOrder* prev = p.prev ? &pending_[*p.prev] : nullptr;
    if (prev && prev->failed) return;

    int64_t combos = 1;
    for (const auto& f : free)
      if (__builtin_mul_overflow(combos, std::max<int64_t>(f.domain, 1), &combos) || combos > opt_.max_steps) {
        diags_.error(p.loc, "this order has too many instances to expand");
        return;
      }

    Env env;
    for (const auto& [n, v] : p.env) env.frames.back()[n] = v;
    env.frames.emplace_back();
    std::vector<int64_t> idx(free.size(), 0);
    size_t produced = 0;
    std::optional<std::string> out_of_range;  // why the last dropped instance was dropped
    for (int64_t c = 0; c < combos; ++c) {
      if (!step(p.loc)) return;
      for (size_t f = 0; f < free.size(); ++f)
        env.frames.back()[free[f].name] = Var{Value::of(idx[f]), p.loc, "order variable"};
      OrderDirective d{{}, p.stream};
      bool keep = true;
      for (const auto& group : p.stmt->chain) {
        std::vector<Task> g;
        for (const auto& t : group) {
          Task task{*task_kind(t.kind), 0, 0};
          std::optional<int64_t> s, mb;
          if (t.args.size() == 2) {
            s = eval_int(*t.args[0], env, "a task's stage");
            mb = eval_int(*t.args[1], env, "a task's microbatch");
          } else {
            s = env.find(kImplicitStage)->value.i;
            mb = eval_int(*t.args[0], env, "a task's microbatch");
          }
          if (!s || !mb) return;
          task.stage = *s;
          task.microbatch = *mb;
          if (task.stage < 0 || task.stage >= stages || task.microbatch < 0 || task.microbatch >= mbs) {
            std::string why = task.stage < 0 || task.stage >= stages
                ? fmt::format("stage {} does not exist: the strategy has {} stage{} (0..{})", task.stage, stages,
                              stages == 1 ? "" : "s", stages - 1)
                : fmt::format("microbatch {} does not exist: the batch is split into {} (0..{})", task.microbatch,
                              mbs, mbs - 1);
            if (free.empty()) {
              diags_.error(t.loc, fmt::format("{}({}, {}): {}", t.kind, task.stage, task.microbatch, why));
              return;
            }
            if (!out_of_range) out_of_range = why;
            keep = false;
          }
          g.push_back(task);
        }
        d.chain.push_back(std::move(g));
      }
      if (keep && prev && prev->last_group) d.chain.insert(d.chain.begin(), *prev->last_group);
      if (keep && !check_instance(p, d)) return;
      if (keep) {
        p.last_group = d.chain.back();
        out.push_back(Directive{p.loc, std::move(d), p.context});
        ++produced;
      }
      // The last free variable varies fastest, so instances read like nested loops in source order.
      for (size_t f = free.size(); f-- > 0;) {
        if (++idx[f] < free[f].domain) break;
        idx[f] = 0;
      }
    }
    // With these parameters no instance exists. In a library file that is by design (1F1B's
    // microbatch chains with mb = 1); in the user's own file it is probably a mistake: warn.
    if (produced == 0 && p.context.empty()) {
      std::vector<std::string> vars;
      for (const auto& f : free) if (f.name != kImplicitStage) vars.push_back(f.name);
      auto& d = diags_.warning(p.loc, fmt::format("this order matches no tasks: for every value of {} some task does "
                                                  "not exist",
                                                  vars.empty() ? std::string("the stage") : fmt::format("{}", fmt::join(vars, ", "))));
      if (out_of_range) d.note(SourceLoc{}, *out_of_range);
    }
  }

  bool check_instance(const PendingOrder& p, const OrderDirective& d) {
    std::set<Task> seen;
    for (const auto& g : d.chain)
      for (const Task& t : g) {
        if (!seen.insert(t).second) {
          diags_.error(p.loc, fmt::format("{}({}, {}) appears twice in one order", task_kind_name(t.kind), t.stage,
                                          t.microbatch));
          return false;
        }
        if (t.kind == TaskKind::Fwd) continue;
        // A microbatch's backward on a stage is whole (bwd) or split in two (zero-bubble), never both.
        bool split = t.kind != TaskKind::Bwd;
        auto key = std::make_pair(t.stage, t.microbatch);
        auto [it, fresh] = backward_form_.emplace(key, std::make_pair(split, p.loc));
        if (!fresh && it->second.first != split) {
          diags_.error(p.loc, fmt::format("stage {} microbatch {} uses {} here but {} elsewhere; its backward is "
                                          "either whole (bwd) or split (bwd_input + bwd_weight)",
                                          t.stage, t.microbatch, split ? "bwd_input/bwd_weight" : "bwd",
                                          split ? "bwd" : "bwd_input/bwd_weight"))
              .note(it->second.second, "the other form is used here");
          return false;
        }
      }
    return true;
  }

  const Manifest& m_;
  const CheckOptions& opt_;
  SourceManager& sources_;
  DiagnosticEngine& diags_;
  FileId top_ = 0;
  CheckedStrategy out_;
  std::map<std::string, SourceLoc> streams_;
  std::map<std::string, SourceLoc> declared_params_;
  std::set<std::string> used_overrides_;
  std::set<std::string> used_axes_;
  std::map<std::string, SourceLoc> replicate_axes_, shard_axes_;
  std::map<RegionId, Placed> placed_;
  std::map<std::pair<int64_t, int64_t>, std::pair<bool, SourceLoc>> backward_form_;
  std::vector<PendingOrder> pending_;
  std::vector<size_t> pending_slots_;
  std::vector<std::optional<size_t>> sequences_;  // per open `sequence` block: its latest order
  std::vector<std::string> stack_;
  std::map<std::string, const ast::File*> parsed_;
  std::vector<std::unique_ptr<ast::File>> owned_;
  SourceLoc first_mesh_, first_place_, split_loc_, first_stmt_;
  size_t place_count_ = 0;
  int64_t steps_ = 0;
  bool budget_reported_ = false;
};

}  // namespace

std::optional<CheckedStrategy> check_strategy(FileId file, const Manifest& manifest, const CheckOptions& options,
                                              SourceManager& sources, DiagnosticEngine& diags) {
  return Checker(manifest, options, sources, diags).run(file);
}

}  // namespace piper
