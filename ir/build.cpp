// Pass 2, build: the single-device DAG — per stage forward and backward chunks (one per piece) and
// an update, chained through the stages (forward down, loss at the end, backward up) — and each
// stage's facts: its regions, its dense parameter layout, its replication (buckets and ZeRO-3
// units), its expert lists' owners, and its pieces. A stage is cut into pieces around sharded expert
// lists (the all-to-alls go between them) and at bucket and unit boundaries (so each bucket's
// reduction starts when its regions' backward is done, and each unit is gathered just for its piece).
#include <fmt/format.h>

#include <map>
#include <set>

#include "ir/pass.h"

namespace piper::ir {

namespace {
// Sharded list regions named by any shard directive, with the directive.
std::vector<std::pair<RegionId, const ShardDirective*>> sharded_lists(const CheckedStrategy& s) {
  std::vector<std::pair<RegionId, const ShardDirective*>> out;
  for (const auto& d : s.directives)
    if (const auto* sh = std::get_if<ShardDirective>(&d.body))
      for (RegionId r : sh->regions) out.emplace_back(r, sh);
  return out;
}

int64_t numel(const ParamSpec& p) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  return n;
}

// Regions sharded over a tensor-parallel axis, with the directive.
std::map<RegionId, const TensorShardDirective*> tensor_sharded(const CheckedStrategy& s) {
  std::map<RegionId, const TensorShardDirective*> out;
  for (const auto& d : s.directives)
    if (const auto* t = std::get_if<TensorShardDirective>(&d.body))
      for (RegionId r : t->regions) out.emplace(r, t);
  return out;
}

// The regions of `tp` inside `r`, in manifest order (the order a block runs them).
std::vector<RegionId> tp_inside(const Manifest& m, RegionId r, const std::map<RegionId, int64_t>& tp) {
  std::vector<RegionId> out;
  for (const auto& [q, ways] : tp)
    if (m.is_ancestor(r, q)) out.push_back(q);
  return out;
}

// The dense layout: a region's own parameters, then its children's, depth first in manifest order;
// sharded lists are left out (each rank holds its own members of them). A tied parameter is laid
// out once per stage, where its first member in the stage is: one tensor, counted and stepped once.
// A region sharded over tp (`tp`: its ways) lays out one rank's slice of each sliced parameter.
void lay_out(const Manifest& m, RegionId r, const std::set<RegionId>& sharded, const std::map<RegionId, int64_t>& tp,
             StageFacts& st) {
  if (sharded.count(r)) return;
  const Region& reg = m.regions[static_cast<size_t>(r)];
  const auto ways = tp.find(r);
  for (size_t i = 0; i < reg.params.size(); ++i) {
    const bool sliced = ways != tp.end() && reg.params[i].sharded();
    const int64_t n = numel(reg.params[i]) / (sliced ? ways->second : 1);
    if (const int32_t tie = m.tie_of(r, static_cast<int32_t>(i)); tie >= 0) {
      if (std::any_of(st.tied.begin(), st.tied.end(), [&](const TiedSlot& t) { return t.tie == tie; })) continue;
      st.tied.push_back(TiedSlot{tie, Range{st.dense_elems, st.dense_elems + n}});
    }
    st.dense.push_back(ParamSlot{r, static_cast<int32_t>(i), st.dense_elems, n, sliced});
    st.dense_elems += n;
  }
  for (RegionId ch : reg.children) lay_out(m, ch, sharded, tp, st);
}

int64_t bytes_per_element(const StageFacts& st, const Manifest& m) {
  if (st.dense.empty()) return 4;
  const ParamSlot& p = st.dense.front();
  return dtype_bytes(m.regions[static_cast<size_t>(p.region)].params[static_cast<size_t>(p.index)].dtype);
}

// What the stage's layout holds of a region's subtree: elements and bytes (a tied parameter laid
// out under an earlier region of the stage is not held twice).
std::pair<int64_t, int64_t> laid_out(const StageFacts& st, const Manifest& m, RegionId r) {
  int64_t elems = 0, bytes = 0;
  for (const ParamSlot& p : st.dense)
    if (m.is_ancestor(r, p.region)) {
      elems += p.numel;  // a tensor-parallel slice: its elements only
      bytes += p.numel * dtype_bytes(m.regions[static_cast<size_t>(p.region)].params[static_cast<size_t>(p.index)].dtype);
    }
  return {elems, bytes};
}

// Splits the ranges that hold `t` so that `t` is one of them; `descending` keeps a list that runs
// from the end of the layout backwards in that order.
void isolate(std::vector<Range>& ranges, const Range& t, bool descending) {
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!(r.begin < t.end && t.begin < r.end) || r == t) {
      out.push_back(r);
      continue;
    }
    std::vector<Range> parts;
    if (r.begin < t.begin) parts.push_back(Range{r.begin, t.begin});
    parts.push_back(Range{std::max(r.begin, t.begin), std::min(r.end, t.end)});
    if (t.end < r.end) parts.push_back(Range{t.end, r.end});
    if (descending) std::reverse(parts.begin(), parts.end());
    out.insert(out.end(), parts.begin(), parts.end());
  }
  ranges = std::move(out);
}

