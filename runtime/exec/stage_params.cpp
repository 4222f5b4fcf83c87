#include "runtime/exec/stage_params.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <fnmatch.h>

#include <ATen/native/Resize.h>
#include <cmath>
#include <functional>
#include <numeric>

#include "runtime/device/memory_counter.h"

namespace piper::runtime {

namespace {
// The optimizer works in chunks so its temporaries stay small whatever the shard size.
constexpr int64_t kOptimizerChunk = 1 << 20;

// A ZeRO-3 unit's storage grows to hold the unit, or shrinks to nothing; its contents are not kept
// (a gather fills it whole).
void resize_storage(const torch::Tensor& t, int64_t elements) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(elements) * t.element_size();
  if (t.is_cpu()) return at::native::resize_bytes_cpu(s, bytes);
  // Elsewhere (a CUDA caching allocator) the storage's own allocator: the old block goes back to it.
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}
}  // namespace

torch::Tensor module_parameter(const torch::jit::Module& m, const std::string& name) {
  torch::jit::Module cur = m;
  size_t start = 0;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
    cur = cur.attr(name.substr(start, dot - start)).toModule();
    start = dot + 1;
  }
  return cur.attr(name.substr(start)).toTensor();
}

void set_module_parameter(const torch::jit::Module& m, const std::string& name, const torch::Tensor& t) {
  torch::jit::Module owner = m;
  size_t start = 0;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
    owner = owner.attr(name.substr(start, dot - start)).toModule();
    start = dot + 1;
  }
  owner.register_parameter(name.substr(start), t, false);
}

void FlatOptimizer::add(torch::Tensor param, torch::Tensor grad, std::vector<std::pair<int64_t, int64_t>> decayed) {
  MemScope scope(MemCategory::Optimizer);
  Slot s{std::move(param), std::move(grad), {}, {}, o_.weight_decay > 0 ? std::move(decayed) : decltype(decayed){}};
  if (o_.kind == "adamw") {
    s.exp_avg = torch::zeros_like(s.param);
    s.exp_avg_sq = torch::zeros_like(s.param);
  }
  slots_.push_back(std::move(s));
}

int64_t FlatOptimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& s : slots_)
    if (s.exp_avg.defined()) b += (s.exp_avg.numel() + s.exp_avg_sq.numel()) * 4;
  return b;
}

void FlatOptimizer::step() {
  torch::NoGradGuard no_grad;
  MemScope scope(MemCategory::Optimizer);
  ++steps_;
  if (o_.kind != "adamw") {
    for (auto& s : slots_) s.param.add_(s.grad, -o_.lr);
    return;
  }
  // torch::optim::AdamW's arithmetic, elementwise, so flat and per-parameter updates agree.
  const double bc1 = 1 - std::pow(o_.beta1, double(steps_)), bc2 = 1 - std::pow(o_.beta2, double(steps_));
  const double step_size = o_.lr / bc1, root_bc2 = std::sqrt(bc2);
  for (auto& s : slots_) {
    // Decoupled decay first, as torch::optim::AdamW does: p *= 1 - lr * weight_decay.
    for (const auto& [at, len] : s.decayed) s.param.narrow(0, at, len).mul_(1 - o_.lr * o_.weight_decay);
    for (int64_t a = 0; a < s.param.numel(); a += kOptimizerChunk) {
      const int64_t n = std::min(kOptimizerChunk, s.param.numel() - a);
      auto p = s.param.narrow(0, a, n), g = s.grad.narrow(0, a, n);
      auto m = s.exp_avg.narrow(0, a, n), v = s.exp_avg_sq.narrow(0, a, n);
      m.mul_(o_.beta1).add_(g, 1 - o_.beta1);
      v.mul_(o_.beta2).addcmul_(g, g, 1 - o_.beta2);
      auto denom = (v.sqrt() / root_bc2).add_(o_.eps);
      p.addcdiv_(m, denom, -step_size);
    }
  }
}

