#include "lang/strategy.h"

#include "lang/parser.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

namespace piper {

const char* task_kind_name(TaskKind k) {
  switch (k) {
    case TaskKind::Fwd: return "fwd";
    case TaskKind::Bwd: return "bwd";
    case TaskKind::BwdInput: return "bwd_input";
    case TaskKind::BwdWeight: return "bwd_weight";
  }
  return "?";
}

std::string print_regions(const std::vector<RegionId>& regions, const Manifest& m) {
  // Each region as (list, index, rest): layers[3].moe.experts is (layers, 3, ".moe.experts").
  // Runs with the same list and rest over consecutive indices print as one range or [*].
  struct Key {
    RegionId list = -1;
    size_t index = 0;
    std::string rest;
  };
  auto key_of = [&](RegionId r) {
    Key k;
    std::vector<std::string> tail;
    for (RegionId cur = r; cur > 0; cur = m.regions[static_cast<size_t>(cur)].parent) {
      RegionId parent = m.regions[static_cast<size_t>(cur)].parent;
      if (parent > 0 && m.is_list(parent)) {
        const auto& ch = m.regions[static_cast<size_t>(parent)].children;
        k.list = parent;
        k.index = static_cast<size_t>(std::find(ch.begin(), ch.end(), cur) - ch.begin());
        for (auto it = tail.rbegin(); it != tail.rend(); ++it) k.rest += *it;
        return k;
      }
      const std::string& leaf = m.regions[static_cast<size_t>(cur)].leaf;
      tail.push_back(!leaf.empty() && std::isdigit(static_cast<unsigned char>(leaf[0])) ? "[" + leaf + "]" : "." + leaf);
    }
    return Key{};
  };
  std::vector<std::string> parts;
  for (size_t i = 0; i < regions.size();) {
    Key k = key_of(regions[i]);
    if (k.list < 0) {
      parts.push_back(m.selector_text(regions[i]));
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < regions.size()) {
      Key n = key_of(regions[j]);
      if (n.list != k.list || n.rest != k.rest || n.index != k.index + (j - i)) break;
      ++j;
    }
    size_t len = j - i, members = m.regions[static_cast<size_t>(k.list)].children.size();
    std::string base = m.selector_text(k.list);
    if (len == members) parts.push_back(base + "[*]" + k.rest);
    else if (len > 1) parts.push_back(fmt::format("{}[{}..{}]{}", base, k.index, k.index + len - 1, k.rest));
    else parts.push_back(m.selector_text(regions[i]));
    i = j;
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

namespace {
using SmsLimits = std::vector<StreamSmsLimit>;
// ` on stream comm sms 20`: a limited stream's count goes with every clause that names it.
std::string stream_clause(const std::string& s, const SmsLimits& sms) {
  if (s.empty()) return "";
  for (const StreamSmsLimit& l : sms)
    if (l.stream == s) return fmt::format(" on stream {} sms {}", s, l.sms);
  return " on stream " + s;
}

// `base + i * step` as Piper text, for a task argument that advances by `step` per loop iteration.
std::string progression(int64_t base, int64_t step) {
  std::string var = step == 1 || step == -1 ? "i" : fmt::format("i * {}", step < 0 ? -step : step);
  if (step == 0) return std::to_string(base);
  if (step < 0) return base == 0 ? "-" + var : fmt::format("{} - {}", base, var);
  if (base == 0) return var;
  return fmt::format("{} {} {}", var, base > 0 ? '+' : '-', base > 0 ? base : -base);
}

// An order's text with each task argument `base + i * step` (steps all 0: the instance itself).
std::string order_text(const OrderDirective& x, const OrderDirective* next, const SmsLimits& sms) {
  std::vector<std::string> groups;
  for (size_t g = 0; g < x.chain.size(); ++g) {
    std::vector<std::string> tasks;
    for (size_t t = 0; t < x.chain[g].size(); ++t) {
      const Task& a = x.chain[g][t];
      const Task* b = next ? &next->chain[g][t] : nullptr;
      tasks.push_back(fmt::format("{}({}, {})", task_kind_name(a.kind), progression(a.stage, b ? b->stage - a.stage : 0),
                                  progression(a.microbatch, b ? b->microbatch - a.microbatch : 0)));
    }
    groups.push_back(fmt::format("{}", fmt::join(tasks, " || ")));
  }
  return fmt::format("order {}{};", fmt::join(groups, " -> "), stream_clause(x.stream, sms));
}

const OrderDirective* as_order(const Directive& d) { return std::get_if<OrderDirective>(&d.body); }

// Whether order `c` continues the progression that `a` -> `b` starts: same shape, kinds and stream,
// every argument advanced by the same step again.
bool continues(const OrderDirective& a, const OrderDirective& b, const OrderDirective& c) {
  if (a.stream != c.stream || a.chain.size() != c.chain.size()) return false;
  for (size_t g = 0; g < a.chain.size(); ++g) {
    if (a.chain[g].size() != c.chain[g].size() || b.chain[g].size() != c.chain[g].size()) return false;
    for (size_t t = 0; t < a.chain[g].size(); ++t) {
      const Task &x = a.chain[g][t], &y = b.chain[g][t], &z = c.chain[g][t];
      if (x.kind != z.kind || y.kind != z.kind || z.stage - y.stage != y.stage - x.stage ||
          z.microbatch - y.microbatch != y.microbatch - x.microbatch)
        return false;
    }
  }
  return true;
}

// Orders are recorded one instance each (loops unrolled, free variables bound). Printing them so
// would make a 50,000-iteration loop megabytes of text that no longer checks (the parser's size
// limit), so a run of three or more instances in arithmetic progression prints as one loop.
size_t print_orders(const std::vector<Directive>& ds, size_t i, const SmsLimits& sms, std::string& out) {
  const OrderDirective& first = *as_order(ds[i]);
  size_t j = i + 1;
  if (j + 1 < ds.size() && as_order(ds[j]) && as_order(ds[j + 1]) && continues(first, *as_order(ds[j]), *as_order(ds[j + 1]))) {
    while (j + 1 < ds.size() && as_order(ds[j + 1]) && continues(*as_order(ds[j - 1]), *as_order(ds[j]), *as_order(ds[j + 1]))) ++j;
    out += fmt::format("for i in 0..{} {{ {} }}\n", j - i, order_text(first, as_order(ds[i + 1]), sms));
    return j + 1;
  }
  out += order_text(first, nullptr, sms) + "\n";
  return i + 1;
}

std::string directive_text(const Directive& d, const Manifest& m, const SmsLimits& sms) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, PlaceDirective>) {
          std::string target;
          switch (x.mode) {
            case PlaceDirective::Mode::On: target = fmt::format("on {} = {}", x.axis, x.coord); break;
            case PlaceDirective::Mode::Contiguous: target = fmt::format("over {}", x.axis); break;
            case PlaceDirective::Mode::Interleaved:
              target = fmt::format("over {} interleaved({}){}", x.axis, x.chunks, x.balanced ? " balanced" : "");
              break;
            case PlaceDirective::Mode::VShape: target = fmt::format("over {} vshape{}", x.axis, x.balanced ? " balanced" : ""); break;
            case PlaceDirective::Mode::Balanced: target = fmt::format("over {} balanced", x.axis); break;
          }
          return fmt::format("place {} {}{};\n", print_regions(x.regions, m), target, stream_clause(x.stream, sms));
        } else if constexpr (std::is_same_v<T, ReplicateDirective>) {
          std::string out = fmt::format("replicate {} over {}", print_regions(x.regions, m), x.axis);
          if (x.zero) out += fmt::format(" zero {}", x.zero);
          if (x.bucket_bytes) out += fmt::format(" bucket {}", x.bucket_bytes);
          if (!x.units.empty()) out += fmt::format(" unit {}", print_regions(x.units, m));
          if (x.zero == 3 && x.prefetch != 1) out += fmt::format(" prefetch {}", x.prefetch);
          return out + stream_clause(x.stream, sms) + ";\n";
        } else if constexpr (std::is_same_v<T, ShardDirective>) {
          return fmt::format("shard {} over {}{};\n", print_regions(x.regions, m), x.axis, stream_clause(x.stream, sms));
        } else if constexpr (std::is_same_v<T, TensorShardDirective>) {
          return fmt::format("shard {} over {} {}{};\n", print_regions(x.regions, m), x.axis, x.dim, x.sequence ? " sequence" : "");
        } else if constexpr (std::is_same_v<T, ContextShardDirective>) {
          return fmt::format("shard {} over {} sequence {};\n", print_regions(x.regions, m), x.axis, x.exchange);
        } else if constexpr (std::is_same_v<T, SplitDirective>) {
          return fmt::format("split batch into {};\n", x.microbatches);
        } else if constexpr (std::is_same_v<T, MirrorDirective>) {
          return fmt::format("mirror over {};\n", x.axis);
        } else if constexpr (std::is_same_v<T, OrderDirective>) {
          return order_text(x, nullptr, sms) + "\n";
        } else if constexpr (std::is_same_v<T, RecomputeDirective>) {
          return fmt::format("recompute {};\n", print_regions(x.regions, m));
        } else if constexpr (std::is_same_v<T, PrecisionDirective>) {
          const char* name = x.dtype == DType::BF16 ? "bf16" : "fp32";
          if (x.regions == std::vector<RegionId>{0}) return fmt::format("precision {};\n", name);
          return fmt::format("precision {} for {};\n", name, print_regions(x.regions, m));
        } else {
          static_assert(unhandled<T>, "print_strategy does not print this directive");
        }
      },
      d.body);
}
}  // namespace