// Per pipeline region of the stage: the runs of its dense parameters that `selected` covers.
std::vector<std::vector<Range>> selected_runs(const StageFacts& st, const Manifest& m, const std::vector<RegionId>& selected) {
  std::vector<std::vector<Range>> out(st.regions.size());
  for (const ParamSlot& p : st.dense) {
    if (std::none_of(selected.begin(), selected.end(), [&](RegionId x) { return m.is_ancestor(x, p.region); })) continue;
    size_t k = 0;
    while (!m.is_ancestor(st.regions[k], p.region)) ++k;
    auto& runs = out[k];
    if (!runs.empty() && runs.back().end == p.offset) runs.back().end += p.numel;
    else runs.push_back(Range{p.offset, p.offset + p.numel});
  }
  return out;
}

// Buckets: whole regions' runs packed from the last region backwards (the order their gradients
// become final in the backward) up to `limit` elements; a region larger than that is a bucket alone.
std::vector<Range> pack_buckets(const std::vector<std::vector<Range>>& runs, int64_t limit) {
  std::vector<Range> out;
  bool open = false;
  for (size_t k = runs.size(); k-- > 0;)
    for (size_t i = runs[k].size(); i-- > 0;) {
      const Range& r = runs[k][i];
      if (open && out.back().begin == r.end && out.back().size() + r.size() <= limit) {
        out.back().begin = r.begin;
      } else {
        out.push_back(r);
        open = true;
      }
    }
  return out;
}

// A stage's pieces: runs of pipeline regions cut where `cut_before[k]` says (region k starts a
// piece), and around every sharded list (an expert piece of its own).
std::vector<Segment> cut(const StageFacts& st, const Manifest& m, const std::set<RegionId>& sharded,
                         const std::map<RegionId, int64_t>& tp, const std::vector<bool>& cut_before) {
  std::vector<Segment> out(1);
  int64_t at = 0;  // dense elements laid out so far
  for (size_t k = 0; k < st.regions.size(); ++k) {
    const RegionId r = st.regions[k];
    if (cut_before[k] && !out.back().regions.empty()) out.emplace_back();
    std::vector<RegionId> inside;
    for (RegionId l : sharded)
      if (m.is_ancestor(r, l)) inside.push_back(l);
    Segment& dense = out.back();
    if (dense.regions.empty()) dense.dense = Range{at, at};
    dense.regions.push_back(r);
    const auto [elems, bytes] = laid_out(st, m, r);
    dense.param_bytes += bytes;
    dense.flops += m.flops(r);
    // A sharded region's work (its projections and its heads' attention) splits over its ranks; its
    // output is summed over them once a sample.
    for (RegionId q : tp_inside(m, r, tp)) {
      const int64_t ways = tp.at(q);
      dense.flops -= m.flops(q) - m.flops(q) / ways;
      dense.tp_regions.push_back(q);
      const auto& out = m.regions[static_cast<size_t>(q)].output;
      int64_t b = out ? dtype_bytes(out->dtype) : 0;
      if (out)
        for (int64_t d : out->shape) b *= d;
      dense.tp_reduce_bytes += b;
    }
    at += elems;
    dense.dense.end = at;
    for (RegionId l : inside) {
      out.back().flops -= m.flops(l);
      Segment expert;
      expert.sharded = l;
      expert.dense = Range{at, at};
      expert.param_bytes = m.param_bytes(l);
      expert.flops = m.flops(l);
      out.push_back(std::move(expert));
      out.emplace_back();  // what follows the experts: the rest of the layer and the next ones
      out.back().dense = Range{at, at};
    }
  }
  if (out.size() > 1 && out.back().regions.empty()) out.pop_back();  // stage ends with experts
  return out;
}

