#include "lang/placement.h"

#include <algorithm>
#include <cmath>

namespace piper {

namespace {
using Mode = PlaceDirective::Mode;

// A balanced placement, cut once every placement before it is known.
struct Balanced {
  size_t index;                   // the place directive's number (its stage groups)
  std::vector<RegionId> regions;  // in sequence order
  int64_t stages;                 // the axis size
  int64_t parts;                  // chunks: stages, stages × v, or 2 × stages
  Mode mode;
  int64_t coord_of(int64_t k) const {  // the coordinate chunk k sits at, as the even modes place it
    if (mode == Mode::Interleaved) return k % stages;
    if (mode == Mode::VShape) return k < stages ? k : 2 * stages - 1 - k;
    return k;
  }
};

// Where each of `n` contiguous chunks of regions (costs `cost`) starts, so that the fullest chunk
// with what is fixed at its coordinate (`fixed`) is as light as can be: the smallest bound T for
// which filling chunks in order, each as far as T allows while leaving one region for every later
// one, places everything (binary search on T; greedy filling is optimal for contiguous runs).
std::vector<size_t> balanced_starts(const std::vector<int64_t>& cost, const std::vector<int64_t>& fixed) {
  const size_t n = fixed.size(), m = cost.size();
  int64_t hi = *std::max_element(fixed.begin(), fixed.end());
  for (int64_t c : cost) hi += c;
  // Regions i.. into chunks c.. under bound T.
  auto fits = [&](size_t c, size_t i, int64_t T) {
    for (; c < n; ++c) {
      if (i >= m) return false;
      int64_t load = fixed[c] + cost[i++];
      if (load > T) return false;
      const size_t last = c + 1 == n ? m : m - (n - 1 - c);  // leave one for each later chunk
      while (i < last && load + cost[i] <= T) load += cost[i++];
    }
    return i == m;
  };
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(0, 0, mid)) hi = mid;
    else lo = mid + 1;
  }
  // The bound fixes the dearest chunk, not the others: filling each as far as it allows would
  // crowd the first chunks and starve the last. Cut again under the bound, each chunk stopping
  // nearest the even share of what remains, unless the rest would then not fit.
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
           (!fits(c + 1, i, lo) || std::abs(double(load + cost[i]) - share) < std::abs(double(load) - share)))
      load += cost[i++];
  }
  return start;
}

// `interleaved(v) balanced` and `vshape balanced` cut stages × v (or 2 × stages) chunks the same
// way and place chunk k where the even mode would. Chunks that share a coordinate run at different
// times, so what other directives placed there counts with the chunk it adjoins in the sequence:
// regions before the run (the embedding) with the first chunk, after it (the head) with the last.
void cut(const Balanced& b, const std::vector<RegionId>& sequence, const RegionWeight& weight, std::map<RegionId, Placement>& placed) {
  const size_t n = static_cast<size_t>(b.parts), m = b.regions.size();
  std::vector<int64_t> fixed(n, 0), cost(m);
  if (b.mode == Mode::Balanced) {
    for (const auto& [r, p] : placed)
      if (p.coord >= 0 && static_cast<size_t>(p.coord) < n) fixed[static_cast<size_t>(p.coord)] += weight(r);
  } else {
    auto pos = [&](RegionId r) { return std::find(sequence.begin(), sequence.end(), r) - sequence.begin(); };
    const auto first = pos(b.regions.front()), last = pos(b.regions.back());
    for (const auto& [r, p] : placed) {
      if (p.coord < 0) continue;
      if (pos(r) < first && p.coord == b.coord_of(0)) fixed.front() += weight(r);
      if (pos(r) > last && p.coord == b.coord_of(static_cast<int64_t>(n) - 1)) fixed.back() += weight(r);
    }
  }
  for (size_t i = 0; i < m; ++i) cost[i] = std::max<int64_t>(weight(b.regions[i]), 1);
  const std::vector<size_t> start = balanced_starts(cost, fixed);
  for (size_t c = 0; c < n; ++c)
    for (size_t i = start[c]; i < (c + 1 < n ? start[c + 1] : m); ++i)
      placed[b.regions[i]] = Placement{b.coord_of(static_cast<int64_t>(c)), std::make_pair(b.index, static_cast<int64_t>(c))};
}
}  // namespace

std::map<RegionId, Placement> place_regions(const std::vector<Directive>& directives, const Mesh& mesh,
                                            const std::vector<RegionId>& sequence, const RegionWeight& weight) {
  std::map<RegionId, Placement> placed;
  std::vector<Balanced> balanced;
  size_t index = 0;
  for (const Directive& dir : directives) {
    const auto* d = std::get_if<PlaceDirective>(&dir.body);
    if (!d) continue;
    ++index;
    const int64_t n = mesh.size(d->axis);
    const int64_t groups = d->mode == Mode::Interleaved ? n * d->chunks : d->mode == Mode::VShape ? 2 * n : n;
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(d->regions.size()) / groups);
    const bool cut_later = d->mode == Mode::Balanced || d->balanced;
    if (cut_later) balanced.push_back(Balanced{index, d->regions, n, groups, d->mode});
    for (size_t j = 0; j < d->regions.size(); ++j) {
      Placement p;
      if (d->mode == Mode::On) {
        p.coord = d->coord;
      } else if (cut_later) {
        p.coord = -1;
        p.group = std::make_pair(index, int64_t{-1});
      } else {
        const int64_t k = static_cast<int64_t>(j) / per;
        p.group = std::make_pair(index, k);
        p.coord = d->mode == Mode::Contiguous ? k : d->mode == Mode::Interleaved ? k % n : (k < n ? k : 2 * n - 1 - k);
      }
      placed[d->regions[j]] = p;
    }
  }
  for (const Balanced& b : balanced) cut(b, sequence, weight, placed);
  return placed;
}

std::vector<Stage> form_stages(const std::vector<RegionId>& sequence, const std::map<RegionId, Placement>& placed) {
  std::vector<Stage> stages;
  std::optional<std::pair<size_t, int64_t>> group;
  for (RegionId r : sequence) {
    const Placement& p = placed.at(r);
    const bool join = !stages.empty() && stages.back().coord == p.coord && (!p.group || !group || *p.group == *group);
    if (!join) {
      Stage st;
      st.coord = p.coord;
      stages.push_back(std::move(st));
      group.reset();
    }
    stages.back().regions.push_back(r);
    if (p.group) group = p.group;
  }
  std::map<int64_t, int64_t> per_coord;
  for (Stage& st : stages) st.chunk = per_coord[st.coord]++;
  return stages;
}

}  // namespace piper
