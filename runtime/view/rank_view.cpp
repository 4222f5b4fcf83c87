#include "runtime/view/rank_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace piper::runtime {

using ir::Node;
using ir::NodeId;
using ir::Op;

int message_tag(const Node& n, const sched::Plan& p, int max_tag) {
  const auto& f = p.dag.facts;
  int64_t segments = 1;
  for (const auto& st : f.stages) segments = std::max<int64_t>(segments, static_cast<int64_t>(st.segments.size()));
  const int64_t stages = static_cast<int64_t>(f.stages.size()), mbs = std::max<int64_t>(1, f.microbatches);
  const int64_t needed = 2 * segments * mbs * stages;  // tags 0 .. needed-1
  if (needed - 1 > max_tag)
    throw std::runtime_error(fmt::format("this plan needs {} message tags (2 directions × {} pieces × {} microbatches × {} "
                                         "stages) but the communicator allows tags up to {}",
                                         needed, segments, mbs, stages, max_tag));
  const int64_t dir = n.payload == ir::Payload::Act ? 0 : 1, seg = n.segment < 0 ? 0 : n.segment;
  return static_cast<int>(((dir * segments + seg) * mbs + n.microbatch) * stages + n.stage);
}

namespace {
// Offsets (absolute, members + 1 of them) splitting a range among `ways` members.
std::vector<int64_t> split(const ir::Range& r, int64_t ways) {
  std::vector<int64_t> out;
  for (int64_t j = 0; j <= ways; ++j) out.push_back(ir::Replication::shard_begin(r, ways, j));
  return out;
}
// Tensor parallelism: the stage's group along its model axis, and who speaks for it.
void tensor_group(const Mesh& mesh, int rank, RankView& v, StageView& sv) {
  sv.tp_leader = v.tp_leader;
  if (sv.facts->tp.axis < 0 || sv.facts->tp.ways <= 1) return;
  for (int32_t r : mesh.group_along(rank, sv.facts->tp.axis)) sv.tp_group.push_back(r);
  v.groups.insert({sv.tp_group, tensor_channel(sv.stage)});
  const auto& segs = sv.facts->segments;
  if (std::any_of(segs.begin(), segs.end(), [](const ir::Segment& s) { return !s.sequence_regions.empty(); }))
    v.groups.insert({sv.tp_group, sequence_channel(sv.stage)});
}
// Context parallelism: the stage's group along its cp axis; its exchanges, and the sums of the
// gradients its ranks computed from their shares (on sequence_channel: a strategy has tp or cp).
void context_group(const Mesh& mesh, int rank, RankView& v, StageView& sv) {
  if (sv.facts->cp.axis < 0 || sv.facts->cp.ways <= 1) return;
  for (int32_t r : mesh.group_along(rank, sv.facts->cp.axis)) sv.cp_group.push_back(r);
  v.groups.insert({sv.cp_group, context_channel(sv.stage)});
  v.groups.insert({sv.cp_group, sequence_channel(sv.stage)});
}

// `mirror`: the stage's two copies, at its coordinate and the mirrored one (other coordinates equal).
void copy_group(const ir::PlanFacts& f, int rank, RankView& v, StageView& sv) {
  if (!sv.facts->copied()) return;
  const auto along = f.mesh.group_along(rank, f.pipeline_axis);
  sv.copy_group = {along.at(static_cast<size_t>(sv.facts->coord)), along.at(static_cast<size_t>(sv.facts->copy_coord))};
  std::sort(sv.copy_group.begin(), sv.copy_group.end());
  sv.is_copy = f.mesh.coord(rank, f.pipeline_axis) == sv.facts->copy_coord;
  v.groups.insert({sv.copy_group, kMirrorChannel});
}

void stage_groups(const ir::PlanFacts& f, int rank, RankView& v, StageView& sv) {
  tensor_group(f.mesh, rank, v, sv);
  context_group(f.mesh, rank, v, sv);
  copy_group(f, rank, v, sv);
}

// `on stream comm sms N` (facts.stream_sms): the group and channel of each collective this rank runs on
// a limited stream get that limit (the smallest, when streams with different limits share one).
void limited_groups(const sched::Plan& p, const std::vector<int>& everyone, RankView& v) {
  const ir::Graph& g = p.dag;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& x = g.nodes[n];
    const int64_t sms = g.facts.sms_of(x.stream);
    if (sms <= 0 || !v.mine(p, static_cast<NodeId>(n)) || ir::is_chunk(x.op) || x.op == Op::Send || x.op == Op::Recv) continue;
    std::optional<std::pair<std::vector<int>, int>> key;
    const auto st = v.stages.find(x.stage);
    switch (x.payload) {
      case ir::Payload::Grad:
      case ir::Payload::Param:
        if (st != v.stages.end()) key = {st->second.dp_group, kReplicaChannel};
        break;
      case ir::Payload::Dispatch:
      case ir::Payload::Combine:
        if (st != v.stages.end() && !st->second.experts.empty()) key = {st->second.experts.begin()->second.group, expert_channel(x.stream)};
        break;
      case ir::Payload::Copy:
        if (st != v.stages.end()) key = {st->second.copy_group, kMirrorChannel};
        break;
      case ir::Payload::Tied:
        if (auto t = v.ties.find(x.bucket); t != v.ties.end()) key = {t->second.group, kTieChannel};
        break;
      case ir::Payload::Norm: key = {everyone, kNormChannel}; break;
      default: break;
    }
    if (!key || !v.groups.count(*key)) continue;
    auto [it, fresh] = v.group_sms.emplace(*key, static_cast<int>(sms));
    if (!fresh) it->second = std::min(it->second, static_cast<int>(sms));
  }
}
// The expert groups this rank joins, a channel per stream their exchanges run on.
void expert_groups(const sched::Plan& p, RankView& v) {
  const ir::Graph& g = p.dag;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& x = g.nodes[n];
    if (x.op != Op::AllToAll || !v.mine(p, static_cast<NodeId>(n))) continue;
    const auto st = v.stages.find(x.stage);
    if (st == v.stages.end()) continue;
    if (auto e = st->second.experts.find(x.segment); e != st->second.experts.end())
      v.groups.insert({e->second.group, expert_channel(x.stream)});
  }
}
}  // namespace

