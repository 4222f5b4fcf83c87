// The directives: place, replicate, shard, split, order, recompute, precision as checked records.
#include "lang/checker_impl.h"

namespace piper::check {

std::optional<std::string> Checker::check_axis(const ast::AxisRef& a, const Env& env) {
  auto it = std::find_if(axes_.begin(), axes_.end(), [&](auto& x) { return x.name == a.name; });
  if (it == axes_.end()) {
    std::vector<std::string> names;
    for (auto& x : axes_) names.push_back(x.name);
    auto& d = diags_.error(a.loc, fmt::format("unknown mesh axis '{}'{}", a.name, did_you_mean(a.name, names)));
    if (names.empty()) d.note(SourceLoc{}, fmt::format("declare the mesh first, e.g. `mesh {} = 2;`", a.name));
    else d.note(axes_.front().loc, fmt::format("the mesh so far has: {}", fmt::join(names, ", ")));
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

void Checker::stmt(const ast::PlaceStmt& p, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto sel = resolve_all(p.regions, env);
  if (!sel) return;
  auto regions = to_pipeline(*sel, p.regions.front());
  if (!regions) return;
  auto stream = check_stream(p.stream, env);
  if (!stream) return;
  PlaceDirective d;
  d.regions = *regions;
  d.stream = *stream;
  if (!(p.mode == ast::PlaceStmt::Mode::On ? place_on(p, env, d) : place_over(p, env, d))) return;
  if (!out_.pipeline_axis.empty() && out_.pipeline_axis != d.axis) {
    diags_.error(s.loc, fmt::format("all regions are placed over one pipeline axis; this uses '{}' but "
                                    "earlier placement used '{}'", d.axis, out_.pipeline_axis))
        .note(first_place_, "first placed here");
    return;
  }
  out_.pipeline_axis = d.axis;
  if (!first_place_.valid()) first_place_ = s.loc;
  record_placement(p, s, std::move(d));
}

// `place ... on pp = k`: one coordinate of the pipeline axis.
bool Checker::place_on(const ast::PlaceStmt& p, Env& env, PlaceDirective& d) {
  if (p.coords.size() != 1) {
    diags_.error(p.coords[1].loc, "place on one axis only (the pipeline axis); spread over other axes with "
                                  "replicate or shard");
    return false;
  }
  const ast::Binding& c = p.coords[0];
  if (!check_axis(ast::AxisRef{c.name, nullptr, c.loc}, env)) return false;
  auto coord = eval_int(*c.value, env, "a mesh coordinate");
  if (!coord) return false;
  int64_t n = axis_size(c.name);
  if (*coord < 0 || *coord >= n) {
    diags_.error(c.value->loc, fmt::format("coordinate {} is outside axis '{}' (0..{})", *coord, c.name, n - 1));
    return false;
  }
  d.mode = PlaceDirective::Mode::On;
  d.axis = c.name;
  d.coord = *coord;
  return true;
}

// `place ... over pp [interleaved(v) | vshape | balanced]`: the regions cut into stages, evenly
// unless balanced (then cut by cost once every placement is known).
bool Checker::place_over(const ast::PlaceStmt& p, Env& env, PlaceDirective& d) {
  using M = ast::PlaceStmt::Mode;
  auto axis = check_axis(p.axis, env);
  if (!axis) return false;
  d.axis = *axis;
  int64_t n = axis_size(d.axis);
  int64_t groups = n;
  d.mode = p.mode == M::Contiguous ? PlaceDirective::Mode::Contiguous
         : p.mode == M::VShape     ? PlaceDirective::Mode::VShape
         : p.mode == M::Balanced   ? PlaceDirective::Mode::Balanced
                                   : PlaceDirective::Mode::Interleaved;
  if (p.mode == M::Interleaved) {
    auto v = eval_int(*p.chunks, env, "interleaved()");
    if (!v) return false;
    if (*v < 1) {
      diags_.error(p.chunks->loc, fmt::format("interleaved({}) needs at least 1 chunk per rank", *v));
      return false;
    }
    d.chunks = *v;
    if (__builtin_mul_overflow(n, *v, &groups) || groups > static_cast<int64_t>(d.regions.size())) {
      diags_.error(p.chunks->loc, fmt::format("interleaved({}) over {}={} asks for more stages than the {} regions "
                                              "selected",
                                              *v, d.axis, n, d.regions.size()));
      return false;
    }
  } else if (p.mode == M::VShape) {
    groups = 2 * n;
  }
  d.balanced = p.balanced;
  int64_t count = static_cast<int64_t>(d.regions.size());
  if (p.mode == M::Balanced || p.balanced) {
    if (count < groups) {
      diags_.error(p.regions.front().loc, fmt::format("{} regions cannot be balanced over {} stages ({}={}): every stage "
                                                      "needs at least one",
                                                      count, groups, d.axis, n))
          .note(SourceLoc{}, fmt::format("selected: {}", print_regions(d.regions, m_)));
      return false;
    }
  } else if (count % groups != 0) {
    diags_.error(p.regions.front().loc,
                 fmt::format("{} regions cannot be cut evenly into {} stages ({} over {}={}{})", count, groups,
                             p.mode == M::VShape ? "V-shape: 2 per rank" : p.mode == M::Interleaved ? "interleaved" : "contiguous",
                             d.axis, n, p.mode == M::Interleaved ? fmt::format(" × {} chunks", d.chunks) : ""))
        .note(SourceLoc{}, fmt::format("selected: {}", print_regions(d.regions, m_)));
    return false;
  }
  return true;
}

// Each region's coordinate (and its group, which keeps an `over` placement's stages apart).
// Each region placed once; where it goes is decided from the recorded directives (lang/placement.h).
void Checker::record_placement(const ast::PlaceStmt& p, const ast::Stmt& s, PlaceDirective d) {
  ++place_count_;
  for (RegionId r : d.regions) {
    if (auto it = placed_.find(r); it != placed_.end()) {
      diags_.error(p.regions.front().loc, fmt::format("region '{}' is placed twice", m_.selector_text(r)))
          .note(it->second, "first placed here");
      return;
    }
    placed_[r] = s.loc;
  }
  out_.directives.push_back(Directive{s.loc, std::move(d), diags_.context()});
}

void Checker::stmt(const ast::ReplicateStmt& r, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto sel = resolve_all(r.regions, env);
  if (!sel) return;
  auto axis = check_axis(r.axis, env);
  if (!axis) return;
  auto stream = check_stream(r.stream, env);
  if (!stream) return;
  ReplicateDirective d;
  d.regions = *sel;
  d.axis = *axis;
  d.stream = *stream;
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
  if (!r.unit.empty() || r.prefetch) {
    const SourceLoc at = !r.unit.empty() ? r.unit.front().loc : r.prefetch->loc;
    if (d.zero != 3) {
      diags_.error(at, fmt::format("{} applies to ZeRO-3, which gathers parameters unit by unit; this replicates with "
                                   "zero {}",
                                   !r.unit.empty() ? "unit" : "prefetch", d.zero))
          .note(SourceLoc{}, "write `zero 3` to shard the parameters too");
      return;
    }
  }
  if (!r.unit.empty()) {
    auto units = resolve_all(r.unit, env);
    if (!units) return;
    // A unit is one or more whole pipeline regions: each is gathered for a piece of its stage.
    for (RegionId u : *units) {
      if (u == 0 || std::find(m_.sequence.begin(), m_.sequence.end(), u) != m_.sequence.end()) continue;
      RegionId within = -1;
      for (RegionId q : m_.sequence)
        if (m_.is_ancestor(q, u)) within = q;
      if (within >= 0) {
        diags_.error(r.unit.front().loc, fmt::format("a unit is one or more whole pipeline regions; '{}' is inside '{}'",
                                                     m_.selector_text(u), m_.selector_text(within)))
            .note(SourceLoc{}, fmt::format("select '{}' itself (each selected pipeline region is a unit)",
                                           m_.selector_text(within)));
        return;
      }
      // A group of pipeline regions (`layers`): each member is a unit.
      for (RegionId q : m_.sequence)
        if (m_.is_ancestor(u, q)) d.units.push_back(q);
    }
    for (RegionId u : *units)
      if (u == 0 || std::find(m_.sequence.begin(), m_.sequence.end(), u) != m_.sequence.end()) d.units.push_back(u);
    std::sort(d.units.begin(), d.units.end());
    d.units.erase(std::unique(d.units.begin(), d.units.end()), d.units.end());
  }
  if (r.prefetch) {
    auto p = eval_int(*r.prefetch, env, "prefetch");
    if (!p) return;
    if (*p < 0 || *p > 16) {
      diags_.error(r.prefetch->loc, fmt::format("prefetch {} is out of range: gather 0 to 16 units ahead", *p));
      return;
    }
    d.prefetch = *p;
  }
  replicate_axes_.emplace(*axis, s.loc);
  out_.directives.push_back(Directive{s.loc, std::move(d), diags_.context()});
}

void Checker::stmt(const ast::ShardStmt& sh, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto sel = resolve_all(sh.regions, env);
  if (!sel) return;
  auto axis = check_axis(sh.axis, env);
  if (!axis) return;
  if (sh.exchange) return context_shard(sh, s, *sel, *axis);
  // A shard of a list spreads its members (experts); of a region with a tp layout, its tensors.
  if (sh.dim || sh.sequence || std::none_of(sel->begin(), sel->end(), [&](RegionId r) { return m_.is_list(r); }))
    return tensor_shard(sh, s, *sel, *axis);
  auto stream = check_stream(sh.stream, env);
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

// `shard layers[*].attn over tp heads;`: tensor parallelism over a model axis, as the regions' tp
// layouts in the manifest say.
// A tied parameter is laid out whole wherever it is held and its copies' gradients are summed
// element by element (ir/tie.cpp): one that the region's layout would slice cannot be tied.
bool Checker::tied_slice_ok(RegionId r, SourceLoc at, const std::string& axis) {
  for (const Tie& t : m_.ties)
    for (const TiedParam& p : t.members) {
      if (!m_.is_ancestor(r, p.region)) continue;
      const ParamSpec& spec = m_.regions[static_cast<size_t>(p.region)].params[static_cast<size_t>(p.index)];
      if (!spec.sharded()) continue;
      const TiedParam& other = t.members.front() == p ? t.members.back() : t.members.front();
      diags_.error(at, fmt::format("cannot shard '{}' over {}: its parameter '{}.{}' is tied to '{}.{}', and a tied "
                                   "parameter is kept whole", m_.selector_text(r), axis, m_.selector_text(p.region), spec.name,
                                   m_.selector_text(other.region),
                                   m_.regions[static_cast<size_t>(other.region)].params[static_cast<size_t>(other.index)].name))
          .note(SourceLoc{}, "untie them in the model, or leave this region unsharded");
      return false;
    }
  return true;
}

void Checker::tensor_shard(const ast::ShardStmt& sh, const ast::Stmt& s, const std::vector<RegionId>& sel,
                           const std::string& axis) {
  const SourceLoc at = sh.regions.front().loc;
  if (sh.stream) {
    diags_.error(sh.stream->loc, "a tensor shard's collectives run inside its regions, on their compute stream")
        .note(SourceLoc{}, "drop `on stream`: naming a stream for them is not supported yet");
    return;
  }
  const int64_t n = axis_size(axis);
  for (RegionId r : sel) {
    const Region& reg = m_.regions[static_cast<size_t>(r)];
    if (!reg.tp) {
      std::vector<std::string> with;
      for (size_t q = 0; q < m_.regions.size() && with.size() < 3; ++q)
        if (m_.regions[q].tp) with.push_back(fmt::format("{} ({})", m_.selector_text(RegionId(q)), m_.regions[q].kind));
      auto& d = diags_.error(at, fmt::format("cannot shard '{}' over {}: it has no tensor-parallel layout in the manifest",
                                             m_.selector_text(r), axis));
      if (with.empty())
        d.note(SourceLoc{}, "the manifest declares none (a region's `tp` field and its parameters' `shard`, docs/manifest.md)");
      else
        d.note(SourceLoc{}, fmt::format("regions with one: {}{}", fmt::join(with, ", "), with.size() == 3 ? ", ..." : ""));
      d.note(SourceLoc{}, "or shard a list region (such as layers[*].moe.experts) to spread its members over the axis");
      return;
    }
    if (sh.dim && sh.dim->first != reg.tp->dim) {
      diags_.error(sh.dim->second, fmt::format("'{}' splits by {}, not by '{}'", m_.selector_text(r), reg.tp->dim,
                                               sh.dim->first));
      return;
    }
    if (reg.tp->count % n != 0) {
      diags_.error(at, fmt::format("'{}' has {} {}, which do not divide evenly over {}={}", m_.selector_text(r),
                                   reg.tp->count, reg.tp->dim, axis, n));
      return;
    }
    if (!tied_slice_ok(r, at, axis)) return;
    // Sequence parallelism cuts each sample's tokens over the axis (activations lead with the sequence).
    if (const auto& in = reg.input; sh.sequence && in && !in->shape.empty() && in->shape[0] % n != 0) {
      diags_.error(*sh.sequence, fmt::format("'{}' has a sequence of {}, which does not divide evenly over {}={} for "
                                             "sequence parallelism",
                                             m_.selector_text(r), in->shape[0], axis, n));
      return;
    }
    if (auto [it, fresh] = tensor_sharded_.emplace(r, s.loc); !fresh) {
      diags_.error(at, fmt::format("'{}' is sharded over a tensor-parallel axis twice", m_.selector_text(r)))
          .note(it->second, "first sharded here");
      return;
    }
  }
  if (!claim_model_axis(tensor_axes_, axis, sh.axis.loc, s.loc, "one tensor-parallel axis per strategy: regions are "
                                                                 "already sharded over '{}'", "sharded over it here"))
    return;
  out_.directives.push_back(
      Directive{s.loc,
                TensorShardDirective{sel, axis, sel.empty() ? "" : m_.regions[static_cast<size_t>(sel.front())].tp->dim,
                                     sh.sequence.has_value()},
                diags_.context()});
}

void Checker::stmt(const ast::SplitStmt& sp, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto n = eval_int(*sp.microbatches, env, "split");
  if (!n) return;
  if (*n < 1) {
    diags_.error(sp.microbatches->loc, fmt::format("cannot split the batch into {} microbatches", *n));
    return;
  }
  if (*n > kMaxMicrobatches) {  // the DAG has tasks per microbatch and stage: beyond this, no answer in time
    diags_.error(sp.microbatches->loc,
                 fmt::format("cannot split the batch into {} microbatches: the limit is {}", *n, kMaxMicrobatches));
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

void Checker::stmt(const ast::MirrorStmt& mi, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto axis = check_axis(mi.axis, env);
  if (!axis) return;
  if (mirror_loc_.valid()) {
    diags_.error(s.loc, "the pipeline is mirrored twice").note(mirror_loc_, "first mirrored here");
    return;
  }
  mirror_loc_ = s.loc;
  mirror_axis_loc_ = mi.axis.loc;
  out_.directives.push_back(Directive{s.loc, MirrorDirective{*axis}, diags_.context()});
}

namespace {
void names_in(const ast::Expr& e, bool whole, std::vector<std::string>& names, std::vector<const ast::Expr*>& nested) {
  if (e.kind == ast::Expr::Kind::Name) {
    names.push_back(e.name);
    if (!whole) nested.push_back(&e);
  }
  if (e.lhs) names_in(*e.lhs, false, names, nested);
  if (e.rhs) names_in(*e.rhs, false, names, nested);
  for (const auto& a : e.args) {
    if (a.expr) names_in(*a.expr, false, names, nested);
    if (a.selector)
      for (const auto& part : a.selector->parts) {
        if (part.lo) names_in(*part.lo, false, names, nested);
        if (part.hi) names_in(*part.hi, false, names, nested);
      }
  }
}
}  // namespace

void Checker::stmt(const ast::OrderStmt& o, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto stream = check_stream(o.stream, env);
  if (!stream) return;
  if (orders_run_++ >= kMaxOrderStatements) {
    if (!budget_reported_) {
      diags_.error(s.loc, fmt::format("more than {} order statements run: a plan within the limits ({} stage × "
                                      "microbatch tasks) needs far fewer; is a loop bound much too large?",
                                      kMaxOrderStatements, kMaxStageMicrobatches));
      budget_reported_ = true;
    }
    steps_ = opt_.max_steps;  // every loop stops here, as at the evaluation budget
    return;
  }
  // An instance keeps the values of the bound names its tasks mention: small records for the
  // thousands of instances a loop makes. An unbound name is quantified when it is a whole task
  // argument somewhere in the statement (`fwd(s, i) -> fwd(s, i + 1)`); anywhere else it is unknown,
  // reported here once with the names in scope to suggest from.
  auto [it, fresh] = order_names_.emplace(&o, OrderNames{});
  OrderNames& on = it->second;
  if (fresh) {
    for (const auto& group : o.chain)
      for (const auto& t : group)
        for (const auto& a : t.args) names_in(*a, true, on.names, on.nested);
    std::sort(on.names.begin(), on.names.end());
    on.names.erase(std::unique(on.names.begin(), on.names.end()), on.names.end());
    // A name that is a whole argument somewhere may be quantified: only the others need a binding.
    std::erase_if(on.nested, [&](const ast::Expr* e) {
      if (e->name == "world") return true;  // bound by --np, checked where it is evaluated
      for (const auto& group : o.chain)
        for (const auto& t : group)
          for (const auto& a : t.args)
            if (a->kind == ast::Expr::Kind::Name && a->name == e->name) return true;
      return false;
    });
  }
  std::vector<Var> values(on.names.size(), Var{Value{}, SourceLoc{}, nullptr});
  for (size_t i = 0; i < on.names.size(); ++i)
    if (const Var* v = env.find(on.names[i])) values[i] = *v;
  for (const ast::Expr* e : on.nested) {
    const size_t i = std::lower_bound(on.names.begin(), on.names.end(), e->name) - on.names.begin();
    if (values[i].what) continue;
    if (!on.reported) (void)lookup(*e, env);  // the unknown-name error, with suggestions
    on.reported = true;
    return;
  }
  // With an error already reported, no order is expanded (the plan is not lowered): run, not kept.
  if (diags_.has_errors()) return;
  // Orders run in one `use` share its context: one copy, not one per instance.
  const auto& ctx = diags_.context();
  auto same = [&](const std::vector<Note>& a) {
    return a.size() == ctx.size() && std::equal(a.begin(), a.end(), ctx.begin(), [](const Note& x, const Note& y) {
             return x.loc == y.loc && x.message == y.message;
           });
  };
  if (!order_context_ || !same(*order_context_)) order_context_ = std::make_shared<const std::vector<Note>>(ctx);
  // Tasks name stages, which exist only once every place has run: expand at the end, in front of
  // the directive that follows this statement.
  PendingOrder p{&o, s.loc, &on.names, std::move(values), order_context_, out_.directives.size(), *stream, std::nullopt,
                 std::nullopt};
  if (!sequences_.empty()) {
    p.in_sequence = true;
    p.prev = sequences_.back();
    sequences_.back() = pending_.size();
  }
  pending_.push_back(std::move(p));
}

void Checker::stmt(const ast::RecomputeStmt& r, const ast::Stmt& s, Env& env, UseContext&, FileId) {
  auto sel = resolve_all(r.regions, env);
  if (!sel) return;
  out_.directives.push_back(Directive{s.loc, RecomputeDirective{*sel}, diags_.context()});
}

void Checker::stmt(const ast::PrecisionStmt& p, const ast::Stmt& s, Env& env, UseContext&, FileId) {
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

// Makes `axis` the strategy's one axis of its kind (`uses`: tensor or context parallelism) and a
// model axis (its ranks read the same samples); false, with an error at `at`, if another has it.
bool Checker::claim_model_axis(std::map<std::string, SourceLoc>& uses, const std::string& axis, SourceLoc at, SourceLoc stmt,
                               const char* message, const char* note) {
  if (!uses.empty() && !uses.count(axis)) {
    diags_.error(at, fmt::format(fmt::runtime(message), uses.begin()->first)).note(uses.begin()->second, note);
    return false;
  }
  uses.emplace(axis, stmt);
  for (MeshAxis& a : axes_)
    if (a.name == axis) a.model = true;
  return true;
}

}  // namespace piper::check
