#include "scheduler/memory.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace piper::sched {

using ir::Node;
using ir::NodeId;
using ir::Op;

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Params: return "params";
    case MemCategory::Grads: return "grads";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::Comm: return "comm";
    case MemCategory::Gather: return "gather";
    case MemCategory::Other: return "other";
  }
  return "?";
}

int64_t MemoryUse::resident_total() const {
  int64_t t = 0;
  for (int64_t b : resident) t += b;
  return t;
}

int64_t MemoryUse::states() const {
  return at_peak[size_t(MemCategory::Params)] + at_peak[size_t(MemCategory::Grads)] +
         at_peak[size_t(MemCategory::Optimizer)] + at_peak[size_t(MemCategory::Gather)];
}

namespace {
constexpr int64_t kFloat = 4;
constexpr int64_t kOptimizerChunk = 1 << 20;  // elements per pass of the executor's optimizer

// A tensor of this spec at `samples` samples; floating tensors of a bf16 stage are bf16.
int64_t spec_bytes(const std::optional<TensorSpec>& t, int64_t samples, bool bf16 = false) {
  if (!t) return 0;
  int64_t n = dtype_bytes(bf16 && t->dtype == DType::F32 ? DType::BF16 : t->dtype) * samples;
  for (int64_t d : t->shape) n *= d;
  return n;
}

// Activation memory of running regions one after another as one piece, at `samples` samples:
// saved (held until the piece's backward), the forward's peak above its starting level, the
// backward's peak above its starting level (all saved tensors and the incoming gradient counted).
struct PieceMemory {
  int64_t saved = 0, forward_peak = 0, backward_peak = 0;
  int64_t split_held = 0;  // held between BI and BW (a split backward)
  int64_t split_peak = 0;  // BI's peak above the level it starts from
  int64_t output = 0;  // the last region's output (what recomputation keeps)
  int64_t input = 0;   // the first region's input (the size of the input gradient, when it has one)
};

struct RegionBytes {
  int64_t saved, forward_peak, backward_peak, output;
  int64_t split_held, split_peak;
};

// A region measured (manifest `memory`), or estimated when it was not: its and its sub-regions'
// outputs held, its output as the backward's extra.
RegionBytes region_bytes(const Manifest& m, RegionId r, int64_t samples, bool bf16) {
  const Region& reg = m.regions[static_cast<size_t>(r)];
  const int64_t out = spec_bytes(reg.output, samples, bf16);
  const auto& mem = bf16 && reg.memory_bf16 ? reg.memory_bf16 : reg.memory;
  if (mem) {
    const int64_t saved = mem->saved.at(samples);
    const int64_t backward_peak = mem->backward_peak.at(samples);
    RegionBytes b{saved, mem->forward_peak.at(samples), backward_peak, out,
                  mem->split_held ? mem->split_held->at(samples) : saved,
                  mem->split_peak ? mem->split_peak->at(samples) : backward_peak};
    if (bf16 && !reg.memory_bf16)  // fp32 facts only
      b = {b.saved / 2, b.forward_peak / 2, b.backward_peak / 2, out, b.split_held / 2, b.split_peak / 2};
    return b;
  }
  int64_t held = out;
  for (RegionId c : reg.children) held += region_bytes(m, c, samples, bf16).saved;
  return {held, held, out, out, held, out};
}

// A part of a region as one rank holds it: each figure of `whole` mapped by `at` (whole's figure,
// the probe's measurement of it or null).
template <typename At>
RegionBytes part_bytes(const RegionBytes& whole, const std::optional<RegionMemory>& probe, const At& at) {
  const RegionMemory* p = probe ? &*probe : nullptr;
  const Measured* split = p && p->split_held ? &*p->split_held : p ? &p->saved : nullptr;
  const Measured* split_peak = p && p->split_peak ? &*p->split_peak : p ? &p->backward_peak : nullptr;
  return {at(whole.saved, p ? &p->saved : nullptr), at(whole.forward_peak, p ? &p->forward_peak : nullptr),
          at(whole.backward_peak, p ? &p->backward_peak : nullptr), whole.output, at(whole.split_held, split),
          at(whole.split_peak, split_peak)};
}

// `b` with its part `whole` replaced by what one rank holds of it.
void replace_part(RegionBytes& b, const RegionBytes& whole, const RegionBytes& mine) {
  b.saved -= whole.saved - mine.saved;
  b.forward_peak -= whole.forward_peak - mine.forward_peak;
  b.backward_peak -= whole.backward_peak - mine.backward_peak;
  b.split_held -= whole.split_held - mine.split_held;
  b.split_peak -= whole.split_peak - mine.split_peak;
}

// Region `r` on one rank of a tensor-parallel group of `ways`: each sharded region inside it (in
// `sharded`) holds its replicated part R and its sharded part S / ways, R and S solved from its
// measurements whole (R + S) and on a slice of two (R + S/2); unmeasured on a slice, all of it shards.
// With sequence parallelism (the region in `sequence`) R runs on 1/ways of the tokens too, except
// the all-gathered input of the sharded part, kept whole for its backward (about the region's input).
RegionBytes tp_region_bytes(const Manifest& m, RegionId r, int64_t samples, bool bf16, const std::vector<RegionId>& sharded,
                            int64_t ways, const std::vector<RegionId>& sequence) {
  RegionBytes b = region_bytes(m, r, samples, bf16);
  if (ways <= 1) return b;
  for (RegionId q : sharded) {
    if (!m.is_ancestor(r, q)) continue;
    const RegionBytes whole = region_bytes(m, q, samples, bf16);
    const auto& half = m.regions[static_cast<size_t>(q)].memory_tp2;
    const bool seq = std::find(sequence.begin(), sequence.end(), q) != sequence.end();
    const double gathered = static_cast<double>(spec_bytes(m.regions[static_cast<size_t>(q)].input, samples, bf16));
    auto at = [&](int64_t m1, const Measured* m2) {
      const double t = static_cast<double>(ways);
      if (!m2) return static_cast<int64_t>(static_cast<double>(m1) / t);
      const double h = static_cast<double>(m2->at(samples)) * (bf16 ? 0.5 : 1.0), w = static_cast<double>(m1);
      double rep = 2 * h - w;
      if (seq) rep = std::min(std::max(0.0, rep), gathered) + std::max(0.0, rep - gathered) / t;
      return std::max<int64_t>(0, static_cast<int64_t>(rep + 2 * (w - h) / t));
    };
    replace_part(b, whole, part_bytes(whole, half, at));
  }
  return b;
}

// Region `r` on one rank of a context-parallel group of `ways`: each region inside it that runs on
// a share of the tokens (in `context`) holds 1/ways of its activations — token-wise ones exactly;
// ring attention as measured on one rank of two (manifest `memory_cp2`, no scores kept), times
// 2/ways; unmeasured, its whole / ways.
RegionBytes cp_region_bytes(const Manifest& m, RegionId r, int64_t samples, bool bf16, const std::vector<RegionId>& context,
                            int64_t ways) {
  RegionBytes b = region_bytes(m, r, samples, bf16);
  if (ways <= 1) return b;
  const double t = static_cast<double>(ways);
  for (RegionId q : context) {
    if (!m.is_ancestor(r, q)) continue;
    const RegionBytes whole = region_bytes(m, q, samples, bf16);
    const auto& two = m.regions[static_cast<size_t>(q)].memory_cp2;
    auto at = [&](int64_t w, const Measured* m2) {
      if (!m2) return static_cast<int64_t>(static_cast<double>(w) / t);
      return static_cast<int64_t>(static_cast<double>(m2->at(samples)) * (bf16 ? 0.5 : 1.0) * 2.0 / t);
    };
    replace_part(b, whole, part_bytes(whole, two, at));
  }
  return b;
}

PieceMemory compose(const std::vector<RegionBytes>& rs, int64_t input) {
  PieceMemory p;
  p.input = input;
  for (const RegionBytes& r : rs) {
    p.forward_peak = std::max(p.forward_peak, p.saved + r.forward_peak);
    p.saved += r.saved;
    p.split_held += r.split_held;
  }
  // Backward, last region first: the later regions' saved tensors are gone by then (a BI: they are
  // what the weight half holds of them), the gradient of this region's output (the next one's input
  // gradient) is live.
  int64_t freed = 0, changed = 0;
  for (size_t k = rs.size(); k-- > 0;) {
    const int64_t grad_out = k + 1 < rs.size() ? rs[k].output : 0;
    p.backward_peak = std::max(p.backward_peak, rs[k].backward_peak + grad_out - freed);
    p.split_peak = std::max(p.split_peak, rs[k].split_peak + grad_out + changed);
    freed += rs[k].saved;
    changed += rs[k].split_held - rs[k].saved;
  }
  if (!rs.empty()) p.output = rs.back().output;
  return p;
}

// The region of `kind` below `under` (the MoE contract: a block's attention and router).
RegionId child_of_kind(const Manifest& m, RegionId under, const std::string& kind) {
  for (size_t r = 0; r < m.regions.size(); ++r)
    if (m.regions[r].kind == kind && m.is_ancestor(under, static_cast<RegionId>(r))) return static_cast<RegionId>(r);
  return -1;
}

struct Event {
  double t;
  int64_t delta;
  MemCategory cat;
  int phase = 1;    // at one instant: 0 frees of what ended there, 1 allocations, then instantaneous ops
  int64_t seq = 0;  // instantaneous ops one after another (each buffer counted alone on top)
};

// Everything one class of ranks allocates and frees over the step, as the executor does it.
class ClassModel {
 public:
  ClassModel(const ir::Graph& g, const Schedule& s, const Manifest& m, const MemoryOptions& o, int32_t cls)
      : g_(g), s_(s), m_(m), o_(o), cls_(cls), S_(g.facts.samples_per_microbatch) {}

