// One rank's view of a plan: its program, peers, groups, buckets, shards and experts, all read from
// the plan's facts. LibTorch-free, so it is unit-tested without a model.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/plan.h"

namespace piper::runtime {

// Communicator channels: independent sequences of collectives on one group (see communicator.h).
enum Channel : int { kReplicaChannel = 1, kRuntimeChannel = 2, kHashChannel = 3, kExpertChannel = 4, kTieChannel = 5,
               kNormChannel = 6, kTensorChannel = 7, kMirrorChannel = 10 };
// Tensor parallelism sums partials from inside the pieces of each stage in that stage's program
// order; a channel per stage keeps two stages of a rank (a V's chunks) apart.
inline int tensor_channel(int32_t stage) { return kTensorChannel + 16 * (stage + 1); }
// Sequence parallelism's sums of a stage's partial parameter gradients (once a step, off the compute order).
inline int sequence_channel(int32_t stage) { return kTensorChannel + 1 + 16 * (stage + 1); }
// Context parallelism's ring exchanges and gathers of a stage, in its program order, as tensor_channel's.
inline int context_channel(int32_t stage) { return kTensorChannel + 2 + 16 * (stage + 1); }
// Expert all-to-alls run in each stream's program order; a channel per stream keeps two streams'
// exchanges (`order fwd(i) on stream a2a_f; order bwd(i) on stream a2a_b;`) from crossing.
inline int expert_channel(ir::StreamId stream) { return kExpertChannel + 16 * (stream + 1); }

struct StageView {
  int32_t stage = -1;
  const ir::StageFacts* facts = nullptr;
  // Data parallelism: the group along the replication axis (this rank included) and this rank's
  // index in it; per bucket (or ZeRO-3 unit), the split of its range among the members.
  std::vector<int> dp_group;
  size_t member = 0;
  std::vector<std::vector<int64_t>> bucket_shards;  // per bucket: members + 1 element offsets (absolute)
  std::vector<std::vector<int64_t>> unit_shards;    // per unit, likewise
  int zero() const { return facts->storage.zero; }  // 0 when not replicated
  bool replicated() const { return facts->replication.axis >= 0; }
  ir::Range my_shard(size_t bucket) const {  // this rank's elements of a bucket
    return ir::Range{bucket_shards[bucket][member], bucket_shards[bucket][member + 1]};
  }
  ir::Range my_unit_shard(size_t unit) const {
    return ir::Range{unit_shards[unit][member], unit_shards[unit][member + 1]};
  }
  // Expert parallelism, per expert piece (segment): the members this rank holds and its group.
  struct Experts {
    const ir::ExpertShard* shard = nullptr;
    std::vector<int64_t> owned;  // member indices, ascending
    std::vector<int> group;      // the ranks that share this rank's coordinates but on the shard axis
  };
  std::map<int32_t, Experts> experts;  // by segment
  // Tensor parallelism: the ranks that hold the other slices of this stage's sharded regions (this
  // rank included, in axis order); empty when the stage has none.
  std::vector<int> tp_group;
  std::vector<int> cp_group;  // context parallelism: the stage's group along its cp axis (empty: none)
  bool tp_leader = true;  // RankView::tp_leader
  // `mirror`: the ranks holding the stage's two copies (ascending; empty when it has one), and
  // whether this rank holds the copy (its gradients are then counted once, by the other).
  std::vector<int> copy_group;
  bool is_copy = false;
};

struct RankView {
  int rank = 0;
  int32_t cls = -1;          // schedule class
  size_t position = 0;       // index in the class's ranks; pairs with the same index of a peer class
  int64_t replica = 0, replicas = 1;
  // Coordinate 0 on every model (tensor-parallel) axis: the rank of its group that counts the loss,
  // the replicated parameters and the experts once (its peers hold the same values).
  bool tp_leader = true;
  int64_t samples_per_microbatch = 1, microbatches = 1;
  int32_t last_stage = 0;
  std::map<int32_t, StageView> stages;  // the stages this rank holds
  // Per node of this rank's class: (peer rank, tag) for send/recv, and the predecessors it waits for
  // on this rank (data edges within the class and the schedule's issue-after waits).
  std::vector<std::pair<int, int>> peers;
  std::vector<std::vector<ir::NodeId>> local_preds;
  // Per tie with copies on this rank (facts.ties): the ranks that sum its copies' gradients — one per
  // pipeline coordinate holding copies, this rank's other coordinates — and the stages here that hold one.
  struct TieView {
    std::vector<int> group;
    std::vector<int32_t> stages;
  };
  std::map<int32_t, TieView> ties;  // by the manifest's tie index
  // Every collective group this rank joins, with its channel, in one global order (sorted).
  std::set<std::pair<std::vector<int>, int>> groups;
  // Of those, the ones whose collectives run on a stream the plan limits to N multiprocessors
  // (ir::PlanFacts::stream_sms): the smallest N of the streams that use the group.
  std::map<std::pair<std::vector<int>, int>, int> group_sms;

  const sched::ClassProgram& program(const sched::Plan& p) const { return p.schedule.classes[static_cast<size_t>(cls)]; }
  bool mine(const sched::Plan& p, ir::NodeId v) const { return p.schedule.node_class[static_cast<size_t>(v)] == cls; }
};

// Message tags: unique per (payload, stage, microbatch, piece) so concurrent streams never cross
// wires. Throws std::runtime_error naming the limit when a plan needs more tags than `max_tag`.
int message_tag(const ir::Node& n, const sched::Plan& p, int max_tag);

// Throws std::runtime_error when the rank has no program in the plan.
RankView make_rank_view(const sched::Plan& p, int rank, int world, int max_tag);

}  // namespace piper::runtime
