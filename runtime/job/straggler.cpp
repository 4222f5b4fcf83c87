#include "runtime/job/straggler.h"

#include <fmt/format.h>

#include <algorithm>

#include "ir/emit.h"
#include "scheduler/plan.h"

namespace piper::runtime {

std::vector<double> planned_compute(const sched::Plan& plan, int world) {
  std::vector<double> out(static_cast<size_t>(world), 0.0);
  const sched::Schedule& s = plan.schedule;
  for (const sched::ClassProgram& c : s.classes) {
    double busy = 0;
    for (const sched::StreamProgram& st : c.streams)
      for (ir::NodeId v : st.ops)
        if (ir::is_chunk(plan.dag.nodes[static_cast<size_t>(v)].op))
          busy += s.finish[static_cast<size_t>(v)] - s.start[static_cast<size_t>(v)];
    for (int32_t r : c.ranks)
      if (r < world) out[static_cast<size_t>(r)] = busy;
  }
  return out;
}

StragglerWatch::StragglerWatch(std::vector<double> planned, HostMap hosts, double threshold, size_t window)
    : planned_(std::move(planned)), hosts_(std::move(hosts)), threshold_(threshold), window_(window),
      recent_(planned_.size()) {}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}
}  // namespace

std::string StragglerWatch::step(const std::vector<double>& compute) {
  const size_t nh = hosts_.count();
  if (nh < 2 || compute.size() != planned_.size() || hosts_.host_of.size() != planned_.size()) return "";
  // Per host, its ranks' compute over the window against the plan's for them: a sum, as a throttled
  // host slows some of its ops and not others.
  std::vector<double> measured(nh, 0.0), planned(nh, 0.0);
  std::vector<std::vector<int32_t>> ranks(nh);
  for (size_t r = 0; r < planned_.size(); ++r) {
    auto& last = recent_[r];
    last.push_back(compute[r]);
    if (last.size() > window_) last.erase(last.begin());
    const size_t h = static_cast<size_t>(hosts_.host_of[r]);
    ranks[h].push_back(static_cast<int32_t>(r));
    if (planned_[r] <= 0) continue;
    for (double c : last) measured[h] += c;
    planned[h] += planned_[r] * double(last.size());
  }
  if (recent_[0].size() < window_) return "";  // not enough steps to tell yet
  std::vector<double> slowdown(nh, 0.0);
  for (size_t h = 0; h < nh; ++h) slowdown[h] = planned[h] > 0 ? measured[h] / planned[h] : 0.0;
  const size_t worst = static_cast<size_t>(std::max_element(slowdown.begin(), slowdown.end()) - slowdown.begin());
  std::vector<double> others;
  for (size_t h = 0; h < nh; ++h)
    if (h != worst && slowdown[h] > 0) others.push_back(slowdown[h]);
  const double rest = median(others);
  // Told slow above the threshold, told back only below half of it (1.25x of 1.5x): a host near
  // the line does not flap.
  const double back = 1 + (threshold_ - 1) / 2;
  int now = rest > 0 && slowdown[worst] > threshold_ * rest ? static_cast<int>(worst) : -1;
  if (now < 0 && slow_ >= 0 && rest > 0 && slowdown[static_cast<size_t>(slow_)] > back * rest) now = slow_;
  if (now == slow_) return "";
  std::string line;
  if (now >= 0)
    line = fmt::format("straggler: host {} (ranks {}) computes {:.1f}x slower than the other hosts for the work the "
                       "plan gives it ({:.1f} ms of compute a step and rank, over the last {} steps)",
                       hosts_.names[worst], ir::rank_list(ranks[worst]), slowdown[worst] / rest,
                       measured[worst] / double(window_ * ranks[worst].size()) * 1e3, window_);
  else
    line = fmt::format("straggler: host {} keeps pace again", hosts_.names[static_cast<size_t>(slow_)]);
  slow_ = now;
  return line;
}

}  // namespace piper::runtime