  std::vector<Event> events() {
    index();
    tokens();
    for (NodeId v : nodes_) node(v);
    gathers();
    return std::move(ev_);
  }

 private:
  const Node& n(NodeId v) const { return g_.nodes[static_cast<size_t>(v)]; }
  double start(NodeId v) const { return s_.start[static_cast<size_t>(v)]; }
  double finish(NodeId v) const { return s_.finish[static_cast<size_t>(v)]; }
  void add(double t, int64_t delta, MemCategory c) {
    if (delta != 0) ev_.push_back({t, delta, c, delta > 0 ? 1 : 0, 0});
  }
  // `bytes` live over [from, to]. Over an instant (an op the simulation gives no duration) it still
  // counts, on top of everything else at that instant, as the real op's buffer does while it runs;
  // instantaneous ops of one instant run one after another, so each counts alone.
  void hold(double from, double to, int64_t bytes, MemCategory c) {
    if (bytes == 0) return;
    if (to > from) {
      add(from, bytes, c);
      add(to, -bytes, c);
      return;
    }
    ++instants_;
    ev_.push_back({from, bytes, c, 2, 2 * instants_});
    ev_.push_back({from, -bytes, c, 2, 2 * instants_ + 1});
  }

  void index() {
    for (size_t v = 0; v < g_.nodes.size(); ++v)
      if (s_.node_class[v] == cls_) nodes_.push_back(static_cast<NodeId>(v));

    consumers_.assign(g_.nodes.size(), {});
    for (const auto& e : g_.edges)  // what keeps a value alive, as the executor frees it (ir::holds_value)
      if (ir::holds_value(g_, e) && s_.node_class[static_cast<size_t>(e.src)] == cls_ &&
          s_.node_class[static_cast<size_t>(e.dst)] == cls_)
        consumers_[static_cast<size_t>(e.src)].push_back(e.dst);
    for (NodeId v : nodes_) {
      const Node& x = n(v);
      if (x.op == Op::B || x.op == Op::BW) last_backward_[key(x)] = v;
      if (x.op == Op::BI && !last_backward_.count(key(x))) last_backward_[key(x)] = v;
      if (x.op == Op::BI) bi_[key(x)] = v;
      if (x.op == Op::F) forward_.emplace(key(x), v);  // the first, as a scan would find
      if (x.op == Op::ReduceScatter && x.microbatch >= 0) rs_[{x.stage, x.microbatch, x.bucket}] = v;
    }
  }
  static std::tuple<int32_t, int32_t, int16_t> key(const Node& x) { return {x.stage, x.microbatch, x.segment}; }

