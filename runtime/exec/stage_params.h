// A stage's parameters as flat buffers laid out as the plan's facts say (FSDP's flat parameter,
// DDP's gradient buckets as views): gradients, ZeRO-1/2/3 shards and gathers, and a fused optimizer.
// Runtime-internal (LibTorch inside).
#pragma once
#include <torch/script.h>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/model/tensor_slice.h"
#include "runtime/view/rank_view.h"

namespace piper::runtime {

struct OptimizerOptions {
  std::string kind = "adamw";  // adamw | sgd
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // torch::optim::AdamW's defaults
  double weight_decay = 0;  // AdamW's decoupled decay, on the ranges add() names
  std::vector<std::string> no_decay;  // globs over "region.param" (a tie's first name) exempt from it
};

// AdamW (or SGD) over flat tensors: a few large elementwise passes instead of one per parameter,
// with the same arithmetic as torch::optim::AdamW so results match the reference trainer.
class FlatOptimizer {
 public:
  explicit FlatOptimizer(OptimizerOptions o) : o_(std::move(o)) {}
  // A parameter range and its gradient (same size); state is allocated here (category optimizer).
  // `decayed`: the sub-ranges (offset, length) weight decay applies to (parameters of 2+ dimensions).
  void add(torch::Tensor param, torch::Tensor grad, std::vector<std::pair<int64_t, int64_t>> decayed = {});
  void set_lr(double lr) { o_.lr = lr; }  // the schedule's rate for the next step
  void step();
  int64_t state_bytes() const;
  struct Slot {
    torch::Tensor param, grad, exp_avg, exp_avg_sq;  // moments undefined for SGD
    std::vector<std::pair<int64_t, int64_t>> decayed;
  };
  const std::vector<Slot>& slots() const { return slots_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t n) { steps_ = n; }  // a resumed run continues the bias correction

 private:
  OptimizerOptions o_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

// One parameter's elements [begin, end) of its flattened tensor — or, under tensor parallelism, of
// its flattened slice `slice` — and where this rank keeps them: the unit of a checkpoint, keyed by
// the model's names, not by ranks (runtime/checkpoint.h).
struct StatePiece {
  std::string region, param;  // the manifest's region name and the parameter's name in it
  int64_t numel = 0;          // the whole parameter's elements
  int64_t begin = 0, end = 0;
  torch::Tensor value, exp_avg, exp_avg_sq;  // 1-d views of end - begin elements; moments undefined: none
  SliceOf slice;  // not sliced: begin and end count elements of the whole parameter
};

class StageParams {
 public:
  // `dense`: the stage's dense parameters in layout order (facts.dense); `experts`: the parameters of
  // this rank's experts, trained here alone; their gradients come from every rank of the expert
  // group's tokens, so they are divided by `expert_replicas` (each replica's loss is its own mean).
  // `dense_names` and `expert_names` name them ({region, parameter}) for checkpoints.
  using Names = std::vector<std::pair<std::string, std::string>>;
  StageParams(const StageView& view, std::vector<torch::Tensor> dense, std::vector<torch::Tensor> experts,
              int64_t expert_replicas, const OptimizerOptions& opt, Communicator& comm, Names dense_names,
              Names expert_names);

  void start_step();  // gradients to zero
  // The backward of a piece over `range` for microbatch `mb` starts / ends (ZeRO-2/3: its gradients
  // go to this microbatch's bucket buffers, reduce-scattered and freed by the comm stream).
  void begin_backward(const ir::Segment& piece, int32_t mb);
  void end_backward(const ir::Segment& piece);
  // Collectives of the stage's replication, by bucket (or ZeRO-3 unit).
  void all_reduce(size_t bucket);
  // `mirror`: with the other copy of the stage, but for `skip` (tied ranges their own sum completed)
  void sum_copies(const std::vector<int>& group, int channel, const std::vector<ir::Range>& skip);
  double copy_divergence(const std::vector<int>& group, int channel, bool is_copy);  // 0: bit-identical copies
  void reduce_scatter(size_t bucket, int32_t mb);  // mb -1: once per step (ZeRO-1)
  void all_gather(size_t bucket);                  // ZeRO-1/2: updated parameters, after the update
  void gather_unit(size_t unit, int consumers);    // ZeRO-3: before `consumers` pieces use the unit
  void release_units(const ir::Segment& piece);    // ZeRO-3: after a piece used them
  // On a device: called on the releasing thread with a unit's storage before it is let go (the
  // allocator must not reuse it before the stream that computed with it is done).
  void set_before_release(std::function<void(const torch::Tensor&)> f) { before_release_ = std::move(f); }
  // The step: gradients averaged over the replicas and multiplied by `clip` (the global norm's
  // clipping scale, 1 when not clipping), then the optimizer.
  void update(double clip = 1.0);
  void set_lr(double lr) { optimizer_.set_lr(lr); }
  // The sum of squares of the averaged gradients this rank owns — what checksum counts, so every
  // parameter of the model exactly once over all ranks: its shards, or (replicated without ZeRO)
  // everything on the owner; tied copies where their original is; its experts. Final after the
  // stage's reductions and tied sums (the norm pass orders it so).
  double grad_square_sum(bool owner_of_replicated) const;
  // The gradient of tied parameter `tie` that this rank steps (its shard with ZeRO), final after the
  // stage's reductions; ALLREDUCE_T sums it with the other copies'.
  torch::Tensor tied_grad(int32_t tie);
  // Dense parameters that are a tied parameter's copy kept equal to a canonical one held by another
  // stage: trained like the others, but left out of checkpoints and checksums (counted once).
  void mark_copies(const std::vector<size_t>& dense_indices);
  // Tensor parallelism: where each dense parameter's slice lies in the whole (not sliced: a default
  // SliceOf), so checkpoints name slices by the whole parameter's coordinates.
  void set_slices(std::vector<SliceOf> per_dense) { slices_ = std::move(per_dense); }
  // Sequence parallelism: the layout ranges of the replicated parameters of regions that ran on this
  // rank's share of the tokens (their norms' and biases' gradients are partial), and the group that
  // sums them. sum_sequence_grads does so for what this rank steps, once a step, after the stage's
  // reductions and before the global norm and the update (the executor calls it before both).
  void set_sequence_shared(std::vector<ir::Range> ranges, std::function<void(torch::Tensor&)> sum_over_tp) {
    sequence_shared_ = std::move(ranges);
    sum_over_tp_ = std::move(sum_over_tp);
  }
  void sum_sequence_grads();
  // Sum and sum of squares of what this rank owns (its shards, or everything on replica 0).
  std::pair<double, double> checksum(bool owner_of_replicated) const;
  // What a checkpoint saves from this rank: the optimizer's parameters and moments it updates —
  // its shards, or (replicated) everything when it is the owner — each element of the model once
  // over all ranks.
  std::vector<StatePiece> saved_state(bool owner_of_replicated) const;
  // What loading fills: those, and the full parameters a rank also holds (ZeRO-1/2). After filling
  // them call loaded().
  std::vector<StatePiece> loaded_state();
  void loaded(int64_t optimizer_steps);
  int64_t optimizer_steps() const { return optimizer_.steps(); }

