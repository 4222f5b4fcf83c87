// Evaluation of the strategy language's expressions: integers (overflow-checked), booleans, calls.
#include "lang/checker_impl.h"

namespace piper::check {

bool Checker::step(SourceLoc loc) {
  if (++steps_ <= opt_.max_steps) return true;
  if (!budget_reported_) {
    budget_reported_ = true;
    diags_.error(loc, fmt::format("strategy evaluation exceeded {} steps; is a loop bound much too large?",
                                  opt_.max_steps));
  }
  return false;
}

std::optional<Value> Checker::lookup(const ast::Expr& e, const Env& env) {
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

std::optional<Value> Checker::eval(const ast::Expr& e, const Env& env) {
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

std::optional<Value> Checker::overflow(const ast::Expr& e) {
  diags_.error(e.loc, "integer overflow");
  return std::nullopt;
}

bool Checker::expect(const Value& v, Value::Type t, const ast::Expr& where, const std::string& context) {
  if (v.type == t) return true;
  diags_.error(where.loc, fmt::format("{} needs {} here, but this is {}", context, type_name(t), type_name(v.type)));
  return false;
}

std::optional<Value> Checker::binary(const ast::Expr& e, const Env& env) {
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
    // The one quotient that does not fit; its floored remainder, 0, does.
    if (a == INT64_MIN && b == -1) return op == "%" ? Value::of(0) : overflow(e);
    // Floor semantics, so `(i - 1) % pp` stays in 0..pp-1 for negative i.
    int64_t q = a / b, rem = a % b;
    if (rem != 0 && ((rem < 0) != (b < 0))) --q, rem += b;
    return Value::of(op == "/" ? q : rem);
  }
  PIPER_INTERNAL_ASSERT(false, "unknown operator " + op);
}

std::optional<Value> Checker::call(const ast::Expr& e, const Env& env) {
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

std::optional<int64_t> Checker::eval_int(const ast::Expr& e, const Env& env, const std::string& what) {
  auto v = eval(e, env);
  if (!v || !expect(*v, Value::Type::Int, e, what)) return std::nullopt;
  return v->i;
}

}  // namespace piper::check