  // A piece whose backward really splits: BI differentiates its input (the first piece has none:
  // its BI does nothing and BW runs the whole backward).
  bool split(const Node& x) { return bi_.count(key(x)) && piece(x).input > 0; }

  // When what `consumer` received from a predecessor is let go: a piece keeps its inputs and incoming
  // gradients until its last backward op (its BI where that splits); other ops are done with them
  // when they finish.
  double held_until(NodeId consumer) {
    const Node& x = n(consumer);
    if (ir::is_chunk(x.op) && x.op != Op::U) {
      if (split(x)) return finish(bi_.at(key(x)));
      if (auto it = last_backward_.find(key(x)); it != last_backward_.end()) return finish(it->second);
    }
    return finish(consumer);
  }
  // A value `v` produced, of `bytes`, live from `from` until its last consumer lets it go.
  void value(NodeId v, double from, int64_t bytes, MemCategory c = MemCategory::Activations) {
    double to = finish(v);
    for (NodeId u : consumers_[static_cast<size_t>(v)]) to = std::max(to, held_until(u));
    hold(from, to, bytes, c);
  }

  // The tokens of the step, on every rank (the executor reads its replica's batch each step).
  void tokens() {
    const auto& in = m_.regions[static_cast<size_t>(m_.sequence.front())].input;
    const int64_t seq = in && !in->shape.empty() ? in->shape[0] : 0;
    add(0, S_ * g_.facts.microbatches * (seq + 1) * 8, MemCategory::Activations);
  }

