#include "lang/domain.h"

#include <fmt/format.h>

namespace piper {

namespace {
struct Constant {
  int64_t value = 0;
  bool boolean = false;
};

// Constants only: a name other than `world` is an error, so the tuner and the checker agree.
struct ConstantEval {
  int64_t world;
  std::string error;
  SourceLoc where;

  std::optional<Constant> fail(const ast::Expr& e, std::string why) {
    if (error.empty()) error = std::move(why), where = e.loc;
    return std::nullopt;
  }

  std::optional<Constant> eval(const ast::Expr& e) {
    using K = ast::Expr::Kind;
    switch (e.kind) {
      case K::Int: return Constant{e.int_value, false};
      case K::Bool: return Constant{e.bool_value ? 1 : 0, true};
      case K::Name:
        if (e.name == "world") return Constant{world, false};
        return fail(e, fmt::format("a parameter's values are constants: '{}' has no value yet (use literals and 'world')", e.name));
      case K::Unary: {
        auto v = eval(*e.lhs);
        if (!v) return v;
        if (e.name == "not" && v->boolean) return Constant{!v->value, true};
        if (e.name == "-" && !v->boolean && v->value != INT64_MIN) return Constant{-v->value, false};
        return fail(e, fmt::format("'{}' cannot apply to this value", e.name));
      }
      case K::Binary: return binary(e);
      case K::Call: return fail(e, fmt::format("'{}(...)' is not allowed in a parameter's values", e.name));
    }
    return fail(e, "not a constant");
  }

  std::optional<Constant> binary(const ast::Expr& e) {
    auto a = eval(*e.lhs), b = eval(*e.rhs);
    if (!a || !b) return std::nullopt;
    if (a->boolean || b->boolean) return fail(e, fmt::format("'{}' needs integers in a parameter's values", e.name));
    int64_t r = 0;
    bool overflow = false;
    if (e.name == "+") overflow = __builtin_add_overflow(a->value, b->value, &r);
    else if (e.name == "-") overflow = __builtin_sub_overflow(a->value, b->value, &r);
    else if (e.name == "*") overflow = __builtin_mul_overflow(a->value, b->value, &r);
    else if (e.name == "/" || e.name == "%") {
      if (b->value == 0) return fail(e, "division by zero");
      if (a->value == INT64_MIN && b->value == -1) return fail(e, "integer overflow");
      r = e.name == "/" ? a->value / b->value : a->value % b->value;
    } else {
      return fail(e, fmt::format("'{}' is not allowed in a parameter's values", e.name));
    }
    if (overflow) return fail(e, "integer overflow");
    return Constant{r, false};
  }
};

constexpr int64_t kMaxDivisorsOf = 1 << 20;  // divisors are found by trial: keep it instant
}  // namespace

DomainValues eval_domain(const ast::ParamDomain& d, int64_t world) {
  DomainValues out;
  ConstantEval ev{world, {}, {}};
  auto failed = [&] {
    out.values.clear();
    out.error = ev.error;
    out.error_loc = ev.where;
    return out;
  };
  if (d.function.empty()) {
    for (size_t i = 0; i < d.values.size(); ++i) {
      auto v = ev.eval(*d.values[i]);
      if (!v) return failed();
      if (i > 0 && v->boolean != out.boolean) {
        ev.fail(*d.values[i], "a parameter's values are all integers or all booleans");
        return failed();
      }
      out.boolean = v->boolean;
      for (int64_t seen : out.values)
        if (seen == v->value) {
          ev.fail(*d.values[i], "this value is listed twice");
          return failed();
        }
      out.values.push_back(v->value);
    }
    return out;
  }
  if (d.function != "divisors") {
    out.error = fmt::format("unknown domain '{}(...)': a parameter's values are a list {{a, b, ...}} or divisors(N)", d.function);
    out.error_loc = d.loc;
    return out;
  }
  auto n = ev.eval(*d.values[0]);
  if (!n) return failed();
  if (n->boolean || n->value < 1 || n->value > kMaxDivisorsOf) {
    ev.fail(*d.values[0], fmt::format("divisors(N) needs an integer N from 1 to {}", kMaxDivisorsOf));
    return failed();
  }
  for (int64_t i = 1; i <= n->value; ++i)
    if (n->value % i == 0) out.values.push_back(i);
  return out;
}

}  // namespace piper
