// The statements that bind names and steer evaluation: param, let, mesh, stream, assert, if, for, sequence.
#include <charconv>

#include "lang/checker_impl.h"
#include "lang/domain.h"

namespace piper::check {

void Checker::run_file(const ast::File& file, UseContext& use) {
  Env env;
  run_block(file.stmts, env, use, file.id);
}

void Checker::run_block(const ast::Block& block, Env& env, UseContext& use, FileId file) {
  for (const auto& s : block) {
    if (file == top_ && !first_stmt_.valid()) first_stmt_ = s->loc;
    if (!step(s->loc)) return;
    run_stmt(*s, env, use, file);
  }
}

bool Checker::declare(Env& env, const std::string& name, Value v, SourceLoc loc, const char* what) {
  if (name == "world") {  // would silently shadow the number of ranks every other use means
    diags_.error(loc, "'world' is built in (the number of ranks: --np or mpirun) and cannot be redefined");
    return false;
  }
  if (const Var* old = env.find(name)) {
    diags_.error(loc, fmt::format("'{}' is already defined", name)).note(old->decl, fmt::format("{} '{}' defined here", old->what, name));
    return false;
  }
  env.frames.back()[name] = Var{v, loc, what};
  return true;
}

SourceLoc Checker::name_loc(SourceLoc stmt, const std::string& keyword, const std::string& name) {
  // `param NAME`: point at the name, just after the keyword and a space (good enough for carets).
  SourceLoc l = stmt;
  std::string_view line = sources_.line(stmt.file, stmt.line);
  size_t at = line.find(name, stmt.col - 1 + keyword.size());
  if (at != std::string_view::npos) l.col = static_cast<uint32_t>(at + 1);
  l.length = static_cast<uint32_t>(name.size());
  return l;
}

std::optional<Value> Checker::parse_override(const Override& o) {
  if (o.value == "true" || o.value == "false") return Value::of_bool(o.value == "true");
  int64_t v = 0;
  auto [p, ec] = std::from_chars(o.value.data(), o.value.data() + o.value.size(), v);
  if (ec != std::errc() || p != o.value.data() + o.value.size()) {
    diags_.error(o.loc, fmt::format("--set {}: '{}' is not an integer or true/false", o.name, o.value));
    return std::nullopt;
  }
  return Value::of(v);
}

void Checker::run_stmt(const ast::Stmt& s, Env& env, UseContext& use, FileId file) {
  std::visit([&](const auto& node) { this->stmt(node, s, env, use, file); }, s.node);
}

void Checker::stmt(const ast::ParamStmt& p, const ast::Stmt& s, Env& env, UseContext& use, FileId) {
  SourceLoc loc = name_loc(s.loc, "param", p.name);
  std::optional<Value> v;
  std::optional<Value> fallback = eval(*p.value, env);  // the default is checked even when overridden
  if (!fallback) return;
  if (!p.domain.empty()) check_domain(p, *fallback);
  if (auto a = use.args.find(p.name); a != use.args.end()) {
    use.consumed.insert(p.name);
    v = a->second.first;
    bound_by_use_.emplace(p.name, a->second.second);
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
  if (std::none_of(out_.params.begin(), out_.params.end(), [&](auto& kv) { return kv.first == p.name; }))
    out_.params.emplace_back(p.name, v->text());
}

// The values piper-tune searches: constants of the default's type, the default among a list's.
// Checked as if the world were 1 when it is not known (piper-check without --np).
void Checker::check_domain(const ast::ParamStmt& p, const Value& fallback) {
  const DomainValues d = eval_domain(p.domain, opt_.world.value_or(1));
  if (!d.error.empty()) {
    diags_.error(d.error_loc, d.error);
    return;
  }
  const bool boolean = fallback.type == Value::Type::Bool;
  if (d.boolean != boolean) {
    diags_.error(p.domain.loc, fmt::format("parameter '{}' is {} but its values are {}", p.name, type_name(fallback.type),
                                           d.boolean ? "booleans" : "integers"));
    return;
  }
  const int64_t v = boolean ? fallback.b : fallback.i;
  if (p.domain.function.empty() && std::find(d.values.begin(), d.values.end(), v) == d.values.end())
    diags_.error(p.value->loc, fmt::format("the default {} is not one of the values listed for '{}'", fallback.text(), p.name))
        .note(p.domain.loc, "values listed here");
}

void Checker::stmt(const ast::LetStmt& l, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto v = eval(*l.value, env);
  if (v) declare(env, l.name, *v, name_loc(s.loc, "let", l.name), "let binding");
}

void Checker::stmt(const ast::MeshStmt& m, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  if (!first_mesh_.valid()) first_mesh_ = s.loc;
  for (const auto& a : m.axes) {
    auto size = eval_int(*a.value, env, "a mesh axis size");
    if (!size) continue;
    if (*size < 1) {
      diags_.error(a.value->loc, fmt::format("mesh axis '{}' has size {}; sizes are at least 1", a.name, *size));
      continue;
    }
    auto it = std::find_if(axes_.begin(), axes_.end(), [&](auto& x) { return x.name == a.name; });
    if (it == axes_.end()) {
      axes_.push_back(MeshAxis{a.name, *size, a.loc});
    } else if (it->size != *size) {
      // Composed files may each declare the axes they use; they must agree.
      diags_.error(a.loc, fmt::format("mesh axis '{}' is declared with size {} here but {} before", a.name, *size,
                                      it->size))
          .note(it->loc, "first declared here");
    }
  }
}

void Checker::stmt(const ast::StreamStmt& st, const ast::Stmt&, Env&, UseContext&, FileId) {
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

std::optional<std::string> Checker::check_stream(const std::optional<ast::StreamClause>& st, const Env& env) {
  if (!st) return std::string("");
  if (!streams_.count(st->name)) {
    std::vector<std::string> names;
    for (auto& [n, _] : streams_) names.push_back(n);
    diags_.error(st->loc, fmt::format("unknown stream '{}'{}", st->name, did_you_mean(st->name, names)))
        .note(SourceLoc{}, fmt::format("declare it first with `stream {};` (built in: compute, comm)", st->name));
    return std::nullopt;
  }
  if (st->sms && !check_sms(*st, env)) return std::nullopt;
  return st->name;
}

// `on stream comm sms 20`: a positive count, not on the compute stream (the model's own kernels are
// what the limit leaves room for), one count per stream. Whether the device has that many is the
// machine's to say (sched::compile_plan checks it against the machine file).
bool Checker::check_sms(const ast::StreamClause& st, const Env& env) {
  auto n = eval_int(*st.sms, env, "a multiprocessor count");
  if (!n) return false;
  if (*n < 1) {
    diags_.error(st.sms_loc, fmt::format("a stream's communication needs at least one multiprocessor, not {}", *n));
    return false;
  }
  if (st.name == "compute") {
    diags_.error(st.sms_loc, "`sms` limits a communication stream; 'compute' runs the model's own kernels")
        .note(SourceLoc{}, "name the stream that carries the collectives, e.g. `on stream comm sms 20`");
    return false;
  }
  for (const StreamSmsLimit& l : out_.stream_sms)
    if (l.stream == st.name) {
      if (l.sms == *n) return true;
      diags_.error(st.sms_loc, fmt::format("stream '{}' is limited to {} multiprocessors here but to {} before", st.name, *n, l.sms))
          .note(l.loc, "first limited here");
      return false;
    }
  out_.stream_sms.push_back(StreamSmsLimit{st.name, *n, st.sms_loc});
  return true;
}

void Checker::stmt(const ast::AssertStmt& a, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto v = eval(*a.cond, env);
  if (!v || !expect(*v, Value::Type::Bool, *a.cond, "assert")) return;
  if (!v->b) {
    SourceLoc loc = s.loc;
    loc.length = 6;
    diags_.error(loc, a.message.empty() ? "assertion failed" : "assertion failed: " + a.message);
  }
}

void Checker::stmt(const ast::IfStmt& i, const ast::Stmt&, Env& env, UseContext& use, FileId file) {
  auto v = eval(*i.cond, env);
  if (!v || !expect(*v, Value::Type::Bool, *i.cond, "'if'")) return;
  env.frames.emplace_back();
  run_block(v->b ? i.then_block : i.else_block, env, use, file);
  env.frames.pop_back();
}

void Checker::stmt(const ast::ForStmt& f, const ast::Stmt& s, Env& env, UseContext& use, FileId file) {
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

void Checker::stmt(const ast::SequenceStmt& q, const ast::Stmt&, Env& env, UseContext& use, FileId file) {
  sequences_.emplace_back();
  env.frames.emplace_back();
  run_block(q.body, env, use, file);
  env.frames.pop_back();
  sequences_.pop_back();
}

}  // namespace piper::check
