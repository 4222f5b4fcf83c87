// The model's region manifest: the region tree, parameters, activation shapes and costs (docs/manifest.md).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lang/diagnostic.h"

namespace piper {

using RegionId = int32_t;

enum class DType { F32, F16, BF16, I64, I32, U8 };
std::optional<DType> dtype_from_name(std::string_view name);
const char* dtype_name(DType t);
int64_t dtype_bytes(DType t);

struct TensorSpec {
  std::vector<int64_t> shape;  // per sample: no batch dimension
  DType dtype = DType::F32;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  int64_t bytes = 0;
  // Tensor parallelism (the region's `tp` layout): dimension `shard_dim` is cut into `shard_blocks`
  // equal blocks (3 for a fused q/k/v projection) and each block into tp equal slices, a rank taking
  // its slice of every block; -1: the parameter is replicated over tp.
  int32_t shard_dim = -1;
  int64_t shard_blocks = 1;
  bool sharded() const { return shard_dim >= 0; }
};

// How a region splits over a tensor-parallel axis (docs/manifest.md, `tp`): by `dim` ("heads",
// "hidden"), `count` of them; its parameters say which dimension each splits (ParamSpec::shard_dim).
struct TensorLayout {
  std::string dim;
  int64_t count = 0;
};

// Activation memory of a region, measured at 1, 2 and 4 samples (piper-model does it with a counting
// allocator); other sample counts interpolate, and extrapolate from 2 to 4. `saved` is what the
// region holds from the end of its forward to its backward (its output included, its input not);
// `forward_peak` the most above the level before its forward; `backward_peak` the most above the
// level before its backward (its saved tensors and the output gradient already counted), its input
// gradient included. `split_held` (regions with a differentiable input) is what its graph still
// holds between the input and the weight halves of a split backward (BI, BW): the saved tensors the
// weight gradients need (its input too, where an op with weights saved it) and the output gradients
// of the ops that own weights; without it, `saved`. `split_peak`, the most above the level before BI
// while it runs, its input gradient included; without it, `backward_peak`.
struct Measured {
  int64_t at1 = 0, at2 = 0, at4 = 0;
  int64_t at(int64_t samples) const {
    if (samples <= 1) return at1 * samples;
    if (samples <= 2) return at1 + (at2 - at1) * (samples - 1);
    return at2 + (at4 - at2) * (samples - 2) / 2;
  }
};
struct RegionMemory {
  Measured saved, forward_peak, backward_peak;
  std::optional<Measured> split_held, split_peak;
};

// One piece of a region's forward, per sample, for the roofline cost model (docs/manifest.md,
// `work`): a matrix product [m x k]·[k x n] (m: rows per sample, the tokens; `shard`: the
// dimension tensor parallelism divides, 'n' column-parallel, 'k' row-parallel, 0 replicated),
// attention's score and value products (flash attention: `heads` query heads of `head_dim`,
// `q` queries against `kv` keys, causal or not), or memory-bound work moving `elements` values
// (norms, activations, residuals) read and written; attention and `shard` "n" memory divide over tp.
struct Work {
  enum class Kind { Gemm, Attention, Memory } kind = Kind::Gemm;
  int64_t m = 0, n = 0, k = 0;
  char shard = 0;
  int64_t heads = 0, head_dim = 0, v_dim = 0, q = 0, kv = 0;
  bool causal = false;
  int64_t elements = 0;
  // Forward FLOPs per sample: 2mnk; attention 2·q·kv·heads·(head_dim + v_dim), half when causal.
  double flops() const;
};

struct Region {
  std::string name;     // full dotted name; "" for the root
  std::string leaf;     // last name component ("3" for layers.3)
  std::string kind;     // e.g. embedding, block, attention, mlp, router, expert; "group" when implicit
  bool implicit = false;  // an interior node named only by its descendants (e.g. `layers`)
  RegionId parent = -1;
  std::vector<RegionId> children;  // numeric children sorted by index
  std::vector<ParamSpec> params;   // parameters owned directly by this region
  std::optional<TensorSpec> input, output;
  int64_t flops = 0;  // forward FLOPs per sample for this region alone
  std::vector<Work> work;  // what the flops are made of (optional; the roofline prices it)
  std::optional<TensorLayout> tp;  // set when the region can be sharded over a tensor-parallel axis
  // Set when the region can run on a share of each sample's tokens (context parallelism):
  // "tokenwise" (each token's output depends on that token's input alone: an MLP, a norm) or
  // "attention" (causal self-attention by the context-parallel contract, docs/models.md).
  std::string cp;
  std::optional<RegionMemory> memory;       // measured activation memory, running the region (subtree) alone
  std::optional<RegionMemory> memory_bf16;  // the same with bf16 parameters and activations
  // A region with a tp layout, measured on one rank's slice of two (fp32): with `memory`, what its
  // replicated and its sharded parts hold, so any tp is priced (scheduler/memory.cpp).
  std::optional<RegionMemory> memory_tp2;
  std::optional<RegionMemory> memory_cp2;  // ring attention on one rank of a context-parallel group of two
};

// One parameter tensor shared by several regions (tied weights: an embedding and the output head).
// Each member region lists the parameter among its own; the first member is its canonical name.
// Stages that hold copies keep them equal by summing their gradients (ir/tie.cpp).
struct TiedParam {
  RegionId region = -1;
  int32_t index = 0;  // into the region's params
  bool operator==(const TiedParam&) const = default;
};
struct Tie {
  std::vector<TiedParam> members;  // at least two, in different regions
};

struct Manifest {
  static constexpr int kVersion = 1;
  int version = kVersion;
  std::string model_name;
  std::vector<Region> regions;     // regions[0] is the root
  std::vector<RegionId> sequence;  // the top-level regions a pipeline cuts, in order
  std::vector<Tie> ties;

  // The tie a region's parameter belongs to, or -1.
  int32_t tie_of(RegionId r, int32_t index) const;
  // The subtrees' parameters counting each tied tensor once (what one device holds).
  int64_t unique_param_bytes(const std::vector<RegionId>& rs) const { return unique(rs, true); }
  int64_t unique_param_count(const std::vector<RegionId>& rs) const { return unique(rs, false); }

  std::optional<RegionId> find(std::string_view dotted) const;
  std::optional<RegionId> child(RegionId parent, std::string_view leaf) const;
  // A list is a node whose children are named 0..n-1 (layers, experts).
  bool is_list(RegionId r) const;
  int64_t param_bytes(RegionId r) const;  // the whole subtree
  int64_t param_count(RegionId r) const;
  int64_t flops(RegionId r) const;        // the whole subtree
  bool is_ancestor(RegionId a, RegionId b) const;  // a == b or a above b
  // `layers[3].moe.experts[0]`: the selector text that names this region.
  std::string selector_text(RegionId r) const;

 private:
  int64_t unique(const std::vector<RegionId>& rs, bool bytes) const;
};

// Parses and validates a manifest. Errors name the JSON path (e.g. regions[3].params[0].bytes).
std::optional<Manifest> parse_manifest(FileId file, const SourceManager& sources, DiagnosticEngine& diags);

}  // namespace piper
