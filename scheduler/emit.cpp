#include "scheduler/emit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "ir/emit.h"
#include "lang/units.h"

namespace piper::sched {

using ir::Node;
using ir::Op;

namespace {

std::string human_time(double t, bool unit) {
  if (unit) return fmt::format("{:.2f}", t);
  if (t >= 1) return fmt::format("{:.3f} s", t);
  if (t >= 1e-3) return fmt::format("{:.2f} ms", t * 1e3);
  return fmt::format("{:.1f} us", t * 1e6);
}

bool compute(const Node& n) { return ir::is_chunk(n.op); }
}  // namespace

std::vector<size_t> class_order(const Schedule& s) {
  std::vector<size_t> order(s.classes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s.classes[a].ranks < s.classes[b].ranks; });
  return order;
}

std::string emit_schedule(const ir::Graph& g, const Schedule& s) {
  std::string out = fmt::format("# per rank and stream, the order each runs; `wait` lists events from other streams, "
                                "`after` the op a just-in-time gather waits for, `( )` a `||` window run in whichever "
                                "order its ops become ready\n");
  for (size_t c : class_order(s)) {
    const auto& cls = s.classes[c];
    out += fmt::format("rank {}\n", ir::rank_list(cls.ranks));
    for (const auto& p : cls.streams) {
      std::vector<std::string> ops;
      for (size_t i = 0; i < p.ops.size(); ++i) {
        const ir::NodeId v = p.ops[i];
        const int32_t win = i < p.window.size() ? p.window[i] : -1;
        std::string t = (win >= 0 && (i == 0 || p.window[i - 1] != win) ? "(" : "") + ir::token(g.nodes[static_cast<size_t>(v)]);
        const auto& w = s.waits[static_cast<size_t>(v)];
        if (!w.empty()) {
          std::vector<std::string> names;
          for (ir::NodeId u : w) names.push_back(ir::token(g.nodes[static_cast<size_t>(u)]));
          t += fmt::format("[wait {}]", fmt::join(names, ","));
        }
        if (static_cast<size_t>(v) < s.issue_after.size() && !s.issue_after[static_cast<size_t>(v)].empty()) {
          std::vector<std::string> names;
          for (ir::NodeId u : s.issue_after[static_cast<size_t>(v)]) names.push_back(ir::token(g.nodes[static_cast<size_t>(u)]));
          t += fmt::format("[after {}]", fmt::join(names, ","));
        }
        if (win >= 0 && (i + 1 == p.ops.size() || p.window[i + 1] != win)) t += ")";
        ops.push_back(std::move(t));
      }
      out += fmt::format("  {:<9} {}\n", g.streams[p.stream] + ":", fmt::join(ops, " "));
    }
  }
  return out;
}

std::string emit_torch_csv(const ir::Graph& g, const Schedule& s) {
  std::string out;
  for (size_t c : class_order(s)) {
    const auto& cls = s.classes[c];
    // The compute order: every chunk stream of the class, merged by simulated start.
    std::vector<ir::NodeId> ops;
    for (const auto& p : cls.streams)
      for (ir::NodeId v : p.ops)
        if (compute(g.nodes[static_cast<size_t>(v)]) && g.nodes[static_cast<size_t>(v)].op != Op::U) ops.push_back(v);
    std::stable_sort(ops.begin(), ops.end(), [&](auto a, auto b) { return s.start[static_cast<size_t>(a)] < s.start[static_cast<size_t>(b)]; });
    std::vector<std::string> actions;
    std::vector<std::tuple<Op, int32_t, int32_t>> seen;  // one action per task, whatever its segments
    size_t i = 0;
    auto action = [&](const Node& n) {
      char k = n.op == Op::F ? 'F' : n.op == Op::B ? 'B' : n.op == Op::BI ? 'I' : 'W';
      return fmt::format("{}{}{}", n.stage, k, n.microbatch);
    };
    while (i < ops.size()) {
      const Node& n = g.nodes[static_cast<size_t>(ops[i])];
      auto key = std::make_tuple(n.op, n.stage, n.microbatch);
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        ++i;
        continue;
      }
      seen.push_back(key);
      if (n.overlap >= 0) {
        // `(a;b)OVERLAP_F_B`: the co-scheduled pair, forward first as torch writes it.
        std::vector<const Node*> group;
        for (size_t j = i; j < ops.size(); ++j)
          if (g.nodes[static_cast<size_t>(ops[j])].overlap == n.overlap) {
            const Node& m = g.nodes[static_cast<size_t>(ops[j])];
            if (std::none_of(group.begin(), group.end(), [&](const Node* x) { return x->op == m.op && x->stage == m.stage; }))
              group.push_back(&m);
            seen.push_back(std::make_tuple(m.op, m.stage, m.microbatch));
          }
        std::stable_sort(group.begin(), group.end(), [](const Node* a, const Node* b) { return (a->op == Op::F) > (b->op == Op::F); });
        std::vector<std::string> parts;
        for (const Node* m : group) parts.push_back(action(*m));
        actions.push_back(fmt::format("({})OVERLAP_F_B", fmt::join(parts, ";")));
      } else {
        actions.push_back(action(n));
      }
      ++i;
    }
    out += fmt::format("{}\n", fmt::join(actions, ","));
  }
  return out;
}