// A piece whose regions use a tied parameter laid out in another piece of the stage (it is laid out
// once, under its first member) uses that range too.
void mark_tied_uses(StageFacts& st, const Manifest& m) {
  for (Segment& seg : st.segments)
    for (const TiedSlot& t : st.tied) {
      if (t.range.begin >= seg.dense.begin && t.range.end <= seg.dense.end) continue;
      const auto& members = m.ties[static_cast<size_t>(t.tie)].members;
      if (std::any_of(seg.regions.begin(), seg.regions.end(), [&](RegionId r) {
            return std::any_of(members.begin(), members.end(), [&](const TiedParam& p) { return m.is_ancestor(r, p.region); });
          }))
        seg.tied.push_back(t.range);
    }
}

DType precision_of(const CheckedStrategy& s, const Manifest& m, const std::vector<RegionId>& regions) {
  DType t = DType::F32;
  for (const auto& d : s.directives)
    if (const auto* p = std::get_if<PrecisionDirective>(&d.body))
      for (RegionId sel : p->regions)
        for (RegionId r : regions)
          if (m.is_ancestor(sel, r) || m.is_ancestor(r, sel)) t = p->dtype;
  return t;
}

// The stage's replication: the replicate directive that selects its parameters over an axis of
// more than one rank. Returns false (and reports) when two apply over different axes.
bool decide_replication(LowerContext& c, StageFacts& st) {
  const Directive* chosen = nullptr;
  for (const auto& d : c.strategy.directives) {
    const auto* rep = std::get_if<ReplicateDirective>(&d.body);
    if (!rep || c.strategy.axis_size(rep->axis) <= 1) continue;
    auto runs = selected_runs(st, c.manifest, rep->regions);
    if (std::all_of(runs.begin(), runs.end(), [](auto& r) { return r.empty(); })) continue;
    if (chosen) {
      const auto& first = std::get<ReplicateDirective>(chosen->body);
      if (first.axis == rep->axis) continue;  // the first one decides; the same axis again adds nothing
      auto& e = c.diags.error(d.loc, fmt::format("these parameters are already replicated over '{}'; a stage is "
                                                 "replicated over one axis",
                                                 first.axis));
      e.note(chosen->loc, "replicated here first");
      for (const Note& n : d.used_from) e.notes.push_back(n);
      return false;
    }
    chosen = &d;
    const int64_t elem = bytes_per_element(st, c.manifest);
    const int64_t limit = rep->bucket_bytes > 0 ? std::max<int64_t>(1, rep->bucket_bytes / elem)
                                                : std::numeric_limits<int64_t>::max();
    Replication r;
    r.axis = c.axis_index(rep->axis);
    r.ways = c.strategy.axis_size(rep->axis);
    r.zero = rep->zero;
    r.stream = c.graph.stream(rep->stream.empty() ? "comm" : rep->stream);
    if (rep->zero == 3) {
      // Units: by default each pipeline region's parameters, gathered for its own piece only
      // (FSDP's wrapping of every block); with `unit`, each selected region alone and the runs of
      // regions between them together (`unit *`: the whole stage). Reduce-scatters go unit by
      // unit too, in backward order.
      const bool whole = std::find(rep->units.begin(), rep->units.end(), 0) != rep->units.end();
      auto selected_unit = [&](size_t k) {
        return rep->units.empty() || std::find(rep->units.begin(), rep->units.end(), st.regions[k]) != rep->units.end();
      };
      bool open_run = false;
      for (size_t k = 0; k < runs.size(); ++k) {
        const bool alone = !whole && selected_unit(k);
        for (const Range& u : runs[k]) {
          if (!alone && open_run && r.units.back().end == u.begin) r.units.back().end = u.end;
          else r.units.push_back(u);
        }
        open_run = !alone && !runs[k].empty();
        if (alone) open_run = false;
      }
      for (const TiedSlot& t : st.tied) isolate(r.units, t.range, false);
      r.prefetch = rep->prefetch;
      r.buckets.assign(r.units.rbegin(), r.units.rend());
    } else {
      r.buckets = pack_buckets(runs, limit);
      // A tied parameter's copies in other stages are summed shard by shard (ir/tie.cpp): alone in
      // its bucket, its shards are the same elements in every copy.
      if (r.zero >= 1)
        for (const TiedSlot& t : st.tied) isolate(r.buckets, t.range, true);
    }
    st.replication = std::move(r);
  }
  return true;
}
}  // namespace

