#include "lang/strategy.h"

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
std::string stream_clause(const std::string& s) { return s.empty() ? "" : " on stream " + s; }

std::string task_text(const Task& t) {
  return fmt::format("{}({}, {})", task_kind_name(t.kind), t.stage, t.microbatch);
}
}  // namespace

std::string print_strategy(const CheckedStrategy& s, const Manifest& m) {
  std::string out = fmt::format("# checked strategy: {} rank{}, {} stage{}, {} microbatch{}\n", s.mesh.world(),
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
  for (const Directive& d : s.directives) {
    std::visit(
        [&](const auto& x) {
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
            out += fmt::format("place {} {}{};\n", print_regions(x.regions, m), target, stream_clause(x.stream));
          } else if constexpr (std::is_same_v<T, ReplicateDirective>) {
            out += fmt::format("replicate {} over {}", print_regions(x.regions, m), x.axis);
            if (x.zero) out += fmt::format(" zero {}", x.zero);
            if (x.bucket_bytes) out += fmt::format(" bucket {}", x.bucket_bytes);
            if (!x.units.empty()) out += fmt::format(" unit {}", print_regions(x.units, m));
            if (x.zero == 3 && x.prefetch != 1) out += fmt::format(" prefetch {}", x.prefetch);
            out += stream_clause(x.stream) + ";\n";
          } else if constexpr (std::is_same_v<T, ShardDirective>) {
            out += fmt::format("shard {} over {}{};\n", print_regions(x.regions, m), x.axis, stream_clause(x.stream));
          } else if constexpr (std::is_same_v<T, SplitDirective>) {
            out += fmt::format("split batch into {};\n", x.microbatches);
          } else if constexpr (std::is_same_v<T, OrderDirective>) {
            std::vector<std::string> groups;
            for (const auto& g : x.chain) {
              std::vector<std::string> tasks;
              for (const Task& t : g) tasks.push_back(task_text(t));
              groups.push_back(fmt::format("{}", fmt::join(tasks, " || ")));
            }
            out += fmt::format("order {}{};\n", fmt::join(groups, " -> "), stream_clause(x.stream));
          } else if constexpr (std::is_same_v<T, RecomputeDirective>) {
            out += fmt::format("recompute {};\n", print_regions(x.regions, m));
          } else if constexpr (std::is_same_v<T, PrecisionDirective>) {
            const char* name = x.dtype == DType::BF16 ? "bf16" : "fp32";
            if (x.regions == std::vector<RegionId>{0}) out += fmt::format("precision {};\n", name);
            else out += fmt::format("precision {} for {};\n", name, print_regions(x.regions, m));
          } else {
            static_assert(unhandled<T>, "print_strategy does not print this directive");
          }
        },
        d.body);
  }
  return out;
}

}  // namespace piper