StageParams::StageParams(const StageView& view, std::vector<torch::Tensor> dense, std::vector<torch::Tensor> experts,
                         int64_t expert_replicas, const OptimizerOptions& opt, Communicator& comm, Names dense_names,
                         Names expert_names)
    : view_(view), comm_(comm), dense_(std::move(dense)), experts_(std::move(experts)),
      expert_replicas_(expert_replicas), bf16_(view.facts->precision == DType::BF16),
      f32_(torch::TensorOptions().dtype(torch::kFloat).device(!dense_.empty() ? dense_[0].device()
                                                              : !experts_.empty() ? experts_[0].device()
                                                                                  : torch::Device(torch::kCPU))),
      optimizer_(opt), no_decay_(opt.no_decay),
      dense_names_(std::move(dense_names)), expert_names_(std::move(expert_names)) {
  torch::NoGradGuard no_grad;
  const ir::StageFacts& f = *view_.facts;
  for (const auto& slot : f.dense) offset_.push_back(slot.offset);
  for (size_t i = 0; i < dense_.size(); ++i)
    if (dense_[i].numel() != f.dense[i].numel)
      throw std::runtime_error(fmt::format("stage {}: parameter {} has {} elements, the manifest says {}", view_.stage, i,
                                           dense_[i].numel(), f.dense[i].numel));
  // What this rank holds is the plan's storage layout (ir/facts.h); the memory model prices the same.
  const ir::MemberStorage& mine = f.storage.members[view_.member];
  if (f.storage.whole_params) lay_out_whole(mine);
  else lay_out_units(mine);
  if (grad_shard_of_.empty())
    for (size_t b = 0; b < shard_grad_.size(); ++b) grad_shard_of_.push_back(b);
  if (!experts_.empty()) lay_out_experts();
  for (auto& p : dense_) p.set_requires_grad(true);
  for (auto& p : experts_) p.set_requires_grad(true);
}

namespace {
void view_into(torch::Tensor& p, const torch::Tensor& flat, int64_t at) { p.set_data(flat.narrow(0, at, p.numel()).view(p.sizes())); }
}  // namespace

// ZeRO 0-2: every parameter in one flat buffer (and a bf16 copy); ZeRO 0-1 every gradient too. The
// optimizer steps the whole layout (ZeRO 0) or this rank's shard of each bucket.
void StageParams::lay_out_whole(const ir::MemberStorage& mine) {
  const ir::StageFacts& f = *view_.facts;
  {
    MemScope scope(MemCategory::Params);
    flat_ = torch::empty({f.dense_elems}, f32_);
  }
  for (size_t i = 0; i < dense_.size(); ++i) flat_.narrow(0, offset_[i], dense_[i].numel()).copy_(dense_[i].detach().reshape({-1}));
  if (bf16_) {  // the fp32 parameters are the master copy; the modules run on a bf16 one
    MemScope scope(MemCategory::Params);
    compute_ = flat_.to(torch::kBFloat16);
  }
  for (size_t i = 0; i < dense_.size(); ++i) view_into(dense_[i], bf16_ ? compute_ : flat_, offset_[i]);
  if (f.storage.whole_grads) {
    MemScope scope(MemCategory::Grads);
    grad_ = torch::zeros({f.dense_elems}, f32_);
    // In bf16 the backward accumulates into bf16 gradients, added into the fp32 ones piece by piece.
    if (bf16_) grad16_ = torch::zeros({f.dense_elems}, f32_.dtype(torch::kBFloat16));
    const torch::Tensor& into = bf16_ ? grad16_ : grad_;
    for (size_t i = 0; i < dense_.size(); ++i)
      dense_[i].mutable_grad() = into.narrow(0, offset_[i], dense_[i].numel()).view(dense_[i].sizes());
  }
  if (f.storage.zero == 0) {
    optimizer_.add(flat_, grad_, decayed_in(false, 0, f.dense_elems));
    slot_at_.emplace_back(false, 0);
    return;
  }
  for (const ir::Range& r : mine.stepped) {
    if (f.storage.whole_grads) {  // ZeRO-1: the full gradients stay: the reduced shard goes back into its own place
      shard_grad_.push_back(grad_.narrow(0, r.begin, r.size()));
    } else {
      MemScope scope(MemCategory::Grads);
      shard_grad_.push_back(torch::zeros({r.size()}, f32_));
    }
    optimizer_.add(flat_.narrow(0, r.begin, r.size()), shard_grad_.back(), decayed_in(false, r.begin, r.size()));
    slot_at_.emplace_back(false, r.begin);
  }
}