std::string emit_trace(const ir::Graph& g, const Schedule& s, bool unit_costs, const Manifest* m,
                       const std::vector<MemoryUse>* memory) {
  using nlohmann::json;
  json events = json::array();
  const double scale = unit_costs ? 1e3 : 1e6;  // microseconds; a unit of cost shows as a millisecond
  const auto timeline = m ? memory_timeline(g, s, *m) : std::vector<std::vector<std::pair<double, int64_t>>>{};
  for (size_t c : class_order(s)) {
    if (c < timeline.size() && memory) {  // the simulated tensor memory, as piper-run's trace shows the real one
      const int64_t resident = (*memory)[static_cast<size_t>(s.classes[c].ranks.front())].resident_total();
      for (const auto& [t, live] : timeline[c])
        events.push_back({{"name", "tensor memory"}, {"ph", "C"}, {"pid", s.classes[c].ranks.front()}, {"ts", t * scale},
                          {"args", {{"MiB", double(resident + live) / (1 << 20)}}}});
    }
    const auto& cls = s.classes[c];
    int pid = cls.ranks.front();
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "rank " + ir::rank_list(cls.ranks)}}}});
    for (const auto& p : cls.streams) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", p.stream}, {"args", {{"name", g.streams[p.stream]}}}});
      for (ir::NodeId v : p.ops) {
        const Node& n = g.nodes[static_cast<size_t>(v)];
        double d = s.finish[static_cast<size_t>(v)] - s.start[static_cast<size_t>(v)];
        events.push_back({{"name", ir::token(n)}, {"cat", ir::op_name(n.op)}, {"ph", "X"}, {"pid", pid}, {"tid", p.stream},
                          {"ts", s.start[static_cast<size_t>(v)] * scale}, {"dur", d * scale},
                          {"args", {{"stage", n.stage}, {"microbatch", n.microbatch}, {"bytes", n.bytes}}}});
      }
    }
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

std::string emit_svg(const ir::Graph& g, const Schedule& s) {
  const double width = 1100, row = 28, left = 90, top = 30;
  auto order = class_order(s);
  const double scale = s.step_time > 0 ? (width - left - 10) / s.step_time : 1;
  std::string body;
  double y = top;
  for (size_t c : order) {
    const auto& cls = s.classes[c];
    body += fmt::format("<text x=\"4\" y=\"{:.1f}\" font-size=\"12\">rank {}</text>\n", y + row * 0.65, ir::rank_list(cls.ranks));
    for (const auto& p : cls.streams) {
      bool chunks = std::any_of(p.ops.begin(), p.ops.end(), [&](auto v) { return compute(g.nodes[static_cast<size_t>(v)]); });
      double h = chunks ? row - 4 : 6;  // communication as a thin band under the compute row
      std::map<int32_t, int> drawn;  // overlap group -> members drawn so far
      for (ir::NodeId v : p.ops) {
        const Node& n = g.nodes[static_cast<size_t>(v)];
        double x0 = left + s.start[static_cast<size_t>(v)] * scale, w = (s.finish[static_cast<size_t>(v)] - s.start[static_cast<size_t>(v)]) * scale;
        if (w <= 0) continue;
        double yy = y, hh = h;
        if (static_cast<size_t>(v) < s.paired.size() && s.paired[static_cast<size_t>(v)] >= 0) {  // a pair priced as one interval: stack them in halves
          hh = h / 2;
          yy = y + hh * drawn[n.overlap]++;
        }
        const char* fill = n.op == Op::F ? "#7cc47c" : n.op == Op::B ? "#6f9fd8" : n.op == Op::BI ? "#9cc3ef"
                         : n.op == Op::BW ? "#b48be0" : n.op == Op::U ? "#d8d070" : "#f0a860";
        body += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"#333\" "
                            "stroke-width=\"0.5\"><title>{}</title></rect>\n",
                            x0, yy, w, hh, fill, ir::token(n));
        if (chunks && n.microbatch >= 0 && w > 9)
          body += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{}\" text-anchor=\"middle\">{}</text>\n",
                              x0 + w / 2, yy + hh * 0.75, hh < h ? 8 : 10, n.microbatch);
      }
      y += chunks ? row : 8;
    }
    y += 6;
  }
  std::string legend = "<g font-size=\"11\">";
  double lx = left;
  for (auto [name, color] : {std::pair{"F", "#7cc47c"}, {"B", "#6f9fd8"}, {"BI", "#9cc3ef"}, {"BW", "#b48be0"},
                             {"U", "#d8d070"}, {"comm", "#f0a860"}}) {
    legend += fmt::format("<rect x=\"{}\" y=\"8\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"18\">{}</text>", lx, color, lx + 16, name);
    lx += 60;
  }
  legend += "</g>\n";
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\">\n"
                     "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{}{}</svg>\n",
                     width, y + 10, legend, body);
}