int64_t LowerContext::activation_bytes(const std::optional<TensorSpec>& t, DType precision) const {
  if (!t) return 0;
  const DType type = t->dtype == DType::F32 && precision == DType::BF16 ? DType::BF16 : t->dtype;
  int64_t n = dtype_bytes(type) * options.samples_per_microbatch;
  for (int64_t d : t->shape) n *= d;
  return n;
}

namespace {
// The sharded regions whose shard says `sequence`, per piece (Segment::sequence_regions).
void mark_sequence_parallel(const CheckedStrategy& s, StageFacts& st) {
  const auto dirs = tensor_sharded(s);
  for (Segment& seg : st.segments)
    for (RegionId q : seg.tp_regions)
      if (auto it = dirs.find(q); it != dirs.end() && it->second->sequence) seg.sequence_regions.push_back(q);
}

// Context parallelism: the regions of each piece that run on shares of the tokens, their work split
// over the axis (load balancing gives each rank 1/cp of the causal attention too), and the keys and
// values their attention passes round.
void mark_context_parallel(const LowerContext& c, StageFacts& st) {
  for (const auto& d : c.strategy.directives) {
    const auto* cs = std::get_if<ContextShardDirective>(&d.body);
    if (!cs) continue;
    const int64_t ways = c.strategy.axis_size(cs->axis);
    for (Segment& seg : st.segments)
      for (RegionId r : seg.regions)
        for (RegionId q : cs->leaves) {
          if (!c.manifest.is_ancestor(r, q)) continue;
          st.cp = TensorParallel{c.axis_index(cs->axis), ways};
          seg.context_regions.push_back(q);
          seg.flops -= c.manifest.flops(q) - c.manifest.flops(q) / ways;
          const Region& reg = c.manifest.regions[static_cast<size_t>(q)];
          if (!reg.output) continue;
          int64_t b = dtype_bytes(reg.output->dtype);
          for (int64_t x : reg.output->shape) b *= x;
          seg.cp_gather_bytes = b;
          if (reg.cp != "attention") continue;
          seg.cp_rings += 1;
          seg.cp_kv_bytes += 2 * b;  // keys and values are each as wide as the output (the zoo's heads)
        }
  }
}
}  // namespace