  const ir::Segment& segment(const Node& x) const { return g_.segment_of(x); }
  bool moe_end(const Node& x) const {
    const auto& segs = g_.stage(x.stage).segments;
    const size_t j = static_cast<size_t>(x.segment < 0 ? 0 : x.segment);
    return j + 1 < segs.size() && segs[j + 1].sharded >= 0;
  }
  // A region of a piece on this rank: its tensor-parallel slices, or its context-parallel share.
  RegionBytes split_region_bytes(const Node& x, const ir::Segment& seg, RegionId r) const {
    const ir::StageFacts& st = g_.stage(x.stage);
    if (!seg.context_regions.empty()) return cp_region_bytes(m_, r, S_, bf16(x), seg.context_regions, st.cp.ways);
    return tp_region_bytes(m_, r, S_, bf16(x), seg.tp_regions, st.tp.ways, seg.sequence_regions);
  }
  int64_t expert_ways(const Node& x) const {
    for (const auto& e : g_.stage(x.stage).experts)
      if (e.segment == (x.segment < 0 ? 0 : x.segment)) return e.ways;
    return 1;
  }
  const ir::ExpertShard* experts_of(const Node& x, int16_t seg) const {
    for (const auto& e : g_.stage(x.stage).experts)
      if (e.segment == seg) return &e;
    return nullptr;
  }