std::vector<RankStats> rank_stats(const ir::Graph& g, const Schedule& s) {
  std::vector<RankStats> out(s.classes.size());
  for (size_t c = 0; c < s.classes.size(); ++c) {
    double busy = 0;
    for (const auto& p : s.classes[c].streams) {
      // Busy = time the compute stream(s) run; overlapped members share one interval.
      double last_end = -1;
      for (ir::NodeId v : p.ops) {
        const Node& n = g.nodes[static_cast<size_t>(v)];
        if (!compute(n)) continue;
        double a = s.start[static_cast<size_t>(v)], b = s.finish[static_cast<size_t>(v)];
        if (a >= last_end) busy += b - a;
        else if (b > last_end) busy += b - last_end;
        last_end = std::max(last_end, b);
      }
    }
    out[c].busy = busy;
    out[c].idle = s.step_time - busy;
  }
  return out;
}

int32_t fullest_rank(const Schedule& s, const std::vector<MemoryUse>& mem, size_t c) {
  int32_t best = s.classes[c].ranks.front();
  for (int32_t r : s.classes[c].ranks)
    if (mem[static_cast<size_t>(r)].peak > mem[static_cast<size_t>(best)].peak) best = r;
  return best;
}

namespace {
const MemoryUse& fullest(const Schedule& s, const std::vector<MemoryUse>& mem, size_t c) {
  return mem[static_cast<size_t>(fullest_rank(s, mem, c))];
}
int64_t cat(const MemoryUse& m, MemCategory c) { return m.at_peak[static_cast<size_t>(c)]; }
}  // namespace

std::string simulate_report(const ir::Graph& g, const Schedule& s, const std::vector<MemoryUse>& mem, double budget,
                            bool unit_costs, bool* over_budget) {
  auto stats = rank_stats(g, s);
  std::string out = fmt::format("  {:<12} {:>10} {:>10} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11}  {}\n", "rank", "busy", "idle",
                                "bubble", "params", "grads+opt", "activ.", "buffers", "peak mem", budget > 0 ? "budget" : "");
  double sum_bubble = 0, max_peak = 0;
  *over_budget = false;
  for (size_t c : class_order(s)) {
    const MemoryUse& m = fullest(s, mem, c);
    bool over = budget > 0 && double(m.peak) > budget;
    *over_budget = *over_budget || over;
    max_peak = std::max(max_peak, double(m.peak));
    sum_bubble += stats[c].bubble();
    out += fmt::format("  {:<12} {:>10} {:>10} {:>7.1f}% {:>11} {:>11} {:>11} {:>11} {:>11}  {}\n",
                       ir::rank_list(s.classes[c].ranks), human_time(stats[c].busy, unit_costs),
                       human_time(stats[c].idle, unit_costs), 100 * stats[c].bubble(),
                       human_bytes(double(cat(m, MemCategory::Params))),
                       human_bytes(double(cat(m, MemCategory::Grads) + cat(m, MemCategory::Optimizer))),
                       human_bytes(double(cat(m, MemCategory::Activations))),
                       human_bytes(double(cat(m, MemCategory::Comm) + cat(m, MemCategory::Gather) + cat(m, MemCategory::Other))),
                       human_bytes(double(m.peak)), budget > 0 ? (over ? "OVER" : "ok") : "");
  }
  out += fmt::format("  step time {}, mean bubble {:.1f}%, peak memory {}{}\n", human_time(s.step_time, unit_costs),
                     100 * sum_bubble / double(std::max<size_t>(1, s.classes.size())), human_bytes(max_peak),
                     budget > 0 ? fmt::format(" (budget {})", human_bytes(budget)) : "");
  out += fmt::format("  validation step (forward only, piper-run --eval-every) {}\n", human_time(forward_only_time(g, s), unit_costs));
  if (s.sms_delay > 0)
    out += fmt::format("  compute slowed by the multiprocessors limited streams hold (`sms`): {} on the slowest rank\n",
                       human_time(s.sms_delay, unit_costs));
  return out;
}

std::string emit_sim_json(const ir::Graph& g, const Schedule& s, const std::vector<MemoryUse>& mem) {
  auto stats = rank_stats(g, s);
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < mem.size(); ++r) {
    const int32_t c = s.class_of_rank(static_cast<int32_t>(r));
    nlohmann::json by;
    for (int k = 0; k < kMemCategories; ++k) by[mem_category_name(static_cast<MemCategory>(k))] = mem[r].at_peak[static_cast<size_t>(k)];
    ranks.push_back({{"rank", r}, {"peak_bytes", mem[r].peak}, {"busy", c >= 0 ? stats[static_cast<size_t>(c)].busy : 0.0},
                     {"idle", c >= 0 ? stats[static_cast<size_t>(c)].idle : 0.0}, {"by_category", by}});
  }
  return nlohmann::json{{"step_time", s.step_time}, {"eval_step_time", forward_only_time(g, s)}, {"sms_delay", s.sms_delay}, {"ranks", ranks}}
             .dump(1) + "\n";
}

}  // namespace piper::sched
