// What lowering decided, recorded as data: per stage its parameter layout, pieces, replication
// (ZeRO stage, axis, buckets, gather units) and expert ownership. The memory model, the scheduler
// and the executor read these facts — never the checked strategy — so what the simulator prices is
// by construction what the executor runs.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lang/manifest.h"
#include "lang/mesh.h"
#include "lang/source.h"

namespace piper::ir {

using StreamId = uint16_t;

// A half-open element range [begin, end) of a stage's dense parameter layout.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// One parameter in a flat layout: `numel` elements from `offset`, owned by `region` (manifest
// region id; its `index`-th parameter).
// `sliced`: tensor parallelism cut it (the manifest's ParamSpec says along which dimension): `numel`
// is one rank's slice, the same on every rank of the tensor-parallel group.
struct ParamSlot {
  RegionId region = -1;
  int32_t index = 0;
  int64_t offset = 0, numel = 0;
  bool sliced = false;
  bool operator==(const ParamSlot&) const = default;
};

// A piece of a stage that runs as one chunk (a node's `segment` indexes these). A dense piece is a
// run of pipeline regions (the sharded lists inside them excluded); an expert piece runs one
// sharded list's members that this rank holds.
struct Segment {
  std::vector<RegionId> regions;  // dense: pipeline regions, in order
  RegionId sharded = -1;          // expert piece: the sharded list
  Range dense;                    // dense: its parameters' range of the stage's dense layout
  // Tied parameters its regions use that the layout holds in another piece of the stage (a GPT's
  // head reads the embedding's matrix): gathered for it, and its gradients added there, too.
  std::vector<Range> tied;
  int64_t param_bytes = 0;        // parameters it touches on one rank
  int64_t flops = 0;              // forward FLOPs per sample, on one rank
  // Tensor parallelism: the regions it runs sharded, each ending in an all-reduce of its partial
  // output in the forward and of its input gradient in the backward, inside the piece, on its stream.
  std::vector<RegionId> tp_regions;
  int64_t tp_reduce_bytes = 0;    // per sample: the bytes those forward all-reduces sum (as many backward)
  // Those with sequence parallelism: their replicated parts run on this rank's share of the tokens,
  // the sum is a reduce-scatter (forward) and the input an all-gather, and the gradients of their
  // replicated parameters are summed over the axis before the update (each rank saw its tokens only).
  std::vector<RegionId> sequence_regions;
  // Context parallelism: the regions (manifest `cp` layouts, in order) that run on this rank's share
  // of each sample's tokens, their parameters whole and their gradients summed over the axis; the
  // attention among them passes keys and values round a ring. Per sample, the bytes of the keys and
  // values those attentions exchange (the whole sequence's: each rank sends its share cp-1 times).
  std::vector<RegionId> context_regions;
  int64_t cp_kv_bytes = 0;
  int32_t cp_rings = 0;         // how many of them are attentions (each a ring)
  int64_t cp_gather_bytes = 0;  // per sample, a region's output: the shares gathered at the piece's end
  // Whether the piece reads (and writes gradients into) any element of `r` of the layout.
  bool touches(const Range& r) const {
    auto overlap = [&](const Range& a) { return a.begin < r.end && r.begin < a.end; };
    return overlap(dense) || std::any_of(tied.begin(), tied.end(), overlap);
  }
};

// Data parallelism of a stage's dense parameters over one mesh axis.
struct Replication {
  int32_t axis = -1;  // -1: the stage is not replicated
  int64_t ways = 1;
  int zero = 0;       // 0: all-reduce; 1, 2, 3: ZeRO stage
  StreamId stream = 0;
  std::vector<Range> buckets;  // reduced (and, ZeRO-1/2, gathered) ranges, in bucket order
  std::vector<Range> units;    // ZeRO-3: ranges gathered before each use and freed after
  int64_t prefetch = 1;        // ZeRO-3: units gathered ahead of the piece that runs
  // Member j of the group owns elements [shard(b, j), shard(b, j+1)) of bucket (or unit) b:
  // an even split, the first members taking one more when it is uneven.
  static int64_t shard_begin(const Range& r, int64_t ways, int64_t member) {
    const int64_t len = r.size(), per = len / ways, extra = len % ways;
    return r.begin + member * per + std::min(member, extra);
  }
};

// Expert parallelism: the members of a sharded list spread over a mesh axis, contiguous blocks.
struct ExpertShard {
  RegionId list = -1;
  int32_t axis = -1;
  int64_t ways = 1;
  int32_t segment = -1;           // the expert piece that runs them
  std::vector<RegionId> members;  // the list's members, in index order
  std::vector<int64_t> owner;     // per member: the coordinate on `axis` that holds it
  int64_t member_bytes = 0;       // parameters of one member
  std::vector<int64_t> owned(int64_t coord) const {  // member indices held at a coordinate
    std::vector<int64_t> out;
    for (size_t m = 0; m < owner.size(); ++m)
      if (owner[m] == coord) out.push_back(static_cast<int64_t>(m));
    return out;
  }
};

// A tied parameter (manifest ties) in a stage's layout: laid out once per stage, and, with ZeRO-1/2/3,
// a bucket (and unit) of its own, so that every copy's shards cover the same elements.
struct TiedSlot {
  int32_t tie = -1;  // index into the manifest's ties
  Range range;       // its elements in the dense layout
  bool operator==(const TiedSlot&) const = default;
};

// Stages holding copies of one tied parameter and the pipeline coordinates they sit at: the ranks at
// those coordinates (the rest of their mesh coordinates equal) sum the copies' gradients.
struct TieFacts {
  int32_t tie = -1;
  std::vector<int32_t> stages;  // ascending
  std::vector<int64_t> coords;  // distinct pipeline coordinates of those stages, ascending
};

// The one storage layout: what one member of a stage's replication group holds of the stage's dense
// parameters for the whole step. The executor allocates it (runtime/exec/stage_params), the memory
// model prices it (scheduler/memory), checkpoints save what its optimizer steps. Made by the storage
// pass from the replication; experts keep their own record (ExpertShard::owned).
struct MemberStorage {
  std::vector<Range> stepped;  // what this member's optimizer updates and keeps states for: the whole
                               // layout (ZeRO 0), or its shard of each bucket (ZeRO-1/2) or unit (ZeRO-3)
  int64_t param_elems = 0;     // fp32 parameter elements resident all step
  int64_t grad_elems = 0;      // fp32 gradient elements resident all step
  int64_t stepped_elems() const {
    int64_t n = 0;
    for (const Range& r : stepped) n += r.size();
    return n;
  }
};

struct StageStorage {
  int zero = 0;               // the ZeRO stage in effect: 0 when the stage is not replicated
  bool whole_params = true;   // ZeRO 0-2: every parameter resident, one flat buffer
  bool whole_grads = true;    // ZeRO 0-1: every gradient resident, one flat buffer
  bool bf16_copy = false;     // `precision bf16`: a bf16 copy of what is whole, for the modules
  std::vector<MemberStorage> members;  // per member of the replication group (one when not replicated)
};

// Tensor parallelism of a stage: its sharded regions' slices over one model axis (-1: none).
struct TensorParallel {
  int32_t axis = -1;
  int64_t ways = 1;
};

struct StageFacts {
  std::vector<RegionId> regions;  // the pipeline regions of the stage, in order
  int64_t coord = 0;              // on the pipeline axis
  int64_t chunk = 0;              // virtual-stage index on its ranks
  // `mirror`: the copy's coordinate (-1: none; equal to `coord` when the stage is its own mirror, one
  // copy then) and its virtual-stage index there, after the stages placed there.
  int64_t copy_coord = -1;
  int64_t copy_chunk = 0;
  bool copied() const { return copy_coord >= 0 && copy_coord != coord; }
  std::vector<ParamSlot> dense;   // the dense (not expert-sharded) parameters' flat layout
  int64_t dense_elems = 0;
  std::vector<Segment> segments;  // at least one
  Replication replication;
  std::vector<ExpertShard> experts;
  std::vector<TiedSlot> tied;
  TensorParallel tp;
  TensorParallel cp;              // context parallelism's axis and ways (-1: none)
  DType precision = DType::F32;   // compute precision (`precision bf16`)
  StageStorage storage;           // what each replica member holds (the storage pass)
};

// Where the ranks run: which host each is on (the launcher's placement, learned from MPI; or
// piper-check --hosts), and so which groups and handoffs go between hosts, on the slower network.
// Made by the hosts pass; the cost model prices a node on the tier it spans, reports name them.
struct HostFacts {
  std::vector<int32_t> host_of;       // per rank; empty: every rank on one host
  int32_t count = 1;                  // hosts
  std::vector<uint8_t> axis_crosses;  // per mesh axis: some group along it spans hosts
  std::vector<int32_t> axis_hosts;    // per mesh axis: the most hosts one group along it spans
  std::vector<uint8_t> next_crosses;  // per stage s: some rank's handoff to stage s + 1 goes between hosts
  bool any() const { return count > 1; }
  int32_t host(int64_t rank) const { return host_of.empty() ? 0 : host_of.at(static_cast<size_t>(rank)); }
  bool axis(int32_t a) const { return a >= 0 && static_cast<size_t>(a) < axis_crosses.size() && axis_crosses[static_cast<size_t>(a)]; }
  int32_t hosts_along(int32_t a) const {
    return a >= 0 && static_cast<size_t>(a) < axis_hosts.size() ? axis_hosts[static_cast<size_t>(a)] : 1;
  }
  // A pipeline handoff from `stage`: forward to stage + 1, backward to stage - 1.
  bool handoff(int32_t stage, bool backward) const {
    const int32_t s = backward ? stage - 1 : stage;
    return s >= 0 && static_cast<size_t>(s) < next_crosses.size() && next_crosses[static_cast<size_t>(s)];
  }
};

// `... on stream comm sms 20;`: the communication on a stream may occupy at most `sms` of a device's
// multiprocessors. The executor caps the communicators of that stream's collectives; the simulator
// slows the device's compute by that share while they run.
struct StreamSms {
  StreamId stream = 0;
  int64_t sms = 0;
  SourceLoc loc;  // the `sms` clause (errors against the machine's count)
};

// Facts about the whole plan that every reader needs.
struct PlanFacts {
  Mesh mesh;
  int32_t pipeline_axis = -1;
  int64_t microbatches = 1;
  int64_t samples_per_microbatch = 1;
  int64_t mirror_from = -1;  // `mirror`: microbatches from here on run through the stages' copies (-1: none)
  bool on_copy(int64_t microbatch) const { return mirror_from >= 0 && microbatch >= mirror_from; }
  std::vector<StageFacts> stages;
  std::vector<TieFacts> ties;  // ties held by more than one stage
  std::vector<SourceLoc> overlap_locs;  // per overlap group: the order that asked for it (diagnostics)
  HostFacts hosts;
  std::vector<StreamSms> stream_sms;  // the limited streams, by stream id
  int64_t sms_of(StreamId s) const {  // 0: not limited
    for (const StreamSms& x : stream_sms)
      if (x.stream == s) return x.sms;
    return 0;
  }
};

}  // namespace piper::ir
