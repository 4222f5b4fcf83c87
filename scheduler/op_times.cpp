// The trace is Chrome's format as piper-run writes it: complete events ("ph": "X") with a duration
// in microseconds, the stream as "tid" and the step in "args". A plan's simulation on these times
// (piper-check --op-times) keeps the machine's communication costs and replaces only the compute:
// what is left between it and the run is the schedule model's (waits, handoffs, overlap), not the
// profile's drift.
#include "scheduler/op_times.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace piper::sched {

std::map<std::string, double> op_times_from_trace(const std::string& trace_json, StepRange steps, std::string* error) {
  const nlohmann::json t = nlohmann::json::parse(trace_json, nullptr, /*allow_exceptions=*/false);
  if (t.is_discarded() || !t.is_object() || !t.contains("traceEvents") || !t["traceEvents"].is_array()) {
    *error = "not a trace: expected a JSON object with a \"traceEvents\" array (piper-run --trace)";
    return {};
  }
  std::map<std::string, std::vector<double>> seen;
  for (const auto& e : t["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("tid") || e["tid"] != "compute") continue;
    const auto args = e.find("args");
    if (args == e.end() || !args->is_object() || !args->contains("step") || !(*args)["step"].is_number_integer() ||
        !e.contains("name") || !e["name"].is_string() || !e.contains("dur") || !e["dur"].is_number())
      continue;
    if (const int step = (*args)["step"].get<int>(); step < steps.first || step > steps.last) continue;
    seen[e["name"].get<std::string>()].push_back(e["dur"].get<double>() * 1e-6);
  }
  if (seen.empty()) {
    *error = steps.last == std::numeric_limits<int>::max()
                 ? fmt::format("the trace holds no compute op at step {} or later", steps.first)
                 : fmt::format("the trace holds no compute op in steps {} to {}", steps.first, steps.last);
    return {};
  }
  std::map<std::string, double> out;
  for (auto& [name, d] : seen) {
    std::nth_element(d.begin(), d.begin() + static_cast<long>(d.size() / 2), d.end());
    out[name] = d[d.size() / 2];  // the upper median: one run's value, not an average of two
  }
  return out;
}

std::map<std::string, double> read_op_times(const std::string& path, StepRange steps, std::string* error) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    *error = "cannot read it";
    return {};
  }
  return op_times_from_trace(text.str(), steps, error);
}

std::optional<Schedule> retime(const ir::Graph& g, const Schedule& planned, const CostModel& measured,
                               DiagnosticEngine& diags) {
  // The order as edges between each stream's consecutive ops: same-stream, so they add no event
  // waits, and the list scheduler has no choice left but when each op starts.
  ir::Graph pinned = g;
  for (const ClassProgram& c : planned.classes)
    for (const StreamProgram& p : c.streams)
      for (size_t i = 1; i < p.ops.size(); ++i)
        if (p.window.empty() || p.window[i] < 0 || p.window[i] != p.window[i - 1])
          pinned.connect(p.ops[i - 1], p.ops[i], ir::EdgeKind::Temporal);
  return schedule(pinned, measured, diags);
}

}  // namespace piper::sched