// ZeRO-3: each unit has its own storage, full only while a piece uses it; between uses this rank
// keeps only its shard of each unit (the master copy, fp32) and that shard's gradients.
void StageParams::lay_out_units(const ir::MemberStorage& mine) {
  const ir::Replication& rep = view_.facts->replication;
  for (size_t u = 0; u < rep.units.size(); ++u) {
    const ir::Range unit = rep.units[u], shard = mine.stepped[u];
    torch::Tensor storage, values;
    {
      MemScope scope(MemCategory::Gather);
      values = torch::empty({unit.size()}, f32_);
      storage = bf16_ ? torch::empty({unit.size()}, f32_.dtype(torch::kBFloat16)) : values;
    }
    for (size_t i : params_in(unit))
      values.narrow(0, offset_[i] - unit.begin, dense_[i].numel()).copy_(dense_[i].detach().reshape({-1}));
    {
      MemScope scope(MemCategory::Params);
      shard_param_.push_back(values.narrow(0, shard.begin - unit.begin, shard.size()).clone());
    }
    if (bf16_) storage.copy_(values);
    values = torch::Tensor();
    for (size_t i : params_in(unit)) view_into(dense_[i], storage, offset_[i] - unit.begin);
    {
      MemScope scope(MemCategory::Grads);
      shard_grad_.push_back(torch::zeros({shard.size()}, f32_));
    }
    optimizer_.add(shard_param_.back(), shard_grad_.back(), decayed_in(false, shard.begin, shard.size()));
    slot_at_.emplace_back(false, shard.begin);
    resize_storage(storage, 0);
    unit_.push_back(storage);
  }
  holders_.assign(rep.units.size(), 0);
  for (const auto& b : rep.buckets)
    grad_shard_of_.push_back(static_cast<size_t>(std::find(rep.units.begin(), rep.units.end(), b) - rep.units.begin()));
}

// This rank's experts: trained here alone, one flat buffer and its gradients.
void StageParams::lay_out_experts() {
  int64_t n = 0;
  for (auto& p : experts_) n += p.numel();
  {
    MemScope scope(MemCategory::Params);
    expert_flat_ = torch::empty({n}, f32_);
  }
  {
    MemScope scope(MemCategory::Grads);
    expert_grad_ = torch::zeros({n}, f32_);
  }
  int64_t at = 0;
  for (auto& p : experts_) {
    expert_flat_.narrow(0, at, p.numel()).copy_(p.detach().reshape({-1}));
    view_into(p, expert_flat_, at);
    p.mutable_grad() = expert_grad_.narrow(0, at, p.numel()).view(p.sizes());
    at += p.numel();
  }
  optimizer_.add(expert_flat_, expert_grad_, decayed_in(true, 0, n));
  slot_at_.emplace_back(true, 0);
}

std::vector<std::pair<int64_t, int64_t>> StageParams::decayed_in(bool expert, int64_t at, int64_t len) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  const std::vector<torch::Tensor>& params = expert ? experts_ : dense_;
  const Names& names = expert ? expert_names_ : dense_names_;
  auto exempt = [&](size_t i) {  // a tied copy carries its original's name: copies decay alike
    const std::string name = names.at(i).first + "." + names.at(i).second;
    return std::any_of(no_decay_.begin(), no_decay_.end(),
                       [&](const std::string& glob) { return fnmatch(glob.c_str(), name.c_str(), 0) == 0; });
  };
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t p0 = expert ? offset : offset_[i], n = params[i].numel();
    offset += n;
    const int64_t a = std::max(at, p0), b = std::min(at + len, p0 + n);
    if (a < b && params[i].dim() >= 2 && !exempt(i)) out.emplace_back(a - at, b - a);
  }
  return out;
}

