#include "runtime/exec/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <set>

#include "runtime/device/device_memory.h"
#include "runtime/exec/executor_impl.h"
#include "runtime/model/region_model_impl.h"
#include "runtime/view/device_streams.h"

namespace piper::runtime {

using ir::Node;
using ir::NodeId;
using ir::Op;

namespace {
// Plan tags stay below this; the runtime's own messages (the trace) use tags above it.
constexpr int kPlanTagLimit = (1 << 30) - 1;

torch::Device device_of(const std::string& name) {
  try {
    return torch::Device(name);
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("--device '{}': expected cpu, cuda or cuda:N", name));
  }
}

std::unique_ptr<DeviceQueues> make_queues(const sched::Plan& plan, const RankView& view, const ExecutorOptions& opt,
                                          const torch::Device& dev) {
  const std::string on = !opt.stream_device.empty() ? opt.stream_device : dev.is_cpu() ? "" : opt.device;
  if (on.empty()) return nullptr;
  return std::make_unique<DeviceQueues>(on, plan_device_streams(plan, view), plan.dag.nodes.size());
}
}  // namespace

Executor::Impl::Impl(const sched::Plan& p, const std::string& path, const TokenData& d, Communicator& c, ExecutorOptions o)
    : plan(p), g(p.dag), data(d), opt(std::move(o)), model(path),
      view(make_rank_view(p, c.rank(), c.size(), std::min(c.max_tag(), kPlanTagLimit))), dev(device_of(opt.device)),
      queues(make_queues(p, view, opt, dev)), synced(queues ? make_device_synced_communicator(c, *queues) : nullptr),
      comm(synced ? *synced : c), model_path(path) {}

void Executor::Impl::setup() {
  set_memory_rank(comm.rank());
  plain_interpreter();
  auto& impl = model.impl();
  // The whole model moves before the stages take their weights (their flat buffers follow the
  // weights' device); the regions this rank does not hold are released there as here.
  if (!dev.is_cpu()) impl.root.to(dev);
  // Training mode (dropout as the model says), with a per-rank seed: reproducible run to run under
  // one strategy; masks differ between strategies, so they agree only where dropout is 0.
  impl.root.train(true);
  torch::manual_seed(opt.seed * 1000003ull + static_cast<uint64_t>(comm.rank()));
  check_inputs();
  assemble_stages();
  // Limits first: a communicator is made with its multiprocessor cap (`sms`) or not at all.
  for (const auto& [key, sms] : view.group_sms) comm.limit_sms(key.first, key.second, sms);
  for (const auto& [group, channel] : view.groups) comm.prepare_group(group, channel);
  index_dataflow();
  threads = std::make_unique<StreamThreads>(g, view.program(plan), view.local_preds, comm.rank(), [this](size_t k) {
    plain_interpreter();
    if (queues) queues->enter(k);
  });
  threads->set_op_timeout(opt.op_timeout);
  const HostMap hosts = comm.hosts();
  calls = std::make_unique<CallWatch>(opt.op_timeout, hosts.rank_label(comm.rank()),
                                      [this](const std::string& why) { comm.abort(why); });
  threads->set_describe([this, hosts](ir::NodeId v) { return describe_peers(v, hosts); });
  // Tensor-parallel pieces sum partials with their peers in program order: inside an overlap window
  // too (the first ready would differ between the peers).
  threads->set_in_order(queues != nullptr || !tensor_groups.empty() || !context_groups.empty());
  // This thread filled the flat buffers on its own stream; the op streams do not wait for it.
  if (queues) queues->synchronize_current();
  fault = parse_fault(std::getenv("PIPER_FAULT"));
  if (const char* b = std::getenv("PIPER_BLOCKING_SENDS")) blocking_sends = std::string(b) == "1";
  if (const auto inline_sends = post_inline_sends()) threads->set_post_inline(inline_sends);
}

