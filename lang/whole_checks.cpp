// Checks that need the whole strategy: the mesh against the world, stages, unused axes, the batch.
#include "lang/checker_impl.h"

#include <cmath>

namespace piper::check {

void Checker::finish() {
  for (const Override& o : opt_.overrides) {
    if (used_overrides_.count(o.name)) continue;
    if (auto it = bound_by_use_.find(o.name); it != bound_by_use_.end()) {
      diags_.error(o.loc, fmt::format("--set {}: '{}' is given by a `use` argument, which takes precedence over --set",
                                      o.name, o.name))
          .note(it->second, "given here; make it a parameter of this file to set it from the command line");
      continue;
    }
    std::vector<std::string> names;
    for (auto& [n, _] : declared_params_)
      if (n != o.name) names.push_back(n);
    diags_.error(o.loc, fmt::format("--set {}: the strategy has no parameter '{}'{}", o.name, o.name,
                                    did_you_mean(o.name, names)));
  }
  finish_mesh();
  finish_placement();
  if (const int64_t stages = static_cast<int64_t>(out_.stages.size()); stages * out_.microbatches > kMaxStageMicrobatches)
    diags_.error(split_loc_.valid() ? split_loc_ : SourceLoc{top_, 1, 1, 1},
                 fmt::format("{} microbatches over {} stages are {} forward tasks a step: the limit is {}",
                             out_.microbatches, stages, stages * out_.microbatches, kMaxStageMicrobatches));
  finish_axes();
  finish_batch();
  if (diags_.has_errors()) return;
  finish_orders();
}

void Checker::finish_mesh() {
  int64_t product = 1;
  for (const auto& a : axes_)
    if (__builtin_mul_overflow(product, a.size, &product)) {
      diags_.error(a.loc, "the mesh has more devices than fit in 64 bits");
      return;
    }
  if (product > kMaxWorld || opt_.world.value_or(0) > kMaxWorld) {
    diags_.error(product > kMaxWorld ? first_mesh_ : opt_.world_loc,
                 fmt::format("{} devices: the limit is {}", std::max(product, opt_.world.value_or(0)), kMaxWorld));
    return;
  }
  const int64_t world = opt_.world.value_or(product);
  out_.mesh = Mesh(axes_, world);
  if (product == world) return;
  std::vector<std::string> parts;
  for (const auto& a : axes_) parts.push_back(fmt::format("{}={}", a.name, a.size));
  if (axes_.empty()) {
    diags_.error(first_stmt_.valid() ? first_stmt_ : SourceLoc{top_, 1, 1, 1},
                 fmt::format("the strategy declares no mesh, so it runs on 1 device, but the world has {} ranks",
                             world))
        .note(SourceLoc{}, fmt::format("declare one, e.g. `mesh dp = {};`", world));
    return;
  }
  auto& d = diags_.error(first_mesh_, fmt::format("the mesh has {} devices ({}) but the world has {} ranks", product,
                                                  fmt::join(parts, " × "), world));
  if (opt_.world_loc.valid()) d.note(opt_.world_loc, "world size given here");
}

void Checker::finish_placement() {
  if (place_count_ == 0) {
    Stage all;
    all.regions = m_.sequence;
    out_.stages.push_back(std::move(all));
    return;
  }
  std::vector<std::string> missing;
  for (RegionId r : m_.sequence)
    if (!placed_.count(r)) missing.push_back(m_.selector_text(r));
  if (!missing.empty()) {
    diags_.error(first_place_, fmt::format("{} never placed: {}", missing.size() == 1 ? "this region is" : "these regions are",
                                           fmt::join(missing, ", ")))
        .note(SourceLoc{}, "once any region is placed, every pipeline region must be placed exactly once");
    return;
  }
  cut_balanced();
  // Walk the pipeline in order: a stage is a maximal run on one coordinate. Regions placed with
  // `on` join their neighbours; `over` groups stay apart (a V's two halves on the last rank are two stages).
  std::optional<std::pair<size_t, int64_t>> group;
  for (RegionId r : m_.sequence) {
    const Placed& p = placed_.at(r);
    bool join = !out_.stages.empty() && out_.stages.back().coord == p.coord &&
                (!p.group || !group || *p.group == *group);
    if (!join) {
      Stage st;
      st.coord = p.coord;
      out_.stages.push_back(std::move(st));
      group.reset();
    }
    out_.stages.back().regions.push_back(r);
    if (p.group) group = p.group;
  }
  std::map<int64_t, int64_t> per_coord;
  for (Stage& st : out_.stages) st.chunk = per_coord[st.coord]++;
}

// A balanced placement cuts its regions into one contiguous run per coordinate so that the fullest
// coordinate — its run plus what other directives placed there (the embedding, the head) — has
// the least cost (measured F + B from a machine file, else forward FLOPs): the smallest bound T for which filling coordinates in order, each as far
// as T allows while leaving one region for every later one, places everything (binary search on T;
// greedy filling is optimal for contiguous runs).
//
// `interleaved(v) balanced` and `vshape balanced` cut stages × v (or 2 × stages) chunks the same way
// and place chunk k where the even mode would. Chunks that share a coordinate run at different
// times, so what other directives placed there counts with the chunk it adjoins in the sequence:
// regions before the run (the embedding) with the first chunk, after it (the head) with the last.
void Checker::cut_balanced() {
  for (const Balanced& b : balanced_) {
    const size_t n = static_cast<size_t>(b.parts), m = b.regions.size();
    // Measured costs (nanoseconds) when every sequence region has one, else forward FLOPs.
    bool measured = !opt_.region_costs.empty();
    for (RegionId r : m_.sequence) measured = measured && opt_.region_costs.count(m_.regions[static_cast<size_t>(r)].name);
    auto weight = [&](RegionId r) -> int64_t {
      if (!measured) return m_.flops(r);
      return static_cast<int64_t>(opt_.region_costs.at(m_.regions[static_cast<size_t>(r)].name) * 1e9);
    };
    std::vector<int64_t> fixed(n, 0), cost(m);
    if (b.mode == PlaceDirective::Mode::Balanced) {
      for (const auto& [r, p] : placed_)
        if (p.coord >= 0 && static_cast<size_t>(p.coord) < n) fixed[static_cast<size_t>(p.coord)] += weight(r);
    } else {
      auto pos = [&](RegionId r) { return std::find(m_.sequence.begin(), m_.sequence.end(), r) - m_.sequence.begin(); };
      const auto first = pos(b.regions.front()), last = pos(b.regions.back());
      for (const auto& [r, p] : placed_) {
        if (p.coord < 0) continue;
        if (pos(r) < first && p.coord == b.coord_of(0)) fixed.front() += weight(r);
        if (pos(r) > last && p.coord == b.coord_of(static_cast<int64_t>(n) - 1)) fixed.back() += weight(r);
      }
    }
    int64_t hi = 0;
    for (size_t i = 0; i < m; ++i) hi += cost[i] = std::max<int64_t>(weight(b.regions[i]), 1);
    hi += *std::max_element(fixed.begin(), fixed.end());
    // Where each coordinate's run starts, for bound T; empty when T is too small.
    auto fill = [&](int64_t T) -> std::vector<size_t> {
      std::vector<size_t> start(n);
      size_t i = 0;
      for (size_t c = 0; c < n; ++c) {
        start[c] = i;
        int64_t load = fixed[c] + cost[i++];
        if (load > T) return {};
        const size_t last = c + 1 == n ? m : m - (n - 1 - c);  // leave one for each later coordinate
        while (i < last && load + cost[i] <= T) load += cost[i++];
        if (c + 1 == n && i < m) return {};
      }
      return start;
    };
    int64_t lo = 0;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (fill(mid).empty()) lo = mid + 1;
      else hi = mid;
    }
    // The bound fixes the dearest chunk, not the others: filling each as far as it allows would
    // crowd the first chunks and starve the last. Cut again under the bound, each chunk stopping
    // nearest the even share of what remains, unless the rest would then not fit.
    auto fits = [&](size_t c, size_t i) {  // regions i.. into chunks c.. under the bound
      for (; c < n; ++c) {
        if (i >= m) return false;
        int64_t load = fixed[c] + cost[i++];
        if (load > lo) return false;
        const size_t last = c + 1 == n ? m : m - (n - 1 - c);
        while (i < last && load + cost[i] <= lo) load += cost[i++];
      }
      return i == m;
    };
    std::vector<size_t> start(n);
    for (size_t c = 0, i = 0; c < n; ++c) {
      start[c] = i;
      int64_t rest = 0;
      for (size_t k = i; k < m; ++k) rest += cost[k];
      for (size_t k = c; k < n; ++k) rest += fixed[k];
      const double share = double(rest) / double(n - c);
      int64_t load = fixed[c] + cost[i++];
      const size_t last = c + 1 == n ? m : m - (n - 1 - c);
      while (i < last && load + cost[i] <= lo &&
             (!fits(c + 1, i) || std::abs(double(load + cost[i]) - share) < std::abs(double(load) - share)))
        load += cost[i++];
    }
    for (size_t c = 0; c < n; ++c)
      for (size_t i = start[c]; i < (c + 1 < n ? start[c + 1] : m); ++i) {
        Placed& p = placed_.at(b.regions[i]);
        p.coord = b.coord_of(static_cast<int64_t>(c));
        p.group = std::make_pair(b.index, static_cast<int64_t>(c));
      }
  }
}