std::vector<size_t> StageParams::params_in(const ir::Range& r) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < dense_.size(); ++i)
    if (offset_[i] >= r.begin && offset_[i] < r.end) out.push_back(i);
  return out;
}

namespace {
std::vector<size_t> touched(const std::vector<ir::Range>& ranges, const ir::Segment& piece) {
  std::vector<size_t> out;
  for (size_t i = 0; i < ranges.size(); ++i)
    if (piece.touches(ranges[i])) out.push_back(i);
  return out;
}
}  // namespace

std::vector<size_t> StageParams::units_of(const ir::Segment& piece) const { return touched(view_.facts->replication.units, piece); }

std::vector<size_t> StageParams::buckets_of(const ir::Segment& piece) const {
  return touched(view_.facts->replication.buckets, piece);
}

std::vector<size_t> StageParams::relative(const std::vector<int64_t>& shards) const {
  std::vector<size_t> out;
  for (int64_t o : shards) out.push_back(static_cast<size_t>(o - shards.front()));
  return out;
}

void StageParams::start_step() {
  torch::NoGradGuard no_grad;
  sequence_summed_ = false;
  if (grad_.defined()) grad_.zero_();
  if (expert_grad_.defined()) expert_grad_.zero_();
  if (view_.zero() >= 2)
    for (auto& g : shard_grad_) g.zero_();
  std::lock_guard lk(mu_);
  mb_grads_.clear();
  reduced_.assign(shard_grad_.size(), false);
  for (int h : holders_)
    if (h != 0) throw std::logic_error("a ZeRO-3 unit is still held at the start of a step");
}

void StageParams::begin_backward(const ir::Segment& piece, int32_t mb) {
  if (view_.zero() < 2) return;
  torch::NoGradGuard no_grad;
  const auto& buckets = view_.facts->replication.buckets;
  for (size_t b : buckets_of(piece)) {
    torch::Tensor buf;
    {
      std::lock_guard lk(mu_);
      auto [it, fresh] = mb_grads_.emplace(std::make_pair(mb, b), torch::Tensor());
      if (fresh) {
        MemScope scope(MemCategory::Grads);
        it->second = torch::zeros({buckets[b].size()}, f32_.dtype(bf16_ ? torch::kBFloat16 : torch::kFloat));
      }
      buf = it->second;
    }
    for (size_t i : params_in(buckets[b]))
      dense_[i].mutable_grad() = buf.narrow(0, offset_[i] - buckets[b].begin, dense_[i].numel()).view(dense_[i].sizes());
  }
}

void StageParams::end_backward(const ir::Segment& piece) {
  if (grad16_.defined()) {  // bf16: this piece's gradients into the fp32 accumulator, then start again
    torch::NoGradGuard no_grad;
    MemScope scope(MemCategory::Grads);
    std::vector<ir::Range> ranges{piece.dense};
    ranges.insert(ranges.end(), piece.tied.begin(), piece.tied.end());
    for (const ir::Range& range : ranges) {
      // In chunks: a mixed-precision add casts its bf16 operand to a temporary first.
      for (int64_t a = range.begin; a < range.end; a += kOptimizerChunk) {
        const int64_t n = std::min(kOptimizerChunk, range.end - a);
        grad_.narrow(0, a, n).add_(grad16_.narrow(0, a, n));
      }
      grad16_.narrow(0, range.begin, range.size()).zero_();
    }
    return;
  }
  if (view_.zero() < 2) return;
  // The buffers stay (held by mb_grads_) until their reduce-scatter; the parameters let go.
  for (size_t b : buckets_of(piece))
    for (size_t i : params_in(view_.facts->replication.buckets[b])) dense_[i].mutable_grad() = torch::Tensor();
}

void StageParams::all_reduce(size_t bucket) {
  const ir::Range b = view_.facts->replication.buckets[bucket];
  comm_.all_reduce_sum(grad_.data_ptr<float>() + b.begin, static_cast<size_t>(b.size()), view_.dp_group, kReplicaChannel);
}

