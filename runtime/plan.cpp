#include "runtime/plan.h"

#include <fmt/format.h>

#include <sstream>

#include "ir/lower.h"

namespace piper::runtime {

namespace {
uint64_t fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

std::optional<Plan> compile_plan(const std::string& model, const std::string& strategy, const CommandLine& cmd,
                                 std::string* errors) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto fail = [&](const std::string& extra = "") -> std::optional<Plan> {
    std::ostringstream out;
    diags.print_all(out);
    *errors = out.str() + extra;
    return std::nullopt;
  };
  FrontendResult r = run_frontend(model, strategy, cmd, sources, diags);
  if (r.status == FrontendStatus::IoError) return fail(r.io_error + "\n");
  if (r.status != FrontendStatus::Ok) return fail();
  Plan p;
  p.manifest = std::move(*r.manifest);
  p.strategy = std::move(*r.strategy);
  if (cmd.batch_size) {
    int64_t pp = p.strategy.pipeline_axis.empty() ? 1 : p.strategy.axis_size(p.strategy.pipeline_axis);
    p.samples_per_microbatch = *cmd.batch_size / (p.strategy.world / pp) / p.strategy.microbatches;
  }
  ir::LowerOptions lo;
  lo.samples_per_microbatch = p.samples_per_microbatch;
  auto g = ir::lower(p.strategy, p.manifest, diags, lo);
  if (!g) return fail();
  p.dag = std::move(*g);
  sched::ScheduleOptions so;
  for (const auto& a : p.strategy.mesh) so.axis_sizes.push_back(a.size);
  auto s = sched::schedule(p.dag, sched::CostModel::unit({}), so, diags, p.strategy);
  if (!s) return fail();
  if (auto hang = sched::find_deadlock(p.dag, *s)) return fail(*hang);
  p.schedule = std::move(*s);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& c : p.schedule.classes)
    for (const auto& st : c.streams) {
      h = fnv(h, p.dag.streams[st.stream]);
      for (ir::NodeId v : st.ops) h = fnv(h, ir::token(p.dag.nodes[static_cast<size_t>(v)]) + ";");
    }
  h = fnv(h, fmt::format("world={} mb={} samples={}", p.strategy.world, p.strategy.microbatches, p.samples_per_microbatch));
  p.hash = h;
  return p;
}

}  // namespace piper::runtime
