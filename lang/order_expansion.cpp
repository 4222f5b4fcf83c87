// `order` statements expanded over their free variables into concrete task chains, and checked.
#include "lang/checker_impl.h"

namespace piper::check {

std::optional<TaskKind> Checker::task_kind(const std::string& name) {
  if (name == "fwd") return TaskKind::Fwd;
  if (name == "bwd") return TaskKind::Bwd;
  if (name == "bwd_input") return TaskKind::BwdInput;
  if (name == "bwd_weight") return TaskKind::BwdWeight;
  return std::nullopt;
}

void Checker::finish_orders() {
  const int64_t stages = static_cast<int64_t>(out_.stages.size());
  std::vector<Directive> expanded;
  // Loops mostly run concrete orders, one instance each: reserve so that the large records are not
  // moved over and over as the vector grows.
  expanded.reserve(out_.directives.size() + pending_.size());
  size_t next = 0;  // pending_ is in source order, so its slots never decrease
  auto expand_up_to = [&](size_t slot) {
    for (; next < pending_.size() && pending_[next].slot == slot; ++next) {
      PendingOrder& p = pending_[next];
      for (const Note& n : *p.context) diags_.push_context(n.loc, n.message);
      size_t errors = diags_.error_count();
      expand(p, stages, expanded);
      p.failed = diags_.error_count() > errors;
      for (size_t k = 0; k < p.context->size(); ++k) diags_.pop_context();
    }
  };
  for (size_t i = 0; i < out_.directives.size(); ++i) {
    expand_up_to(i);
    expanded.push_back(std::move(out_.directives[i]));
  }
  expand_up_to(out_.directives.size());
  out_.directives = std::move(expanded);
}

namespace {
// One-argument tasks share an implicit stage: `fwd(i) || bwd(i-1)` pairs tasks of one stage.
const std::string kImplicitStage = "$stage";
}  // namespace

// Validates task names and arities, and finds the free (quantified) variables and their domains.
bool Checker::free_variables(const PendingOrder& p, int64_t stages, std::vector<FreeVar>& free) {
  bool one_arg = false;
  auto is_bound = [&](const std::string& n) {
    if (n == "world") return true;
    auto i = std::lower_bound(p.names->begin(), p.names->end(), n);
    return i != p.names->end() && *i == n && p.values[i - p.names->begin()].what;
  };
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
        return false;
      }
      if (t.args.empty() || t.args.size() > 2) {
        diags_.error(t.loc, fmt::format("{}() takes (stage, microbatch) or (microbatch), not {} argument{}", t.kind,
                                        t.args.size(), t.args.size() == 1 ? "" : "s"));
        return false;
      }
      if (t.args.size() == 1) one_arg = true;
      for (size_t a = 0; a < t.args.size(); ++a) {
        const ast::Expr& e = *t.args[a];
        if (e.kind != ast::Expr::Kind::Name || is_bound(e.name)) continue;
        if (std::none_of(free.begin(), free.end(), [&](auto& f) { return f.name == e.name; }))
          free.push_back({e.name, (t.args.size() == 2 && a == 0) ? stages : out_.microbatches});
      }
    }
  if (one_arg) free.push_back({kImplicitStage, stages});
  return true;
}

// One instance's chain under `env`; `keep` false when a task does not exist (dropped if the order
// is quantified, an error if not). False on an error.
bool Checker::instance(const PendingOrder& p, const Env& env, bool quantified, int64_t stages, OrderDirective& d, bool& keep,
                       std::optional<std::string>& out_of_range) {
  const int64_t mbs = out_.microbatches;
  keep = true;
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
      if (!s || !mb) return false;
      task.stage = *s;
      task.microbatch = *mb;
      if (task.stage < 0 || task.stage >= stages || task.microbatch < 0 || task.microbatch >= mbs) {
        std::string why = task.stage < 0 || task.stage >= stages
            ? fmt::format("stage {} does not exist: the strategy has {} stage{} (0..{})", task.stage, stages,
                          stages == 1 ? "" : "s", stages - 1)
            : fmt::format("microbatch {} does not exist: the batch is split into {} (0..{})", task.microbatch, mbs, mbs - 1);
        if (!quantified) {
          diags_.error(t.loc, fmt::format("{}({}, {}): {}", t.kind, task.stage, task.microbatch, why));
          return false;
        }
        if (!out_of_range) out_of_range = why;
        keep = false;
      }
      g.push_back(task);
    }
    d.chain.push_back(std::move(g));
  }
  return true;
}

void Checker::expand(PendingOrder& p, int64_t stages, std::vector<Directive>& out) {
  std::vector<FreeVar> free;
  if (!free_variables(p, stages, free)) return;
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
  // An order over free variables makes up to `combos` records: room for them at once (growing
  // geometrically still), not a doubling per few thousand.
  if (const size_t need = out.size() + static_cast<size_t>(combos); need > out.capacity())
    out.reserve(std::max(need, 2 * out.capacity()));
  Env env;
  for (size_t i = 0; i < p.names->size(); ++i)
    if (p.values[i].what) env.frames.back()[(*p.names)[i]] = p.values[i];
  env.frames.emplace_back();
  std::vector<int64_t> idx(free.size(), 0);
  size_t produced = 0;
  std::optional<std::string> out_of_range;  // why the last dropped instance was dropped
  for (int64_t c = 0; c < combos; ++c) {
    if (!step(p.loc)) return;
    for (size_t f = 0; f < free.size(); ++f) env.frames.back()[free[f].name] = Var{Value::of(idx[f]), p.loc, "order variable"};
    OrderDirective d{{}, p.stream};
    bool keep = true;
    if (!instance(p, env, !free.empty(), stages, d, keep, out_of_range)) return;
    if (keep && prev && prev->last_group) d.chain.insert(d.chain.begin(), *prev->last_group);
    if (keep && !check_instance(p, d)) return;
    if (keep) {
      p.last_group = d.chain.back();
      out.push_back(Directive{p.loc, std::move(d), *p.context});
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
  if (produced == 0 && p.context->empty()) {
    std::vector<std::string> vars;
    for (const auto& f : free)
      if (f.name != kImplicitStage) vars.push_back(f.name);
    auto& d = diags_.warning(p.loc, fmt::format("this order matches no tasks: for every value of {} some task does not exist",
                                                vars.empty() ? std::string("the stage") : fmt::format("{}", fmt::join(vars, ", "))));
    if (out_of_range) d.note(SourceLoc{}, *out_of_range);
  }
}

bool Checker::check_instance(const PendingOrder& p, const OrderDirective& d) {
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

}  // namespace piper::check