// `mirror` (ALLREDUCE_C): the gradient summed with the stage's other copy, but for `skip` (ascending,
// disjoint: ties across stages, which their own sum completed). ZeRO 0: grad_ is whole; ZeRO-1/2:
// this member's shard of each bucket, which the copy's member at the same coordinate also holds.
// The experts this rank holds, the copy's rank at the same expert coordinate holds too.
void StageParams::sum_copies(const std::vector<int>& group, int channel, const std::vector<ir::Range>& skip) {
  if (expert_grad_.defined() && expert_grad_.numel() > 0)
    comm_.all_reduce_sum(expert_grad_.data_ptr<float>(), static_cast<size_t>(expert_grad_.numel()), group, channel);
  if (view_.zero() > 0) {
    const auto& buckets = view_.facts->replication.buckets;
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (std::find(skip.begin(), skip.end(), buckets[b]) != skip.end()) continue;  // a tie: a bucket of its own
      torch::Tensor& shard = shard_grad_[grad_shard_of_[b]];
      comm_.all_reduce_sum(shard.data_ptr<float>(), static_cast<size_t>(shard.numel()), group, channel);
    }
    return;
  }
  int64_t at = 0;
  auto sum = [&](int64_t end) {
    if (end > at) comm_.all_reduce_sum(grad_.data_ptr<float>() + at, static_cast<size_t>(end - at), group, channel);
  };
  for (const ir::Range& r : skip) {
    sum(r.begin);
    at = r.end;
  }
  sum(grad_.numel());
}

// How far this copy's parameters are from the other copy's: the sum over the pair of +p (the stage's
// own) and -p (the copy) is exactly zero where the two are bit-identical (x + -x == 0 for finite x).
// Under ZeRO-3 the parameters live as shards (each member the same elements in both copies); the
// experts held here are compared too.
double StageParams::copy_divergence(const std::vector<int>& group, int channel, bool is_copy) {
  torch::NoGradGuard no_grad;
  MemScope scope(MemCategory::Comm);
  double most = 0;
  std::vector<torch::Tensor> held_all = view_.zero() == 3 ? shard_param_ : std::vector<torch::Tensor>{flat_};
  if (expert_flat_.defined()) held_all.push_back(expert_flat_);
  for (const torch::Tensor& held : held_all) {
    torch::Tensor diff = is_copy ? -held : held.clone();
    comm_.all_reduce_sum(diff.data_ptr<float>(), static_cast<size_t>(diff.numel()), group, channel);
    if (diff.numel() > 0) most = std::max(most, diff.abs().max().item<double>());
  }
  return most;
}

void StageParams::reduce_scatter(size_t bucket, int32_t mb) {
  const ir::Range b = view_.facts->replication.buckets[bucket];
  torch::Tensor source;
  if (mb < 0) {
    source = grad_.narrow(0, b.begin, b.size());
  } else {
    std::lock_guard lk(mu_);
    source = mb_grads_.at({mb, bucket});
  }
  if (source.scalar_type() != torch::kFloat) {  // bf16 gradients are reduced in fp32
    MemScope scope(MemCategory::Comm);
    source = source.to(torch::kFloat);
  }
  const auto offsets = relative(view_.bucket_shards[bucket]);
  const size_t k = grad_shard_of_[bucket];
  torch::Tensor& shard = shard_grad_[k];
  // The first reduction of a bucket in a step lands in the (zeroed) shard itself; later microbatches
  // go through a scratch buffer and are added. ZeRO-1's shard is a view into the bucket it reduces,
  // so its result goes through scratch too.
  const bool direct = mb >= 0 && !reduced_[k];
  torch::Tensor out = shard;
  if (!direct) {
    MemScope scope(MemCategory::Comm);
    out = torch::empty({shard.numel()}, f32_);
  }
  comm_.reduce_scatter_sum(source.data_ptr<float>(), out.data_ptr<float>(), offsets, view_.dp_group, kReplicaChannel);
  torch::NoGradGuard no_grad;
  if (mb < 0) shard.copy_(out);
  else if (!direct) shard.add_(out);  // accumulate microbatches into the shard
  reduced_[k] = true;
  if (mb >= 0) {
    std::lock_guard lk(mu_);
    mb_grads_.erase({mb, bucket});  // the full bucket is no longer needed
  }
}