  PieceMemory piece(const Node& x) {
    auto k = key(x);
    k = {x.stage, 0, x.segment};  // the same for every microbatch
    if (auto it = pieces_.find(k); it != pieces_.end()) return it->second;
    const ir::Segment& seg = segment(x);
    const bool last = x.stage + 1 == int32_t(g_.facts.stages.size()) &&
                      size_t(x.segment < 0 ? 0 : x.segment) + 1 == g_.stage(x.stage).segments.size();
    std::vector<RegionBytes> rs;
    PieceMemory p;
    if (seg.sharded >= 0) {
      // An expert piece, priced at the most any routing brings (the sparse dispatch sends a token
      // only where its experts are): each held member runs on every token of the group, and
      // the gate-weighted sum is its output.
      const ir::ExpertShard* e = experts_of(x, x.segment);
      const int64_t ways = e ? e->ways : 1, owned = e ? static_cast<int64_t>(e->owned(0).size()) : 0;
      const RegionId member = m_.regions[static_cast<size_t>(seg.sharded)].children.front();
      RegionBytes one = region_bytes(m_, member, ways * S_, bf16(x));
      const int64_t out = spec_bytes(m_.regions[static_cast<size_t>(member)].output, ways * S_);
      p.saved = owned * one.saved + out;
      p.split_held = owned * one.split_held + out;
      p.forward_peak = p.saved + (one.forward_peak - one.saved);
      p.backward_peak = one.backward_peak;
      p.split_peak = one.split_peak;
      p.output = out;
    } else {
      for (size_t k2 = 0; k2 < seg.regions.size(); ++k2) {
        const RegionId r = seg.regions[k2];
        if (k2 + 1 == seg.regions.size() && moe_end(x)) {  // the block runs its attention and router only
          for (const char* kind : {"attention", "router"})
            if (RegionId c = child_of_kind(m_, r, kind); c >= 0) rs.push_back(split_region_bytes(x, seg, c));
        } else {
          rs.push_back(split_region_bytes(x, seg, r));
        }
      }
      const RegionId first = seg.regions.empty() ? -1 : seg.regions.front();
      const bool grad_in = x.stage > 0 || x.segment > 0;
      p = compose(rs, first >= 0 && grad_in ? spec_bytes(m_.regions[static_cast<size_t>(first)].input, S_, bf16(x)) : 0);
      if (moe_end(x) && !seg.regions.empty())  // its outputs: attention, h and gates (the router's, in its saved)
        p.output = spec_bytes(m_.regions[static_cast<size_t>(seg.regions.back())].output, S_, bf16(x));
    }
    (void)last;
    return pieces_[k] = p;
  }

  void node(NodeId v) {
    const Node& x = n(v);
    const double a = start(v), b = finish(v);
    switch (x.op) {
      case Op::F: {
        const PieceMemory p = piece(x);
        const bool recompute = x.flags & ir::kRecompute;
        const int64_t keep = recompute ? p.output : p.saved;
        add(a, p.forward_peak, MemCategory::Activations);
        add(b, keep - p.forward_peak, MemCategory::Activations);
        if (split(x)) break;  // its BI and BW let go of it
        auto it = last_backward_.find(key(x));
        add(it != last_backward_.end() ? finish(it->second) : b, -keep, MemCategory::Activations);
        break;
      }
      case Op::B:
      case Op::BI:
      case Op::BW: {
        const PieceMemory p = piece(x);
        const bool recompute = x.op != Op::BW && has_recompute(x);
        // Recomputation re-runs the forward first: its saved tensors are back for the backward.
        const int64_t again = recompute ? p.saved - p.output : 0;
        const int64_t backward_peak = x.op == Op::BI && split(x) ? p.split_peak : p.backward_peak;
        const int64_t transient = recompute ? std::max(p.forward_peak - p.saved, backward_peak) : backward_peak;
        add(a, again + transient, MemCategory::Activations);
        add(b, -transient, MemCategory::Activations);
        if (split(x)) {
          // BI keeps of the graph only what the weight gradients need; BW frees that.
          const int64_t keep = has_recompute(x) ? p.output : p.saved;
          if (x.op == Op::BI) add(b, p.split_held - keep - again, MemCategory::Activations);
          else add(b, -p.split_held, MemCategory::Activations);
        } else if (x.op != Op::BI) {
          add(b, -again, MemCategory::Activations);
        }
        if (x.op != Op::BW && p.input > 0) value(v, b, p.input);
        if (x.op != Op::BI) grad_buckets(v);
        // bf16 (ZeRO 0-1): the piece's bf16 gradients are added into the fp32 ones a chunk at a
        // time, through an fp32 copy of the chunk.
        if (x.op != Op::BI && bf16(x) && zero_of(x) <= 1)
          hold(b, b, std::min(segment(x).dense.size(), kOptimizerChunk) * kFloat, MemCategory::Grads);
        break;
      }
      case Op::Recv: {
        const auto& regions = g_.stage(x.stage).regions;
        const bool act = x.payload == ir::Payload::Act;
        const RegionId r = act ? regions.front() : regions.back();
        const auto& spec = act ? m_.regions[static_cast<size_t>(r)].input : m_.regions[static_cast<size_t>(r)].output;
        value(v, a, spec_bytes(spec, S_, bf16(x)));
        break;
      }
      case Op::ReduceScatter: {
        const auto& rep = g_.stage(x.stage).replication;
        const ir::Range& bucket = rep.buckets[static_cast<size_t>(x.bucket)];
        const int64_t shard = shard_elems(rep, bucket) * kFloat;
        // The first reduction of a bucket in the step writes straight into the shard (ZeRO-2/3).
        const bool direct = x.microbatch >= 0 && first_reduction_.insert({x.stage, x.bucket}).second;
        if (!direct) hold(a, b, shard, MemCategory::Comm);
        // bf16 microbatch gradients are reduced from an fp32 copy of the bucket.
        if (bf16(x) && x.microbatch >= 0) hold(a, b, bucket.size() * kFloat, MemCategory::Comm);
        break;
      }
      case Op::AllGather:
        if (x.flags & ir::kMaterialize) gathers_[{x.stage, x.bucket}].push_back(v);
        break;
      case Op::U: update(x, a, b); break;
      case Op::AllToAll: all_to_all(v, a, b); break;
      default: break;
    }
  }