std::string print_strategy(const CheckedStrategy& s, const Manifest& m) {
  std::string out = fmt::format("{}{} rank{}, {} stage{}, {} microbatch{}\n", kCanonicalHeader, s.mesh.world(),
                                s.mesh.world() == 1 ? "" : "s", s.stages.size(), s.stages.size() == 1 ? "" : "s",
                                s.microbatches, s.microbatches == 1 ? "" : "es");
  if (!s.params.empty()) {
    std::vector<std::string> ps;
    for (const auto& [n, v] : s.params) ps.push_back(fmt::format("{}={}", n, v));
    out += fmt::format("# params: {}\n", fmt::join(ps, " "));
  }
  if (!s.mesh.empty()) {
    std::vector<std::string> axes;
    for (const auto& a : s.mesh.axes()) axes.push_back(fmt::format("{} = {}", a.name, a.size));
    out += fmt::format("mesh {};\n", fmt::join(axes, ", "));
  }
  if (!s.streams.empty()) out += fmt::format("stream {};\n", fmt::join(s.streams, ", "));
  for (size_t i = 0; i < s.directives.size();) {
    if (as_order(s.directives[i])) {
      i = print_orders(s.directives, i, s.stream_sms, out);
    } else {
      out += directive_text(s.directives[i], m, s.stream_sms);
      ++i;
    }
  }
  return out;
}

}  // namespace piper
