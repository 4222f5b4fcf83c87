// The checked strategy: directives as ordered, resolved records for ir/ to lower (nothing is lowered here).
#pragma once
#include <compare>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "lang/diagnostic.h"
#include "lang/manifest.h"
#include "lang/mesh.h"
#include "lang/source.h"

namespace piper {

enum class TaskKind { Fwd, Bwd, BwdInput, BwdWeight };
const char* task_kind_name(TaskKind k);  // fwd, bwd, bwd_input, bwd_weight

struct Task {
  TaskKind kind = TaskKind::Fwd;
  int64_t stage = 0;
  int64_t microbatch = 0;
  auto operator<=>(const Task&) const = default;
};

struct PlaceDirective {
  enum class Mode { On, Contiguous, Interleaved, VShape, Balanced };  // Balanced: contiguous, cut by cost
  Mode mode = Mode::On;
  std::vector<RegionId> regions;  // pipeline (sequence) regions, in sequence order
  std::string axis;
  int64_t chunks = 1;  // Interleaved: model chunks (virtual stages) per rank
  bool balanced = false;  // Interleaved, VShape: the chunks cut by cost (Balanced is the contiguous form)
  int64_t coord = 0;   // On: the coordinate on `axis`
  std::string stream;
};

struct ReplicateDirective {
  std::vector<RegionId> regions;
  std::string axis;
  int zero = 0;              // 0 plain data parallel; 1, 2, 3: ZeRO stage
  int64_t bucket_bytes = 0;  // 0: no bucketing requested
  std::string stream;
  // ZeRO-3: each region here is a unit of its own (gathered for its piece, freed after it); the
  // pipeline regions between them form units of their runs. Empty: every pipeline region a unit.
  std::vector<RegionId> units;
  int64_t prefetch = 1;  // ZeRO-3: units gathered ahead of the one running
};

struct ShardDirective {
  std::vector<RegionId> regions;  // list regions (e.g. each layer's experts) whose members are spread
  std::string axis;
  std::string stream;
};

// Tensor parallelism: the regions' parameters cut over a model axis as their `tp` layouts say
// (column blocks, row blocks, the rest replicated); the region runs on its slice and its partial
// outputs are summed over the axis (Megatron's f and g around it).
struct TensorShardDirective {
  std::vector<RegionId> regions;  // regions with a tp layout (attention, mlp)
  std::string axis;
  std::string dim;  // the layouts' dimension (heads, hidden), as the region's manifest names it
  // Sequence parallelism (Megatron's): the regions' replicated parts (norm, bias, residual) run on
  // this rank's share of the sequence; the partial sums become a reduce-scatter and an all-gather.
  bool sequence = false;
};

// `shard layers[*] over cp sequence ring;`: context parallelism. The regions run on this rank's share
// of each sample's tokens (load-balanced: chunks j and 2·cp-1-j of 2·cp), their causal attention
// passing keys and values round a ring of the axis; their parameters are whole on every rank and
// their gradients summed over the axis. The axis is a model axis (its ranks read the same samples).
struct ContextShardDirective {
  std::vector<RegionId> regions;  // as selected
  std::vector<RegionId> leaves;   // the regions with a `cp` layout (manifest) they are made of, in order
  std::string axis;
  std::string exchange;  // "ring"
};

struct SplitDirective {
  int64_t microbatches = 1;
};

// `mirror over pp;`: every stage is held twice, at its pipeline coordinate c and at the mirrored
// one (n-1-c); microbatches [0, m/2) run through the stages where they are placed (first to last
// coordinate), [m/2, m) through the copies (last to first), and the two copies of each stage sum
// their gradients before the update, so they stay equal. DeepSeek's DualPipe, as a placement.
struct MirrorDirective {
  std::string axis;  // the pipeline axis
};

struct OrderDirective {
  std::vector<std::vector<Task>> chain;  // each group happens before the next; a group is co-scheduled
  std::string stream;
};

struct RecomputeDirective {
  std::vector<RegionId> regions;
};

struct PrecisionDirective {
  DType dtype = DType::F32;
  std::vector<RegionId> regions;  // the root when it applies to the whole model
};

using DirectiveBody = std::variant<PlaceDirective, ReplicateDirective, ShardDirective, TensorShardDirective, ContextShardDirective,
                                   SplitDirective, MirrorDirective, OrderDirective, RecomputeDirective, PrecisionDirective>;

// For exhaustive visitors: `else static_assert(unhandled<T>, "...")` makes a directive that a
// visitor forgets a compile error rather than a silent skip.
template <typename T>
inline constexpr bool unhandled = false;

struct Directive {
  SourceLoc loc;  // the statement (for orders: one record per instance, all at the statement)
  DirectiveBody body;
  std::vector<Note> used_from;  // the `use` chain that brought it in (innermost first): notes for later errors
};

// A pipeline stage: a maximal run of sequence regions placed together.
struct Stage {
  std::vector<RegionId> regions;
  int64_t coord = 0;  // on the pipeline axis
  int64_t chunk = 0;  // how many earlier stages share this coordinate (virtual stage index)
};

inline constexpr const char* kBuiltinStreams[] = {"compute", "comm"};

// `on stream comm sms 20`: the stream's communication limited to that many multiprocessors.
struct StreamSmsLimit {
  std::string stream;
  int64_t sms = 0;
  SourceLoc loc;  // the `sms` clause
};

struct CheckedStrategy {
  Mesh mesh;  // its axes in declaration order, and the world
  std::vector<std::string> streams;
  std::vector<StreamSmsLimit> stream_sms;  // one per limited stream, first statement's location
  std::vector<std::pair<std::string, std::string>> params;  // final values as written (42, true), first declaration order
  int64_t microbatches = 1;
  std::string pipeline_axis;  // "" when nothing is placed
  std::vector<Stage> stages;  // at least one
  std::vector<Directive> directives;  // source order, loops unrolled, uses inlined

  int64_t axis_size(std::string_view axis) const { return mesh.size(axis); }  // 1 for an axis not in the mesh
  int pipeline_axis_index() const { return mesh.index(pipeline_axis); }  // -1 without a pipeline
  int64_t replicas() const { return mesh.replicas(pipeline_axis_index()); }
  // `mirror`: its directive (nullptr: none), and the first microbatch the stages' copies run (-1: no copies).
  const Directive* mirror() const {
    for (const Directive& d : directives)
      if (std::holds_alternative<MirrorDirective>(d.body)) return &d;
    return nullptr;
  }
  int64_t mirror_from() const { return mirror() ? microbatches / 2 : -1; }
  // The pipeline coordinate a stage's task for a microbatch runs at (its copy's, under `mirror`).
  int64_t task_coord(int64_t stage, int64_t microbatch) const {
    const int64_t c = stages.at(static_cast<size_t>(stage)).coord, from = mirror_from();
    return from >= 0 && microbatch >= from ? axis_size(pipeline_axis) - 1 - c : c;
  }
  int64_t samples_per_microbatch(int64_t global_batch) const {
    return mesh.samples_per_microbatch(global_batch, pipeline_axis_index(), microbatches);
  }
};

// Canonical text: a strategy file that checks back to the same records.
std::string print_strategy(const CheckedStrategy& s, const Manifest& m);
// `layers[0..3]`, `embed, head`: compact selector text for a region list.
std::string print_regions(const std::vector<RegionId>& regions, const Manifest& m);

}  // namespace piper