void StageParams::all_gather(size_t bucket) {
  const ir::Range b = view_.facts->replication.buckets[bucket];
  // The updated shard already sits in place inside the flat parameters.
  comm_.all_gather(nullptr, flat_.data_ptr<float>() + b.begin, relative(view_.bucket_shards[bucket]), view_.dp_group,
                   kReplicaChannel);
  if (bf16_) {
    torch::NoGradGuard no_grad;
    compute_.narrow(0, b.begin, b.size()).copy_(flat_.narrow(0, b.begin, b.size()));
  }
}

void StageParams::gather_unit(size_t u, int consumers) {
  const ir::Range unit = view_.facts->replication.units[u];
  torch::Tensor target;
  {
    std::lock_guard lk(mu_);
    MemScope scope(MemCategory::Gather);
    const int before = holders_[u];
    holders_[u] += consumers;  // each piece that uses this gather releases it once
    if (before == 0) {
      resize_storage(unit_[u], unit.size());
      target = unit_[u];
    } else {
      // Already materialized for another microbatch or direction: the values are the same, but
      // writing into storage a running piece reads would race; gather into a scratch buffer.
      target = torch::empty({unit.size()}, f32_.dtype(bf16_ ? torch::kBFloat16 : torch::kFloat));
    }
  }
  // The storage is written by the communicator (or a copy into the storage's own tensor), never
  // through the parameters, so the version counters the saved autograd graphs check stay as they
  // were (the FSDP technique). bf16 gathers the fp32 shards, then rounds them into the storage.
  torch::Tensor gathered = target;
  if (bf16_) {
    MemScope scope(MemCategory::Gather);
    gathered = torch::empty({unit.size()}, f32_);
  }
  comm_.all_gather(shard_param_[u].data_ptr<float>(), gathered.data_ptr<float>(), relative(view_.unit_shards[u]),
                   view_.dp_group, kReplicaChannel);
  if (bf16_) {
    torch::NoGradGuard no_grad;
    target.copy_(gathered);
  }
}

void StageParams::release_units(const ir::Segment& piece) {
  std::lock_guard lk(mu_);
  for (size_t u : units_of(piece))
    if (holders_[u] > 0 && --holders_[u] == 0) {
      if (before_release_) before_release_(unit_[u]);
      resize_storage(unit_[u], 0);
    }
}

void StageParams::update(double clip) {
  torch::NoGradGuard no_grad;
  const double ways = static_cast<double>(std::max<size_t>(1, view_.dp_group.size()));
  if (view_.replicated()) {  // the replicas' sum, averaged (and clipped: one multiplication)
    if (view_.zero() == 0) grad_.mul_(clip / ways);
    for (auto& g : shard_grad_) g.mul_(clip / ways);
  } else if (clip != 1.0 && grad_.defined()) {
    grad_.mul_(clip);
  }
  if (expert_grad_.defined() && (expert_replicas_ > 1 || clip != 1.0))
    expert_grad_.mul_(clip / static_cast<double>(expert_replicas_));
  optimizer_.step();
  if (bf16_ && view_.zero() == 0) compute_.copy_(flat_);  // ZeRO-1/2: as each bucket is gathered
}

torch::Tensor StageParams::tied_grad(int32_t tie) {
  const ir::StageFacts& f = *view_.facts;
  const auto slot = std::find_if(f.tied.begin(), f.tied.end(), [&](const ir::TiedSlot& t) { return t.tie == tie; });
  if (slot == f.tied.end()) throw std::logic_error(fmt::format("stage {} holds no copy of tie {}", view_.stage, tie));
  if (view_.zero() == 0) return grad_.narrow(0, slot->range.begin, slot->range.size());
  const auto& buckets = f.replication.buckets;
  const auto b = std::find(buckets.begin(), buckets.end(), slot->range);
  if (b == buckets.end()) throw std::logic_error(fmt::format("stage {}: tie {} is not a bucket of its own", view_.stage, tie));
  return shard_grad_[grad_shard_of_[static_cast<size_t>(b - buckets.begin())]];
}