  bool bf16(const Node& x) const { return g_.stage(x.stage).precision == DType::BF16; }
  int zero_of(const Node& x) const { return g_.stage(x.stage).storage.zero; }

  bool has_recompute(const Node& x) const {
    auto it = forward_.find(key(x));
    return it != forward_.end() && (n(it->second).flags & ir::kRecompute);
  }

  // ZeRO-2/3: the backward's parameter gradients go to this microbatch's bucket buffers, freed once
  // their reduce-scatter is done.
  void grad_buckets(NodeId v) {
    const Node& x = n(v);
    const auto& rep = g_.stage(x.stage).replication;
    if (zero_of(x) < 2) return;
    for (size_t k = 0; k < rep.buckets.size(); ++k) {
      const ir::Range& bk = rep.buckets[k];
      if (!segment(x).touches(bk)) continue;
      if (!bucket_open_.insert({x.stage, x.microbatch, int32_t(k)}).second) continue;
      auto it = rs_.find({x.stage, x.microbatch, int32_t(k)});
      hold(start(v), it != rs_.end() ? finish(it->second) : finish(v), bk.size() * (bf16(x) ? 2 : kFloat), MemCategory::Grads);
    }
  }

  static int64_t shard_elems(const ir::Replication& rep, const ir::Range& r) {
    return ir::Replication::shard_begin(r, rep.ways, 1) - ir::Replication::shard_begin(r, rep.ways, 0);
  }

  // The optimizer works through each slot in chunks: two temporaries of a chunk at a time.
  void update(const Node& x, double a, double b) {
    if (!o_.adam) return;
    const ir::StageFacts& st = g_.stage(x.stage);
    int64_t largest = 0;
    for (const ir::Range& r : st.storage.members.front().stepped) largest = std::max(largest, r.size());
    for (const auto& e : st.experts) largest = std::max(largest, static_cast<int64_t>(e.owned(0).size()) * e.member_bytes / kFloat);
    hold(a, b, 2 * std::min(largest, kOptimizerChunk) * kFloat, MemCategory::Optimizer);
  }

