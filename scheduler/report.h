// The plan as one self-contained HTML page (piper-check --report, piper-tune --report): the timeline
// per rank and stream, memory by category against the budget, communication per link tier, the mesh.
#pragma once
#include <cstdint>
#include <string>

#include "scheduler/plan.h"

namespace piper::sched {

struct ReportContext {
  std::string strategy, model, machine;  // as the user named them
  double budget = 0;                     // bytes per device; 0: none given
  int64_t batch = 0;                     // global samples per step; 0: not given
};

// What the page draws, as data: the page embeds it and draws from it, tests compare it with
// --emit sim-json. Classes (ranks running one program) in the order of their first rank; each with
// its fullest rank's memory, its streams' ops as [start, duration, op, token, microbatch, stage, overlap group],
// its memory over the step, and its communication per (tier, axis, op).
std::string report_json(const Plan& plan, const ReportContext& ctx);

// The page: report_page.html with the data inside; nothing fetched from anywhere.
std::string emit_report_html(const Plan& plan, const ReportContext& ctx);

}  // namespace piper::sched
