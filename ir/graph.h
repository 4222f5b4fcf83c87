// The Global Training DAG: every compute chunk and communication of one training step, index-based.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/facts.h"

namespace piper::ir {

using NodeId = int32_t;
using GroupId = int32_t;

enum class Op : uint8_t {
  F, B, BI, BW, U,                                                  // chunks
  Send, Recv, AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast  // communication
};
inline bool is_chunk(Op op) { return op <= Op::U; }
const char* op_name(Op op);  // "F", "send", "all_reduce", ... (dag-json spelling)

// What a communication node moves.
enum class Payload : uint8_t {
  None,
  Act,       // forward activation (SEND_F / RECV_F)
  ActGrad,   // gradient of an activation (SEND_B / RECV_B)
  Grad,      // parameter gradients (ALLREDUCE_G, REDUCESCATTER_G)
  Param,     // parameters (ALLGATHER_P after an update; ALLGATHER_PF / _PB before a ZeRO-3 use)
  Dispatch,  // tokens to their experts (A2A_D)
  Combine,   // expert outputs back to their tokens (A2A_C)
  Tied,      // gradients of a tied parameter summed over its copies (ALLREDUCE_T; `bucket` is the tie)
  Copy,      // a stage's gradients summed over its two copies (`mirror`: ALLREDUCE_C)
  Norm,      // the squared global gradient norm, summed over every rank (ALLREDUCE_N; clipping)
};

// Lifetime and role attributes the scheduler uses to account memory.
enum NodeFlag : uint8_t {
  kRecompute = 1 << 0,    // F: activations freed after, recomputed before the matching backward
  kMaterialize = 1 << 1,  // all-gather: full parameters exist from here ...
  kFreeParams = 1 << 2,   // chunk: ... until after this node (ZeRO-3)
  kShardGrads = 1 << 3,   // reduce-scatter: only this rank's gradient shard is kept after it (ZeRO-2/3)
  kBackward = 1 << 4,     // comm that belongs to the backward pass (direction of a2a / all-gather)
};

struct Node {
  Op op = Op::F;
  Payload payload = Payload::None;
  uint8_t flags = 0;
  StreamId stream = 0;
  int16_t segment = -1;     // piece of a stage (facts.stages[stage].segments); -1 when the stage is one piece
  int32_t stage = -1;
  int32_t microbatch = -1;  // -1: once per step (U, per-step collectives)
  int32_t chunk = 0;        // virtual stage index on its rank
  int32_t bucket = -1;      // gradient bucket, for bucketed collectives (ALLREDUCE_T: the manifest's tie)
  int32_t overlap = -1;     // co-scheduling group from `a || b`
  GroupId ranks = -1;       // every rank that runs it (a collective: all members of all its groups)
  int32_t axis = -1;        // collectives: the mesh axis they run along (their groups are its slices)
  int64_t bytes = 0;        // chunks: parameter bytes touched; comm: bytes each rank sends
  int64_t flops = 0;        // chunks: forward FLOPs per sample of the regions it runs
  bool operator==(const Node&) const = default;
};

enum class EdgeKind : uint8_t { Data, Temporal, Dead };

struct Edge {
  NodeId src = 0, dst = 0;
  EdgeKind kind = EdgeKind::Data;
  int32_t label = -1;  // data: index into Graph::tensor_names; temporal: the order directive's index
  int64_t bytes = 0;
};

class Graph {
 public:
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::vector<std::string> streams{"compute", "comm", "p2p_send", "p2p_recv"};
  std::vector<std::string> tensor_names;
  PlanFacts facts;  // what lowering decided, as data (ir/facts.h)

  // Lowering stops once a plan passes this many nodes (LowerOptions::max_nodes): past it the plan
  // cannot be scheduled and simulated in about a second. `add` throws TooLarge; ir::lower reports it.
  size_t node_limit = SIZE_MAX;
  struct TooLarge {};
  NodeId add(const Node& n) {
    if (nodes.size() >= node_limit) throw TooLarge{};
    nodes.push_back(n);
    return static_cast<NodeId>(nodes.size() - 1);
  }
  void connect(NodeId src, NodeId dst, EdgeKind kind, int64_t bytes = 0, int32_t label = -1) {
    edges.push_back(Edge{src, dst, kind, label, bytes});
  }
  GroupId group(const std::vector<int32_t>& ranks);  // interned: equal rank lists share an id
  const std::vector<int32_t>& ranks(GroupId g) const { return groups_.at(static_cast<size_t>(g)); }
  size_t group_count() const { return groups_.size(); }
  StreamId stream(std::string_view name);  // interned
  int32_t tensor(std::string_view name);   // interned
  const StageFacts& stage(int32_t s) const { return facts.stages.at(static_cast<size_t>(s)); }
  const Segment& segment_of(const Node& n) const {  // the piece a chunk or its communication runs
    return stage(n.stage).segments.at(static_cast<size_t>(n.segment < 0 ? 0 : n.segment));
  }
  std::string axis_name(int32_t axis) const {
    return axis >= 0 && static_cast<size_t>(axis) < facts.mesh.axes().size() ? facts.mesh.axes()[static_cast<size_t>(axis)].name : "";
  }
  void remove_dead_edges();                // after a pass that retired edges

  // Adjacency over live edges, rebuilt on demand (compressed rows: offsets + edge indices).
  struct Adjacency {
    std::vector<int32_t> out_offsets, out_edges, in_offsets, in_edges;
  };
  Adjacency adjacency() const;
  // Topological order of all nodes, or the nodes left on a cycle.
  std::optional<std::vector<NodeId>> topological_order(std::vector<NodeId>* on_cycle = nullptr) const;
  size_t memory_bytes() const;  // what the graph's storage occupies

 private:
  std::vector<std::vector<int32_t>> groups_;
  std::unordered_map<std::string, GroupId> group_index_;
  std::unordered_map<std::string, int32_t> tensor_index_;
};

// Whether a data edge keeps its source's values alive until its consumer has run: not an edge of
// parameter gradients (they live in the optimizer's buffers, whatever the backward returned), nor
// BW's from its forward and its BI (BW starts from what BI left in the graph). The executor frees
// values by this and the memory model prices them by it.
bool holds_value(const Graph& g, const Edge& e);

// What a validation step runs of the plan (the executor's evaluate, the simulator's
// forward_only_time): forward pieces, their sends and receives, the forward all-to-alls and
// ZeRO-3's forward gathers; no backward, update or their communication.
inline bool forward_only(const Node& n) {
  switch (n.op) {
    case Op::F: return true;
    case Op::Send:
    case Op::Recv: return n.payload == Payload::Act;
    case Op::AllToAll: return !(n.flags & kBackward);
    case Op::AllGather: return (n.flags & kMaterialize) && !(n.flags & kBackward);
    default: return false;
  }
}

// Compact tokens in the spirit of torch.distributed.pipelining: `2F0`, `1SEND_F3`, `1F0.s2`,
// `0ALLREDUCE_G.b1`, `3U`. They name a node's role (stage, op, microbatch, segment, bucket);
// ranks are printed beside them.
std::string token(const Node& n);
// Parses a token back into the fields it carries (others stay default).
std::optional<Node> parse_token(std::string_view text);

}  // namespace piper::ir