// The run's sequence length, data and batch against the model and the plan, before anything is built.
void Executor::Impl::check_inputs() {
  auto& impl = model.impl();
  seq = model_seq = impl.seq_len;
  if (opt.seq_len > 0) {
    if (opt.seq_len > seq)
      throw std::runtime_error(fmt::format("--seq-len {} is longer than the model's sequence length {}", opt.seq_len, seq));
    seq = opt.seq_len;
  }
  // A token past the model's vocabulary would fail deep in an embedding: say so up front.
  if (impl.vocab > 0 && data.vocab() > impl.vocab)
    if (auto [t, at] = data.max_token(); t >= impl.vocab)
      throw std::runtime_error(fmt::format("the data has token {} (at position {}) but the model's vocabulary is {}", t, at,
                                           impl.vocab));
  if (opt.global_batch % (view.replicas * view.microbatches) != 0)
    throw std::runtime_error(fmt::format("--batch-size {} does not split into {} replicas × {} microbatches", opt.global_batch,
                                         view.replicas, view.microbatches));
}

// Per node, its data predecessors on this rank and how many consumers its values have here.
void Executor::Impl::index_dataflow() {
  data_preds.assign(g.nodes.size(), {});
  consumers.assign(g.nodes.size(), 0);
  // What keeps a value alive (ir::holds_value), as the memory model prices it.
  for (const auto& e : g.edges)
    if (ir::holds_value(g, e) && view.mine(plan, e.src) && view.mine(plan, e.dst)) {
      data_preds[static_cast<size_t>(e.dst)].push_back(e.src);
      ++consumers[static_cast<size_t>(e.src)];
    }
  unread = std::make_unique<std::atomic<int>[]>(g.nodes.size());
}

// What a pass through the program (a step, a validation batch) starts from: each piece's I/O slot,
// no values, every value's consumers still to run.
void Executor::Impl::begin_pass() {
  pieces_io.clear();
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (view.mine(plan, static_cast<NodeId>(v)))
      pieces_io[{node(NodeId(v)).stage, node(NodeId(v)).microbatch, node(NodeId(v)).segment}];
  values.assign(g.nodes.size(), {});
  losses.assign(g.nodes.size(), 0.0);
  for (size_t v = 0; v < g.nodes.size(); ++v) unread[v] = consumers[v];
}

// The pass's loss: it lives on the last stage's ranks; summed over everyone (a tensor-parallel
// group's leader speaking for it), averaged over replicas.
double Executor::Impl::pass_loss() {
  double loss = 0;
  for (size_t v = 0; view.tp_leader && v < g.nodes.size(); ++v) {
    const Node& n = node(NodeId(v));
    if (n.op == Op::F && last_piece(n) && view.mine(plan, NodeId(v))) loss += losses[v];
  }
  calls->arm(fmt::format("in step {}, the loss's all-reduce{} ({})", cur_step, evaluating ? " (validation)" : "",
                         comm.hosts().everyone_label(comm.size())));
  comm.all_reduce_sum(&loss, 1, everyone(comm), kRuntimeChannel);
  calls->disarm();
  return loss / static_cast<double>(view.replicas);
}

void Executor::Impl::end_pass() {
  values.assign(g.nodes.size(), {});
  pieces_io.clear();
  tokens = torch::Tensor();
}