  // ZeRO-3 units: a unit's storage is full from the first gather that finds it empty until the last
  // use of the gathers holding it ends; a gather that finds it full goes through scratch.
  void gathers() {
    for (auto& [unit, list] : gathers_) {
      const ir::Range& u = g_.stage(unit.first).replication.units[static_cast<size_t>(unit.second)];
      const bool half = g_.stage(unit.first).precision == DType::BF16;
      const int64_t bytes = u.size() * (half ? 2 : kFloat);
      std::vector<std::pair<double, int>> marks;  // (time, +uses at a gather's start / -1 at a use's end)
      std::sort(list.begin(), list.end(), [&](NodeId p, NodeId q) { return start(p) < start(q); });
      for (NodeId v : list) {
        marks.push_back({start(v), int(consumers_[static_cast<size_t>(v)].size())});
        for (NodeId c : consumers_[static_cast<size_t>(v)]) marks.push_back({finish(c), -1});
        if (half) hold(start(v), finish(v), u.size() * kFloat, MemCategory::Gather);  // gathered in fp32, then rounded
      }
      std::stable_sort(marks.begin(), marks.end(), [](auto& p, auto& q) { return p.first < q.first; });
      int holders = 0;
      size_t gather = 0;
      for (const auto& [t, d] : marks) {
        if (d > 0) {
          if (holders == 0) add(t, bytes, MemCategory::Gather);
          else hold(t, finish(list[gather]), bytes, MemCategory::Gather);  // scratch
          ++gather;
          holders += d;
        } else if (holders > 0 && --holders == 0) {
          add(t, -bytes, MemCategory::Gather);
        }
      }
    }
  }

  // Expert parallelism's exchanges, at the most any routing brings: the received tokens and gates
  // live until the expert piece's backward, the combined output until its consumers are done, and
  // the transposes' results likewise.
  void all_to_all(NodeId v, double a, double b) {
    const Node& x = n(v);
    const ir::ExpertShard* e = experts_of(x, x.segment);
    if (!e) return;
    const RegionId member = e->members.front();
    const int64_t ways = e->ways, experts = static_cast<int64_t>(e->members.size());
    const int64_t h = spec_bytes(m_.regions[static_cast<size_t>(member)].input, S_);  // this rank's tokens' hidden
    const auto& in = m_.regions[static_cast<size_t>(member)].input;
    const int64_t tokens = in && !in->shape.empty() ? in->shape[0] * S_ : S_;
    const int64_t gates = tokens * experts * kFloat, hg = h + gates;
    const bool back = x.flags & ir::kBackward;
    if (!back && x.payload == ir::Payload::Dispatch) {
      hold(a, b, hg + ways * hg, MemCategory::Activations);  // the concatenation and the gathered copy
      value(v, b, ways * hg);
    } else if (!back) {
      hold(a, b, h, MemCategory::Activations);
      value(v, b, h);
    } else if (x.payload == ir::Payload::Combine) {
      value(v, a, ways * h);
    } else {
      hold(a, b, ways * hg, MemCategory::Activations);
      value(v, b, hg);
    }
  }