 private:
  const StageView& view_;
  Communicator& comm_;
  std::vector<torch::Tensor> dense_, experts_;
  int64_t expert_replicas_ = 1;
  const bool bf16_;              // `precision bf16`: the modules run on bf16 copies of fp32 masters
  const torch::TensorOptions f32_;  // fp32 on the parameters' device: every buffer here lives there
  std::function<void(const torch::Tensor&)> before_release_;
  std::vector<int64_t> offset_;  // per dense parameter: its first element in the layout
  torch::Tensor flat_, grad_;    // ZeRO 0-2: all parameters and (0-1) gradients, contiguous, fp32
  torch::Tensor compute_, grad16_;  // bf16: what the modules compute with, and (ZeRO 0-1) their gradients
  torch::Tensor expert_flat_, expert_grad_;
  // ZeRO-1/2: per bucket this rank's summed gradient shard. ZeRO-3: per unit, the shard of the
  // parameters and of the gradients it owns, and the unit's storage (empty between uses).
  std::vector<torch::Tensor> shard_grad_, shard_param_, unit_;
  std::vector<size_t> grad_shard_of_;  // per bucket: its entry in shard_grad_ (ZeRO-3 lists them by unit)
  std::vector<int> holders_;    // ZeRO-3: uses of a unit's gathers not yet released
  std::vector<bool> reduced_;   // ZeRO-2/3: this step's first reduction of a shard is done
  std::map<std::pair<int32_t, size_t>, torch::Tensor> mb_grads_;  // ZeRO-2/3: (microbatch, bucket) -> gradients
  FlatOptimizer optimizer_;
  const std::vector<std::string> no_decay_;
  Names dense_names_, expert_names_;
  std::vector<bool> copy_;  // per dense parameter: a tied copy (mark_copies)
  std::vector<SliceOf> slices_;  // per dense parameter (set_slices); empty: none sliced
  std::vector<ir::Range> sequence_shared_;  // set_sequence_shared
  std::function<void(torch::Tensor&)> sum_over_tp_;
  bool sequence_summed_ = false;  // this step's
  std::vector<std::pair<bool, int64_t>> slot_at_;  // per optimizer slot: (expert layout?, first element)
  mutable std::mutex mu_;  // compute and comm streams share the maps above

  void lay_out_whole(const ir::MemberStorage& mine);
  void lay_out_units(const ir::MemberStorage& mine);
  void lay_out_experts();
  // The parts of layout elements [at, at + len) (dense or expert layout) that weight decay applies
  // to, relative to `at`: those of parameters with two or more dimensions that no --no-decay glob names.
  std::vector<std::pair<int64_t, int64_t>> decayed_in(bool expert, int64_t at, int64_t len) const;
  std::vector<size_t> params_in(const ir::Range& r) const;
  std::vector<size_t> units_of(const ir::Segment& piece) const;    // the ZeRO-3 units a piece touches
  std::vector<size_t> buckets_of(const ir::Segment& piece) const;  // the buckets it writes gradients into
  std::vector<size_t> relative(const std::vector<int64_t>& shards) const;
  // The pieces of layout elements [at, at + len) (dense or expert layout) held in the given tensors.
  // `saving`: what a checkpoint writes — tied copies left out, and under tensor parallelism what the
  // group's ranks hold alike (replicated parameters) left to its leader.
  void pieces(bool expert, int64_t at, const torch::Tensor& value, const torch::Tensor& m, const torch::Tensor& v,
              std::vector<StatePiece>& out, bool saving = false) const;
  bool is_copy(const ir::Range& r) const;  // r lies within a tied copy
  // Calls fn(values, gradients, expert?) for what this rank owns (checksum and the global norm count
  // the same elements).
  using OwnedFn = std::function<void(const torch::Tensor& value, const torch::Tensor& grad, bool expert)>;
  void each_owned(bool owner_of_replicated, const OwnedFn& fn) const;
};

// The tensor of parameter `name` ("w" or "sub.w") of a module; and replacing it.
torch::Tensor module_parameter(const torch::jit::Module& m, const std::string& name);
void set_module_parameter(const torch::jit::Module& m, const std::string& name, const torch::Tensor& t);

}  // namespace piper::runtime