void StageParams::mark_copies(const std::vector<size_t>& dense_indices) {
  copy_.assign(dense_.size(), false);
  for (size_t i : dense_indices) copy_.at(i) = true;
}

bool StageParams::is_copy(const ir::Range& r) const {
  for (size_t i = 0; i < copy_.size(); ++i)
    if (copy_[i] && r.begin >= offset_[i] && r.end <= offset_[i] + dense_[i].numel()) return true;
  return false;
}

std::pair<double, double> StageParams::checksum(bool owner_of_replicated) const {
  double sum = 0, sumsq = 0;
  auto add = [&](const torch::Tensor& t) {  // in chunks: a double copy of a whole stage would double its memory
    torch::NoGradGuard no_grad;
    const auto flat = t.detach().reshape({-1});
    for (int64_t a = 0; a < flat.numel(); a += kOptimizerChunk) {
      auto d = flat.narrow(0, a, std::min(kOptimizerChunk, flat.numel() - a)).to(torch::kDouble);
      sum += d.sum().item<double>();
      sumsq += (d * d).sum().item<double>();
    }
  };
  each_owned(owner_of_replicated, [&](const torch::Tensor& value, const torch::Tensor&, bool) { add(value); });
  return {sum, sumsq};
}

// What this rank owns, each element of the model once over all ranks: its shards of the storage
// layout, or (ZeRO 0) everything on the owner; a tied copy where its original is; its experts.
void StageParams::each_owned(bool owner_of_replicated, const OwnedFn& fn) const {
  const ir::Replication& rep = view_.facts->replication;
  const std::vector<ir::Range>& mine = view_.facts->storage.members[view_.member].stepped;
  // Under tensor parallelism the group's ranks hold the same replicated parameters (and experts):
  // only its leader counts them; every rank counts its slices. `at`: where `value` starts in the layout.
  auto owned = [&](int64_t at, const torch::Tensor& value, const torch::Tensor& grad) {
    if (view_.tp_leader) return fn(value, grad, false);
    const auto& slots = view_.facts->dense;
    for (const ir::ParamSlot& p : slots) {
      const int64_t a = std::max(at, p.offset), b = std::min(at + value.numel(), p.offset + p.numel);
      if (p.sliced && a < b) fn(value.narrow(0, a - at, b - a), grad.narrow(0, a - at, b - a), false);
    }
  };
  if (view_.zero() == 3) {
    for (size_t u = 0; u < shard_param_.size(); ++u)
      if (!is_copy(rep.units[u])) owned(view_.my_unit_shard(u).begin, shard_param_[u], shard_grad_[u]);
  } else if (view_.zero() > 0) {
    for (size_t b = 0; b < mine.size(); ++b)
      if (!is_copy(rep.buckets[b]))
        owned(mine[b].begin, flat_.narrow(0, mine[b].begin, mine[b].size()), shard_grad_[grad_shard_of_[b]]);
  } else if (owner_of_replicated) {
    for (size_t i = 0; i < dense_.size(); ++i)
      if (copy_.empty() || !copy_[i])
        owned(offset_[i], flat_.narrow(0, offset_[i], dense_[i].numel()), grad_.narrow(0, offset_[i], dense_[i].numel()));
  }
  if (expert_flat_.defined() && view_.tp_leader) fn(expert_flat_, expert_grad_, true);
}

void StageParams::sum_sequence_grads() {
  if (sequence_shared_.empty() || sequence_summed_) return;
  sequence_summed_ = true;
  torch::NoGradGuard no_grad;
  // The parts of what the optimizer steps (whole gradients or this rank's shards) that fall in the
  // ranges: the tensor-parallel ranks hold the same layout and shards, so the parts line up.
  std::vector<torch::Tensor> parts;
  const auto& slots = optimizer_.slots();
  for (size_t k = 0; k < slots.size(); ++k) {
    const auto [expert, at] = slot_at_[k];
    if (expert) continue;
    const int64_t end = at + slots[k].grad.numel();
    for (const ir::Range& r : sequence_shared_)
      if (const int64_t a = std::max(at, r.begin), b = std::min(end, r.end); a < b) parts.push_back(slots[k].grad.narrow(0, a - at, b - a));
  }
  if (parts.empty()) return;
  torch::Tensor all = torch::cat(parts);
  sum_over_tp_(all);
  int64_t off = 0;
  for (torch::Tensor& p : parts) {
    p.copy_(all.narrow(0, off, p.numel()));
    off += p.numel();
  }
}

