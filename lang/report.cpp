#include "lang/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "lang/units.h"

namespace piper {

std::string strategy_report(const CheckedStrategy& s, const Manifest& m) {
  std::string out;
  std::vector<std::string> axes;
  for (const auto& a : s.mesh.axes()) axes.push_back(fmt::format("{}={}", a.name, a.size));
  out += fmt::format("  model      {} ({} regions, {} parameters, {})\n",
                     m.model_name.empty() ? "(unnamed)" : m.model_name, m.regions.size() - 1,
                     m.unique_param_count({0}), human_bytes(double(m.unique_param_bytes({0}))));
  out += fmt::format("  world      {} rank{}, mesh {}\n", s.mesh.world(), s.mesh.world() == 1 ? "" : "s",
                     axes.empty() ? "(none: one device)" : fmt::format("{}", fmt::join(axes, " × ")));
  if (!s.params.empty()) {
    std::vector<std::string> ps;
    for (const auto& [n, v] : s.params) ps.push_back(fmt::format("{}={}", n, v));
    out += fmt::format("  params     {}\n", fmt::join(ps, " "));
  }
  out += fmt::format("  split      {} microbatch{}\n", s.microbatches, s.microbatches == 1 ? "" : "es");
  out += fmt::format("  stages     {}{}\n", s.stages.size(),
                     s.pipeline_axis.empty() ? "" : fmt::format(" over {}", s.pipeline_axis));
  for (size_t i = 0; i < s.stages.size(); ++i) {
    const Stage& st = s.stages[i];
    const int64_t bytes = m.unique_param_bytes(st.regions);
    const std::string copy = s.mirror_from() >= 0 ? fmt::format(", its copy at {}={}", s.pipeline_axis,
                                                                  s.task_coord(static_cast<int64_t>(i), s.mirror_from()))
                                                  : "";
    out += fmt::format("    {:>3}  {}={} chunk {}{}  {}  ({})\n", i, s.pipeline_axis.empty() ? "rank" : s.pipeline_axis,
                       st.coord, st.chunk, copy, print_regions(st.regions, m), human_bytes(double(bytes)));
  }
  std::map<std::string, int> counts;
  for (const auto& d : s.directives)
    counts[std::visit([](const auto& x) -> std::string {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, PlaceDirective>) return "place";
      else if constexpr (std::is_same_v<T, ReplicateDirective>) return "replicate";
      else if constexpr (std::is_same_v<T, ShardDirective>) return "shard";
      else if constexpr (std::is_same_v<T, TensorShardDirective>) return "tensor shard";
      else if constexpr (std::is_same_v<T, ContextShardDirective>) return "context shard";
      else if constexpr (std::is_same_v<T, SplitDirective>) return "split";
      else if constexpr (std::is_same_v<T, MirrorDirective>) return "mirror";
      else if constexpr (std::is_same_v<T, OrderDirective>) return "order";
      else if constexpr (std::is_same_v<T, RecomputeDirective>) return "recompute";
      else if constexpr (std::is_same_v<T, PrecisionDirective>) return "precision";
      else static_assert(unhandled<T>, "the report does not count this directive");
    }, d.body)]++;
  std::vector<std::string> cs;
  for (const auto& [k, n] : counts) cs.push_back(fmt::format("{} {}", n, k));
  out += fmt::format("  directives {}\n", cs.empty() ? "none" : fmt::format("{}", fmt::join(cs, ", ")));
  for (const auto& d : s.directives) {
    if (const auto* r = std::get_if<ReplicateDirective>(&d.body))
      out += fmt::format("    replicate {} over {}={}{}{}\n", print_regions(r->regions, m), r->axis,
                         s.axis_size(r->axis), r->zero ? fmt::format(", ZeRO-{}", r->zero) : ", plain all-reduce",
                         r->bucket_bytes ? ", buckets of " + human_bytes(double(r->bucket_bytes)) : "");
    if (const auto* sh = std::get_if<ShardDirective>(&d.body))
      out += fmt::format("    shard {} over {}={}\n", print_regions(sh->regions, m), sh->axis, s.axis_size(sh->axis));
    if (const auto* t = std::get_if<TensorShardDirective>(&d.body))
      out += fmt::format("    shard {} over {}={} by {} (tensor parallel)\n", print_regions(t->regions, m), t->axis,
                         s.axis_size(t->axis), t->dim);
    if (const auto* c = std::get_if<ContextShardDirective>(&d.body))
      out += fmt::format("    shard {} over {}={} by the sequence, {} attention (context parallel)\n",
                         print_regions(c->regions, m), c->axis, s.axis_size(c->axis), c->exchange);
  }
  return out;
}

}  // namespace piper