  const ir::Graph& g_;
  const Schedule& s_;
  const Manifest& m_;
  const MemoryOptions& o_;
  const int32_t cls_;
  const int64_t S_;
  std::vector<NodeId> nodes_;
  int64_t instants_ = 0;
  std::vector<std::vector<NodeId>> consumers_;
  std::map<std::tuple<int32_t, int32_t, int16_t>, NodeId> last_backward_, bi_, forward_;
  std::map<std::tuple<int32_t, int32_t, int32_t>, NodeId> rs_;
  std::set<std::tuple<int32_t, int32_t, int32_t>> bucket_open_;
  std::set<std::pair<int32_t, int32_t>> first_reduction_;
  std::map<std::tuple<int32_t, int32_t, int16_t>, PieceMemory> pieces_;
  std::map<std::pair<int32_t, int32_t>, std::vector<NodeId>> gathers_;
  std::vector<Event> ev_;
};

// What a rank holds for the whole step: the plan's storage layout (ir/facts.h), which the
// executor allocates, priced in bytes; and its experts.
ByCategory resident(const ir::Graph& g, const std::vector<int32_t>& stages, int32_t rank, const MemoryOptions& o) {
  ByCategory r{};
  auto put = [&](MemCategory c, int64_t bytes) { r[static_cast<size_t>(c)] += bytes; };
  const Mesh& mesh = g.facts.mesh;
  for (int32_t s : stages) {
    const ir::StageFacts& st = g.stage(s);
    const ir::StageStorage& lay = st.storage;
    const int64_t member = st.replication.axis >= 0 ? mesh.coord(rank, st.replication.axis) : 0;
    const ir::MemberStorage& mine = lay.members[static_cast<size_t>(member)];
    put(MemCategory::Params, mine.param_elems * kFloat);
    put(MemCategory::Grads, mine.grad_elems * kFloat);
    if (lay.bf16_copy) {  // the bf16 copy the modules run on, and (whole gradients) its gradients
      if (lay.whole_params) put(MemCategory::Params, 2 * st.dense_elems);
      if (lay.whole_grads) put(MemCategory::Grads, 2 * st.dense_elems);
    }
    if (o.adam) put(MemCategory::Optimizer, 2 * mine.stepped_elems() * kFloat);
    for (const auto& e : st.experts) {
      const int64_t bytes = static_cast<int64_t>(e.owned(mesh.coord(rank, e.axis)).size()) * e.member_bytes;
      put(MemCategory::Params, bytes);
      put(MemCategory::Grads, bytes);
      if (o.adam) put(MemCategory::Optimizer, 2 * bytes);
    }
  }
  return r;
}
}  // namespace

namespace {
// A class's events in the order they happen. At one instant: what ended there is freed, then what
// starts there is allocated, then the instantaneous ops' buffers come and go one by one.
std::vector<Event> sorted_events(const ir::Graph& g, const Schedule& s, const Manifest& m, const MemoryOptions& o, size_t c) {
  auto ev = ClassModel(g, s, m, o, static_cast<int32_t>(c)).events();
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
    return std::tie(a.t, a.phase, a.seq) < std::tie(b.t, b.phase, b.seq);
  });
  return ev;
}
}  // namespace

std::vector<std::vector<std::pair<double, int64_t>>> memory_timeline(const ir::Graph& g, const Schedule& s,
                                                                     const Manifest& m, const MemoryOptions& o) {
  std::vector<std::vector<std::pair<double, int64_t>>> out(s.classes.size());
  for (size_t c = 0; c < s.classes.size(); ++c) {
    int64_t live = 0;
    for (const Event& e : sorted_events(g, s, m, o, c)) out[c].emplace_back(e.t, live += e.delta);
  }
  return out;
}

std::vector<MemoryUse> memory_use(const ir::Graph& g, const Schedule& s, const Manifest& m, const MemoryOptions& o) {
  std::vector<MemoryUse> out(static_cast<size_t>(g.facts.mesh.world()));
  for (size_t c = 0; c < s.classes.size(); ++c) {
    const auto ev = sorted_events(g, s, m, o, c);
    ByCategory live{}, at_peak{};
    int64_t total = 0, peak = 0;
    for (const Event& e : ev) {
      live[static_cast<size_t>(e.cat)] += e.delta;
      total += e.delta;
      if (total > peak) {
        peak = total;
        at_peak = live;
      }
    }
    std::vector<int32_t> stages;
    for (size_t v = 0; v < g.nodes.size(); ++v)
      if (s.node_class[v] == int32_t(c) && ir::is_chunk(g.nodes[v].op) &&
          std::find(stages.begin(), stages.end(), g.nodes[v].stage) == stages.end())
        stages.push_back(g.nodes[v].stage);
    for (int32_t rank : s.classes[c].ranks) {
      MemoryUse& u = out[static_cast<size_t>(rank)];
      u.resident = resident(g, stages, rank, o);
      u.at_peak = at_peak;
      for (int k = 0; k < kMemCategories; ++k) u.at_peak[static_cast<size_t>(k)] += u.resident[static_cast<size_t>(k)];
      u.peak = peak + u.resident_total();
    }
  }
  return out;
}

}  // namespace piper::sched