RankView make_rank_view(const sched::Plan& p, int rank, int world, int max_tag) {
  const auto& g = p.dag;
  const auto& f = g.facts;
  if (world != f.mesh.world())
    throw std::runtime_error(fmt::format("the plan is for {} ranks but the world has {}", f.mesh.world(), world));
  RankView v;
  v.rank = rank;
  v.cls = p.schedule.class_of_rank(rank);
  if (v.cls < 0) throw std::runtime_error(fmt::format("rank {} has no program in this plan", rank));
  const auto& my = p.schedule.classes[static_cast<size_t>(v.cls)].ranks;
  v.position = static_cast<size_t>(std::find(my.begin(), my.end(), rank) - my.begin());
  v.replicas = f.mesh.replicas(f.pipeline_axis);
  v.replica = f.mesh.replica_of(rank, f.pipeline_axis);
  v.samples_per_microbatch = f.samples_per_microbatch;
  v.microbatches = f.microbatches;
  v.last_stage = static_cast<int32_t>(f.stages.size()) - 1;
  for (size_t a = 0; a < f.mesh.axes().size(); ++a) v.tp_leader &= !(f.mesh.axes()[a].model && f.mesh.coord(rank, int(a)) != 0);

  // The stages this rank holds: those with a chunk in its class.
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& x = g.nodes[n];
    if (!v.mine(p, static_cast<NodeId>(n)) || !ir::is_chunk(x.op) || v.stages.count(x.stage)) continue;
    StageView sv;
    sv.stage = x.stage;
    sv.facts = &g.stage(x.stage);
    const ir::Replication& rep = sv.facts->replication;
    if (rep.axis >= 0) {
      for (int32_t r : f.mesh.group_along(rank, rep.axis)) sv.dp_group.push_back(r);
      sv.member = static_cast<size_t>(std::find(sv.dp_group.begin(), sv.dp_group.end(), rank) - sv.dp_group.begin());
      // Every member's shard of each range its optimizer steps, from the plan's storage layout.
      const ir::StageStorage& lay = sv.facts->storage;
      std::vector<std::vector<int64_t>> stepped;
      for (size_t k = 0; lay.zero > 0 && k < lay.members.front().stepped.size(); ++k) {
        std::vector<int64_t> offsets;
        for (const auto& m : lay.members) offsets.push_back(m.stepped[k].begin);
        offsets.push_back(lay.members.back().stepped[k].end);
        stepped.push_back(std::move(offsets));
      }
      if (lay.zero == 3) {
        sv.unit_shards = stepped;  // ZeRO-3's buckets are its units, last first
        sv.bucket_shards.assign(stepped.rbegin(), stepped.rend());
      } else if (lay.zero > 0) {
        sv.bucket_shards = std::move(stepped);
      } else {
        for (const auto& b : rep.buckets) sv.bucket_shards.push_back(split(b, rep.ways));
      }
      v.groups.insert({sv.dp_group, kReplicaChannel});
    }
    for (const auto& e : sv.facts->experts) {
      StageView::Experts ex;
      ex.shard = &e;
      ex.owned = e.owned(f.mesh.coord(rank, e.axis));
      for (int32_t r : f.mesh.group_along(rank, e.axis)) ex.group.push_back(r);
      sv.experts[e.segment] = std::move(ex);
    }
    stage_groups(f, rank, v, sv);
    v.stages.emplace(x.stage, std::move(sv));
  }
  expert_groups(p, v);
  for (const ir::TieFacts& t : f.ties) {
    RankView::TieView tv;
    for (int32_t s : t.stages)
      if (v.stages.count(s)) tv.stages.push_back(s);
    if (tv.stages.empty()) continue;
    const auto along = f.mesh.group_along(rank, f.pipeline_axis);
    for (int64_t c : t.coords) tv.group.push_back(along.at(static_cast<size_t>(c)));
    if (tv.group.size() > 1) v.groups.insert({tv.group, kTieChannel});
    v.ties.emplace(t.tie, std::move(tv));
  }
  std::vector<int> everyone(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) everyone[static_cast<size_t>(r)] = r;
  v.groups.insert({everyone, kRuntimeChannel});
  if (std::any_of(g.nodes.begin(), g.nodes.end(), [](const ir::Node& n) { return n.payload == ir::Payload::Norm; }))
    v.groups.insert({everyone, kNormChannel});  // the global norm: its own sequence, during the step
  limited_groups(p, everyone, v);

  // Each send pairs with the receive at the same position of the peer class; both ends compute the
  // tag from the send node.
  const auto& cls_of = p.schedule.node_class;
  v.peers.assign(g.nodes.size(), {-1, -1});
  for (const auto& e : g.edges) {
    if (g.nodes[static_cast<size_t>(e.src)].op != Op::Send || g.nodes[static_cast<size_t>(e.dst)].op != Op::Recv) continue;
    const auto& send_ranks = p.schedule.classes[static_cast<size_t>(cls_of[static_cast<size_t>(e.src)])].ranks;
    const auto& recv_ranks = p.schedule.classes[static_cast<size_t>(cls_of[static_cast<size_t>(e.dst)])].ranks;
    const int tag = message_tag(g.nodes[static_cast<size_t>(e.src)], p, max_tag);
    if (cls_of[static_cast<size_t>(e.src)] == v.cls) v.peers[static_cast<size_t>(e.src)] = {recv_ranks.at(v.position), tag};
    if (cls_of[static_cast<size_t>(e.dst)] == v.cls) v.peers[static_cast<size_t>(e.dst)] = {send_ranks.at(v.position), tag};
  }
  // Predecessors on this rank (cross-rank edges are send -> recv, which the communicator pairs),
  // and the waits the schedule added (a just-in-time gather waits for the op before its consumer).
  v.local_preds.assign(g.nodes.size(), {});
  for (const auto& e : g.edges)
    if (cls_of[static_cast<size_t>(e.src)] == v.cls && cls_of[static_cast<size_t>(e.dst)] == v.cls)
      v.local_preds[static_cast<size_t>(e.dst)].push_back(e.src);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (cls_of[n] == v.cls)
      for (NodeId u : p.schedule.issue_after[n]) v.local_preds[n].push_back(u);
  return v;
}

}  // namespace piper::runtime