StepResult Executor::Impl::step(int64_t s) {
  StepResult res;
  cur_step = s + 1;
  auto t0 = std::chrono::steady_clock::now();
  reset_memory_peak(comm.rank());
  if (!dev.is_cpu()) reset_device_memory_peak(opt.device);
  const int64_t per_replica = opt.global_batch / view.replicas;
  {
    MemScope scope(MemCategory::Activations);
    auto batch = data.batch(opt.seed, static_cast<uint64_t>(s), opt.global_batch, view.replica * per_replica,
                            per_replica, seq);
    const torch::Tensor host = torch::from_blob(batch.data(), {per_replica, seq + 1}, torch::kLong);
    tokens = dev.is_cpu() ? host.clone() : host.to(dev);
  }
  res.lr = opt.recipe.lr_at(opt.lr, s);  // the schedule: every stage steps at this step's rate
  grad_norm = -1;
  clip_scale = 1;
  for (auto& [stage, sp] : params) {
    sp->start_step();
    sp->set_lr(res.lr);
  }
  if (queues) queues->synchronize_current();  // the zeroed gradients, before any op stream adds to them
  auto ring_sent = [this] {
    int64_t b = 0;
    for (const auto& [stage, g] : context_groups) b += comm.bytes_sent(g.channel);
    return b;
  };
  const int64_t ring_before = ring_sent();
  begin_pass();
  std::string failure = threads->run(s + 1, [this](NodeId v) { run(v); },
                                     [this](const std::string& msg) { comm.abort(msg); }, &res.ops);
  if (!failure.empty()) comm.abort(failure);
  finish_sends();
  res.ops_began = std::chrono::duration<double>(threads->began().time_since_epoch()).count();
  if (queues) queues->synchronize();  // the step ends when its kernels have, not its launches

  res.ring_bytes = ring_sent() - ring_before;
  res.loss = pass_loss();
  res.grad_norm = grad_norm;
  end_pass();
  res.memory = memory_stats(comm.rank());
  if (!dev.is_cpu())  // the device's tensors: its allocator's figures, where this LibTorch gives them
    if (auto m = device_memory_stats(opt.device)) res.memory = *m;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void set_intra_op_threads(int n) { torch::set_num_threads(n); }

std::vector<std::string> Executor::unsupported(const sched::Plan& plan) {
  std::set<std::string> out;
  for (const Node& n : plan.dag.nodes)
    if (n.op == Op::Broadcast) out.insert("broadcast");
  for (const auto& st : plan.dag.facts.stages) {
    // Expert pieces exchange fp32 tokens and gates; silently training them in fp32 would mislead.
    if (st.precision != DType::F32 && !st.experts.empty()) out.insert("precision bf16 together with expert parallelism");
    if (st.precision != DType::F32 && st.precision != DType::BF16) out.insert("precision other than fp32 and bf16");
    if (st.precision != plan.dag.facts.stages.front().precision) out.insert("stages of different precisions");
    const auto& rep = st.replication;
    int64_t covered = 0;
    for (const auto& b : rep.buckets) covered += b.size();
    if (rep.axis >= 0 && covered != st.dense_elems) out.insert("replicating part of a stage");
  }
  return {out.begin(), out.end()};
}

Executor::Executor(const sched::Plan& plan, const std::string& model_path, const TokenData& data, Communicator& comm,
                   ExecutorOptions options) {
  auto missing = unsupported(plan);
  if (!missing.empty())
    throw std::runtime_error(fmt::format("this plan uses what the runtime does not execute yet: {}",
                                         fmt::join(missing, ", ")));
  // The norm's all-reduce is part of the plan (the simulator prices it): plan and recipe must agree.
  const bool normed = std::any_of(plan.dag.nodes.begin(), plan.dag.nodes.end(),
                                  [](const Node& n) { return n.payload == ir::Payload::Norm; });
  if (normed != (options.recipe.clip_grad_norm > 0))
    throw std::logic_error(normed ? "the plan clips by the global norm but the recipe sets no --clip-grad-norm"
                                  : "--clip-grad-norm needs a plan compiled with the global norm (PlanOptions::global_norm)");
  impl_ = std::make_unique<Impl>(plan, model_path, data, comm, std::move(options));
  impl_->setup();
}

Executor::~Executor() = default;

StepResult Executor::step(int64_t step) { return impl_->step(step); }

std::string Executor::report_now() const {
  const std::string streams = impl_->threads ? impl_->threads->report_now() : "";
  return streams.empty() && impl_->calls ? impl_->calls->current() : streams;
}

CallWatch& Executor::calls() { return *impl_->calls; }

std::pair<double, double> Executor::param_checksum() {
  double sums[2] = {0, 0};
  for (auto& [stage, sp] : impl_->params) {
    if (impl_->view.stages.at(stage).is_copy) continue;  // `mirror`: counted where the stage is its own
    auto [s, q] = sp->checksum(impl_->view.replica == 0);
    sums[0] += s;
    sums[1] += q;
  }
  impl_->comm.all_reduce_sum(sums, 2, everyone(impl_->comm), kRuntimeChannel);
  return {sums[0], sums[1]};
}

double Executor::copy_divergence() {
  if (impl_->plan.dag.facts.mirror_from < 0) return -1;
  double worst = 0;
  for (auto& [stage, sp] : impl_->params) {  // by stage: a pair of ranks compares its stages in one order
    const StageView& sv = impl_->view.stages.at(stage);
    if (!sv.copy_group.empty()) worst = std::max(worst, sp->copy_divergence(sv.copy_group, kMirrorChannel, sv.is_copy));
  }
  impl_->comm.all_reduce_sum(&worst, 1, everyone(impl_->comm), kRuntimeChannel);  // zero only if zero everywhere
  return worst;
}

}  // namespace piper::runtime