void build_pass(LowerContext& c) {
  Graph& g = c.graph;
  const auto& stages = c.stages;
  const auto lists = sharded_lists(c.strategy);
  std::set<RegionId> sharded;
  for (const auto& [r, d] : lists) sharded.insert(r);
  std::map<RegionId, int64_t> tp;  // tensor-sharded regions: their ways
  for (const auto& [r, d] : tensor_sharded(c.strategy)) tp.emplace(r, c.strategy.axis_size(d->axis));
  for (const Stage& s : stages) {
    StageFacts st;
    st.regions = s.regions;
    st.coord = s.coord;
    st.chunk = s.chunk;
    for (RegionId r : s.regions) lay_out(c.manifest, r, sharded, tp, st);
    for (const auto& [r, d] : tensor_sharded(c.strategy))
      if (std::any_of(s.regions.begin(), s.regions.end(), [&](RegionId q) { return c.manifest.is_ancestor(q, r); }))
        st.tp = TensorParallel{c.axis_index(d->axis), c.strategy.axis_size(d->axis)};
    st.precision = precision_of(c.strategy, c.manifest, s.regions);
    if (!decide_replication(c, st)) {
      c.failed = true;
      return;
    }
    // Cut before every region that starts a bucket (ZeRO-3's units are its buckets too): the
    // region that owns the bucket's first parameter.
    std::vector<bool> cut_before(st.regions.size(), false);
    for (const Range& b : st.replication.buckets)
      for (const ParamSlot& p : st.dense)
        if (p.offset == b.begin) {
          for (size_t k = 1; k < st.regions.size(); ++k)
            if (c.manifest.is_ancestor(st.regions[k], p.region)) cut_before[k] = true;
          break;
        }
    st.segments = cut(st, c.manifest, sharded, tp, cut_before);
    mark_sequence_parallel(c.strategy, st);
    mark_context_parallel(c, st);
    mark_tied_uses(st, c.manifest);
    // Expert ownership: each list's members in contiguous blocks over the shard axis.
    for (size_t j = 0; j < st.segments.size(); ++j) {
      const RegionId list = st.segments[j].sharded;
      if (list < 0) continue;
      const ShardDirective* dir = nullptr;
      for (const auto& [r, d] : lists)
        if (r == list) dir = d;
      ExpertShard e;
      e.list = list;
      e.axis = c.axis_index(dir->axis);
      e.ways = c.strategy.axis_size(dir->axis);
      e.segment = static_cast<int32_t>(j);
      e.members = c.manifest.regions[static_cast<size_t>(list)].children;
      const int64_t per = static_cast<int64_t>(e.members.size()) / e.ways;  // the checker made it divide
      for (size_t m = 0; m < e.members.size(); ++m) e.owner.push_back(static_cast<int64_t>(m) / per);
      e.member_bytes = c.manifest.param_bytes(e.members.front());
      // Each rank holds members/ways of them; with tokens routed evenly it does a sample's share of
      // expert work per local sample, which is what the manifest's per-sample FLOPs already say.
      st.segments[j].param_bytes /= e.ways;
      st.experts.push_back(std::move(e));
    }
    g.facts.stages.push_back(std::move(st));
  }

  int32_t act = g.tensor("activation"), grad = g.tensor("activation_grad"), saved = g.tensor("saved_activations");
  int32_t pgrad = g.tensor("param_grads"), loss = g.tensor("loss_grad");
  NodeId prev_f = -1;  // last forward piece so far, down the pipeline
  std::vector<NodeId> first_b(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto& segs = c.stage(s).segments;
    const Manifest& m = c.manifest;
    NodeId update = g.add(Node{.op = Op::U, .stage = int32_t(s)});
    std::vector<NodeId> f(segs.size()), b(segs.size());
    for (size_t j = 0; j < segs.size(); ++j) {
      const int16_t seg = segs.size() > 1 ? int16_t(j) : int16_t(-1);
      const Node chunk{.op = Op::F, .segment = seg, .stage = int32_t(s), .microbatch = 0, .bytes = segs[j].param_bytes,
                       .flops = segs[j].flops};
      f[j] = g.add(chunk);
      Node backward = chunk;
      backward.op = Op::B;
      b[j] = g.add(backward);
      g.connect(f[j], b[j], EdgeKind::Data, 0, saved);  // the backward needs the forward's activations
      g.connect(b[j], update, EdgeKind::Data, segs[j].param_bytes, pgrad);
      if (j > 0) {
        // Between pieces flows the activation at the cut: the input of the piece's first region.
        const RegionId first = segs[j].regions.empty() ? segs[j - 1].regions.back() : segs[j].regions.front();
        const int64_t at = c.activation_bytes(m.regions[static_cast<size_t>(first)].input, c.stage(s).precision);
        g.connect(f[j - 1], f[j], EdgeKind::Data, at, act);
        g.connect(b[j], b[j - 1], EdgeKind::Data, at, grad);
      }
    }
    const int64_t boundary = c.activation_bytes(m.regions[static_cast<size_t>(stages[s].regions.front())].input,
                                                c.stage(s).precision);
    if (prev_f >= 0) {
      g.connect(prev_f, f.front(), EdgeKind::Data, boundary, act);
      g.connect(b.front(), first_b[s - 1], EdgeKind::Data, boundary, grad);
    }
    prev_f = f.back();
    first_b[s] = b.back();  // the backward enters a stage at its last piece
  }
  // The loss: the last stage's forward output turns into the first backward's input on the spot.
  NodeId last_b = first_b.back();
  g.connect(prev_f, last_b, EdgeKind::Data, 0, loss);
}

}  // namespace piper::ir