void Checker::finish_axes() {
  const std::string& pp = out_.pipeline_axis;
  for (auto* uses : {&replicate_axes_, &shard_axes_}) {
    if (auto it = uses->find(pp); !pp.empty() && it != uses->end())
      diags_.error(it->second, fmt::format("'{}' is the pipeline axis (regions are placed over it); {} over "
                                           "another axis",
                                           pp, uses == &replicate_axes_ ? "replicate" : "shard"))
          .note(first_place_, "placed over it here");
  }
  for (const auto& a : axes_)
    if (a.size > 1 && !used_axes_.count(a.name))
      diags_.error(a.loc, fmt::format("mesh axis '{}' (size {}) is not used by any place, replicate or shard",
                                      a.name, a.size))
          .note(SourceLoc{}, fmt::format("e.g. `replicate * over {};` for data parallelism", a.name));
}

void Checker::finish_batch() {
  if (!opt_.batch_size) return;
  const int64_t data_ways = out_.replicas();
  int64_t need = data_ways * out_.microbatches;
  if (need <= 0 || *opt_.batch_size % need == 0) return;  // need 0: the mesh error says why
  SourceLoc at = split_loc_.valid() ? split_loc_ : SourceLoc{top_, 1, 1, 1};
  diags_.error(at, fmt::format("the global batch of {} does not split into {} data-parallel replicas × {} "
                               "microbatches",
                               *opt_.batch_size, data_ways, out_.microbatches))
      .note(SourceLoc{}, fmt::format("use a batch size that is a multiple of {}", need));
}

}  // namespace piper::check
