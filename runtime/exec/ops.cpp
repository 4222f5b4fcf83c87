// The executor's ops: a piece's forward and backward, the messages and collectives around them.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "runtime/device/memory_counter.h"
#include "runtime/exec/executor_impl.h"
#include "runtime/exec/experts.h"

namespace piper::runtime {

using ir::Node;
using ir::NodeId;
using ir::Op;

// The predecessor that feeds `v` its activation (forward) or output gradient (backward).
NodeId Executor::Impl::source(NodeId v, bool backward) const {
  const Node& n = node(v);
  for (NodeId u : data_preds[static_cast<size_t>(v)]) {
    const Node& x = node(u);
    const bool same_piece = x.stage == n.stage && x.segment == n.segment && x.microbatch == n.microbatch;
    if (!backward) {
      if ((x.op == Op::Recv && x.payload == ir::Payload::Act) || (x.op == Op::F && !same_piece) ||
          (x.op == Op::AllToAll && !(x.flags & ir::kBackward)))
        return u;
    } else {
      if ((x.op == Op::Recv && x.payload == ir::Payload::ActGrad) ||
          ((x.op == Op::B || x.op == Op::BI) && !same_piece) || (x.op == Op::AllToAll && (x.flags & ir::kBackward)))
        return u;
    }
  }
  throw std::logic_error(fmt::format("no {} for {}", backward ? "output gradient" : "input", ir::token(n)));
}

std::vector<int64_t> Executor::Impl::per_sample_shape(RegionId region, bool input) const {
  const auto& r = plan.manifest.regions[static_cast<size_t>(region)];
  const auto& spec = input ? r.input : r.output;
  if (!spec) throw std::runtime_error("the manifest has no activation shape for " + r.name);
  // Per-sample shapes lead with the sequence when they have one: a shorter --seq-len shortens it.
  std::vector<int64_t> s{view.samples_per_microbatch};
  for (size_t i = 0; i < spec->shape.size(); ++i)
    s.push_back(i == 0 && spec->shape[0] == model_seq ? seq : spec->shape[i]);
  return s;
}

LossFn Executor::Impl::loss_for(const Node& n) {
  if (!last_piece(n)) return {};
  const int64_t mb = n.microbatch, per = view.samples_per_microbatch;
  return [this, mb, per](const torch::Tensor& logits) {
    auto targets = tokens.slice(0, mb * per, (mb + 1) * per).slice(1, 1);
    // Each microbatch's mean (in fp32 whatever the compute precision), scaled so the microbatches
    // sum to the batch mean.
    const torch::Tensor l = logits.to(torch::kFloat);
    return at::cross_entropy_loss(l.reshape({-1, l.size(-1)}), targets.reshape({-1})) / static_cast<double>(view.microbatches);
  };
}

void Executor::Impl::forward(NodeId v) {
  const Node& n = node(v);
  PieceIO& io = io_of(n);
  const PieceModules& pm = modules_of(n);
  if (!pm.expert) {  // an expert piece's inputs were set by its dispatch
    if (n.stage == 0 && n.segment <= 0) {
      const int64_t per = view.samples_per_microbatch;
      io.inputs = {tokens.slice(0, n.microbatch * per, (n.microbatch + 1) * per).slice(1, 0, seq)};
    } else {
      io.inputs = {values[static_cast<size_t>(source(v, false))].at(0).detach().requires_grad_(true)};
    }
  }
  const LossFn loss = loss_for(n);
  std::optional<torch::NoGradGuard> no_graph;  // validation: nothing to differentiate
  if (evaluating) no_graph.emplace();
  run_forward(pm, io, !(n.flags & ir::kRecompute) && !evaluating, loss);
  // Consumers get the outputs' data, not their graph: the graph is the piece's own, freed by its
  // backward (half by BI), not whenever the last consumer of the values happens to run.
  auto& out = values[static_cast<size_t>(v)];
  out.clear();
  for (const auto& t : io.outputs) out.push_back(t.detach());
  if (loss) losses[static_cast<size_t>(v)] = io.outputs.at(0).item<double>();
  if (n.flags & ir::kFreeParams) params_of(n).release_units(g.segment_of(n));
}

void Executor::Impl::backward(NodeId v) {
  const Node& n = node(v);
  PieceIO& io = io_of(n);
  const PieceModules& pm = modules_of(n);
  std::vector<torch::Tensor> grads;
  if (n.op != Op::BW && !last_piece(n)) {
    const auto& from = values[static_cast<size_t>(source(v, true))];
    if (pm.moe_end) grads = {io.grad_residual, from.at(0), from.at(1)};
    else grads = {from.at(0)};
  }
  const ir::Segment& piece = g.segment_of(n);
  StageParams& sp = params_of(n);
  if (n.op != Op::BI) sp.begin_backward(piece, n.microbatch);
  run_backward(pm, io, n.op, std::move(grads), loss_for(n));
  // The input gradients live as long as their consumers need them (values), not the whole step.
  if (n.op != Op::BW) values[static_cast<size_t>(v)] = std::move(io.grad_inputs);
  io.grad_inputs.clear();
  if (n.op != Op::BI) sp.end_backward(piece);
  if (n.flags & ir::kFreeParams) sp.release_units(piece);
}

void Executor::Impl::all_to_all(NodeId v) {
  const Node& n = node(v);
  ExpertExchange x{comm, view.stages.at(n.stage).experts.at(n.segment), expert_channel(n.stream)};
  PieceIO &router = io_at(n, static_cast<int16_t>(n.segment - 1)), &expert = io_of(n);
  auto& out = values[static_cast<size_t>(v)];
  const bool back = n.flags & ir::kBackward;
  if (!back && n.payload == ir::Payload::Dispatch) {
    x.dispatch(router, expert);
    out = expert.inputs;
  } else if (!back) {
    out = {x.combine(router, expert)};
  } else if (n.payload == ir::Payload::Combine) {
    out = {x.combine_transpose(values[static_cast<size_t>(source(v, true))].at(0), router, expert)};
  } else {
    NodeId from = -1;  // the expert piece's input gradients
    for (NodeId u : data_preds[static_cast<size_t>(v)])
      if (node(u).op == Op::B || node(u).op == Op::BI) from = u;
    out = x.dispatch_transpose(values[static_cast<size_t>(from)], router, expert);
  }
}

void Executor::Impl::send(NodeId v) {
  NodeId from = data_preds[static_cast<size_t>(v)].at(0);
  torch::Tensor t = values[static_cast<size_t>(from)].at(0).detach().contiguous();
  auto [peer, tag] = view.peers[static_cast<size_t>(v)];
  if (blocking_sends) return comm.send(t.data_ptr(), static_cast<size_t>(t.nbytes()), peer, tag);
  auto started = comm.start_send(t.data_ptr(), static_cast<size_t>(t.nbytes()), peer, tag);
  std::lock_guard lk(sends_mu);
  in_flight.push_back({std::move(started), std::move(t), v});
}

std::function<bool(NodeId)> Executor::Impl::post_inline_sends() {
  if (queues || blocking_sends || std::getenv("PIPER_INLINE_SENDS") && std::string(std::getenv("PIPER_INLINE_SENDS")) == "0")
    return nullptr;
  return [this](NodeId v) { return node(v).op == Op::Send && !(fault && fault->hits(comm.rank(), cur_step, ir::token(node(v)))); };
}

// Lets go of the buffers of sends that are done. A failed one ends the op that noticed it, named.
void Executor::Impl::reap_sends() {
  std::lock_guard lk(sends_mu);
  for (size_t i = 0; i < in_flight.size();) {
    bool done = false;
    try {
      done = in_flight[i].send->done();
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{} (started earlier): {}", ir::token(node(in_flight[i].op)), e.what()));
    }
    if (!done) {
      ++i;
      continue;
    }
    in_flight[i] = std::move(in_flight.back());
    in_flight.pop_back();
  }
}

// A pass ends when its sends have: their peers received all. Watched as the job's own calls are.
void Executor::Impl::finish_sends() {
  std::vector<InFlight> left;
  {
    std::lock_guard lk(sends_mu);
    left.swap(in_flight);
  }
  if (left.empty()) return;
  calls->arm(fmt::format("in step {}, the last {} send{} of the step ({} first)", cur_step, left.size(),
                         left.size() > 1 ? "s" : "", ir::token(node(left.front().op))));
  for (auto& f : left) {
    try {
      f.send->wait();
    } catch (const std::exception& e) {
      calls->disarm();
      comm.abort(fmt::format("rank {}, step {}, op {} (started earlier): {}", comm.rank(), cur_step, ir::token(node(f.op)), e.what()));
    }
  }
  calls->disarm();
}

void Executor::Impl::recv(NodeId v) {
  const Node& n = node(v);
  // A received activation has the stage's input shape; a received gradient its output shape.
  const auto& regions = g.stage(n.stage).regions;
  const bool act = n.payload == ir::Payload::Act;
  torch::Tensor buf;
  {
    MemScope scope(MemCategory::Activations);
    const bool bf16 = g.stage(n.stage).precision == DType::BF16;
    buf = torch::empty(per_sample_shape(act ? regions.front() : regions.back(), act), on_device(bf16 ? torch::kBFloat16 : torch::kFloat));
  }
  auto [peer, tag] = view.peers[static_cast<size_t>(v)];
  comm.recv(buf.data_ptr(), static_cast<size_t>(buf.nbytes()), peer, tag);
  values[static_cast<size_t>(v)] = {buf};
}

// ALLREDUCE_T: the copies of a tied parameter on this rank's stages summed, then with the ranks
// at the other pipeline coordinates that hold copies; every copy gets the sum.
void Executor::Impl::sum_tied(int32_t tie) {
  const RankView::TieView& tv = view.ties.at(tie);
  std::vector<torch::Tensor> grads;
  for (int32_t s : tv.stages) grads.push_back(params.at(s)->tied_grad(tie));
  torch::NoGradGuard no_grad;
  for (size_t i = 1; i < grads.size(); ++i) grads[0].add_(grads[i]);
  if (tv.group.size() > 1)
    comm.all_reduce_sum(grads[0].data_ptr<float>(), static_cast<size_t>(grads[0].numel()), tv.group, kTieChannel);
  for (size_t i = 1; i < grads.size(); ++i) grads[i].copy_(grads[0]);
}

// ALLREDUCE_C (`mirror`): the stage's gradient summed with its other copy's, all but the parameters
// tied across stages, which ALLREDUCE_T already summed over every copy of every holder.
void Executor::Impl::sum_copies(int32_t stage) {
  if (drop_copy_sums) return;  // the equivalence test's negative control
  std::vector<ir::Range> skip;
  for (const ir::TiedSlot& t : g.stage(stage).tied)
    if (view.ties.count(t.tie)) skip.push_back(t.range);
  std::sort(skip.begin(), skip.end(), [](const ir::Range& a, const ir::Range& b) { return a.begin < b.begin; });
  params.at(stage)->sum_copies(view.stages.at(stage).copy_group, kMirrorChannel, skip);
}

// ALLREDUCE_N: every rank's share of the squared global norm (what it owns, each parameter once over
// all ranks) summed over everyone; the scale is torch's clip_grad_norm_'s, max / (norm + 1e-6) at most 1.
void Executor::Impl::global_norm() {
  double sq = 0;
  for (auto& [stage, sp] : params) {
    sp->sum_sequence_grads();  // final before they are counted
    if (!view.stages.at(stage).is_copy) sq += sp->grad_square_sum(view.replica == 0);  // a `mirror` copy: counted by the other
  }
  comm.all_reduce_sum(&sq, 1, everyone(comm), kNormChannel);
  grad_norm = std::sqrt(sq);
  const double max = opt.recipe.clip_grad_norm;
  clip_scale = std::isinf(max) ? 1.0 : std::min(1.0, max / (grad_norm + 1e-6));
}

// Runs an op, then lets go of what its predecessors produced once their last consumer ran, so
// boundary activations and gradients live as long as they are needed, not the whole step.
void Executor::Impl::run(NodeId v) {
  if (fault && fault->hits(comm.rank(), cur_step, ir::token(node(v))) && fault->act(node(v).op == Op::Send)) return;
  if (queues) queues->before(v);
  run_op(v);
  if (queues) {
    // What another stream allocated stays allocated until this stream is past v.
    const int k = queues->stream_of(v);
    for (NodeId u : data_preds[static_cast<size_t>(v)])
      if (queues->stream_of(u) != k)
        for (const auto& t : values[static_cast<size_t>(u)]) queues->used_by_current_stream(t);
    queues->after(v);
  }
  for (NodeId u : data_preds[static_cast<size_t>(v)])
    if (--unread[static_cast<size_t>(u)] == 0) values[static_cast<size_t>(u)].clear();
  if (!blocking_sends) reap_sends();
}

std::string Executor::Impl::describe_peers(NodeId v, const HostMap& hosts) const {
  const Node& n = node(v);
  if (ir::is_chunk(n.op)) return "";
  auto host = [&](int r) { return hosts.names[size_t(hosts.host_of[size_t(r)])]; };
  if (n.op == Op::Send || n.op == Op::Recv) {
    const int peer = view.peers[size_t(v)].first;
    return fmt::format("{} {}", n.op == Op::Send ? "to" : "from", hosts.rank_label(peer));
  }
  const std::vector<int32_t> group = g.facts.mesh.group_along(comm.rank(), n.axis);
  if (group.size() < 2) return "";
  std::vector<std::string> names;
  for (int32_t r : group)
    if (std::find(names.begin(), names.end(), host(r)) == names.end()) names.push_back(host(r));
  return fmt::format("with ranks {}{}", fmt::join(group, ", "),
                     hosts.count() > 1 ? fmt::format(" on host{} {}", names.size() > 1 ? "s" : "", fmt::join(names, ", ")) : "");
}

void Executor::Impl::run_op(NodeId v) {
  const Node& n = node(v);
  switch (n.op) {
    case Op::F: return forward(v);
    case Op::B:
    case Op::BI:
    case Op::BW: return backward(v);
    case Op::U:
      params_of(n).sum_sequence_grads();
      return params_of(n).update(clip_scale);
    case Op::Send: return send(v);
    case Op::Recv: return recv(v);
    case Op::AllReduce:
      if (n.payload == ir::Payload::Tied) return sum_tied(n.bucket);
      if (n.payload == ir::Payload::Norm) return global_norm();
      if (n.payload == ir::Payload::Copy) return sum_copies(n.stage);
      return params_of(n).all_reduce(static_cast<size_t>(n.bucket));
    case Op::ReduceScatter: return params_of(n).reduce_scatter(static_cast<size_t>(n.bucket), n.microbatch);
    case Op::AllGather:
      if (n.flags & ir::kMaterialize)
        return params_of(n).gather_unit(static_cast<size_t>(n.bucket), consumers[static_cast<size_t>(v)]);
      return params_of(n).all_gather(static_cast<size_t>(n.bucket));
    case Op::AllToAll: return all_to_all(v);
    case Op::Broadcast: break;
  }
  throw std::runtime_error(fmt::format("{} is not supported by the runtime yet", ir::op_name(n.op)));
}

}  // namespace piper::runtime