double StageParams::grad_square_sum(bool owner_of_replicated) const {
  torch::NoGradGuard no_grad;
  // linalg_vector_norm reduces without a temporary (the norm of a norm-sized copy would double a
  // stage's gradient memory); its square in double, as torch's clip_grad_norm_ combines per-tensor norms.
  auto sq = [](const torch::Tensor& t) {
    const double n = at::linalg_vector_norm(t.detach().reshape({-1}), 2).item<double>();
    return n * n;
  };
  // The gradients are still the replicas' (or the expert group's) sums: their squares scaled to the mean's.
  const double ways = static_cast<double>(std::max<size_t>(1, view_.dp_group.size()));
  const double dense_scale = view_.replicated() ? 1.0 / (ways * ways) : 1.0;
  const double expert_scale = 1.0 / double(expert_replicas_ * expert_replicas_);
  double sum = 0;
  each_owned(owner_of_replicated, [&](const torch::Tensor&, const torch::Tensor& grad, bool expert) {
    sum += (expert ? expert_scale : dense_scale) * sq(grad);
  });
  return sum;
}

void StageParams::pieces(bool expert, int64_t at, const torch::Tensor& value, const torch::Tensor& m, const torch::Tensor& v,
                         std::vector<StatePiece>& out, bool saving) const {
  const std::vector<torch::Tensor>& params = expert ? experts_ : dense_;
  const Names& names = expert ? expert_names_ : dense_names_;
  const int64_t end = at + value.numel();
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t p0 = expert ? offset : offset_[i], n = params[i].numel();
    offset += n;
    const int64_t a = std::max(at, p0), b = std::min(end, p0 + n);
    const SliceOf slice = expert || slices_.empty() ? SliceOf{} : slices_[i];
    if (a >= b || (saving && !expert && !copy_.empty() && copy_[i])) continue;
    if (saving && !view_.tp_leader && !slice.sliced()) continue;  // the leader writes what the group holds alike
    auto part = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, a - at, b - a) : torch::Tensor(); };
    int64_t whole = n;
    if (slice.sliced()) whole = std::accumulate(slice.shape.begin(), slice.shape.end(), int64_t{1}, std::multiplies<>());
    out.push_back(StatePiece{names.at(i).first, names.at(i).second, whole, a - p0, b - p0, part(value), part(m), part(v), slice});
  }
}

std::vector<StatePiece> StageParams::saved_state(bool owner_of_replicated) const {
  std::vector<StatePiece> out;
  const bool replicated_whole = view_.zero() == 0;
  const auto& slots = optimizer_.slots();
  for (size_t k = 0; k < slots.size(); ++k) {
    const auto [expert, at] = slot_at_[k];
    if (!expert && replicated_whole && !owner_of_replicated) continue;
    pieces(expert, at, slots[k].param, slots[k].exp_avg, slots[k].exp_avg_sq, out, /*saving=*/true);
  }
  return out;
}

std::vector<StatePiece> StageParams::loaded_state() {
  std::vector<StatePiece> out;
  const auto& slots = optimizer_.slots();
  for (size_t k = 0; k < slots.size(); ++k)
    pieces(slot_at_[k].first, slot_at_[k].second, slots[k].param, slots[k].exp_avg, slots[k].exp_avg_sq, out);
  if (view_.zero() == 1 || view_.zero() == 2)  // the full parameters, beyond the shards
    pieces(false, 0, flat_, {}, {}, out);
  return out;
}

void StageParams::loaded(int64_t optimizer_steps) {
  torch::NoGradGuard no_grad;
  optimizer_.set_steps(optimizer_steps);
  if (bf16_ && compute_.defined()) compute_.copy_(flat_);  // the modules' bf16 copy of the masters
}

}  // namespace piper::runtime
