#include "runtime/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "runtime/checkpoint.h"
#include "runtime/chunk_runner.h"
#include "runtime/device_memory.h"
#include "runtime/device_queues.h"
#include "runtime/device_streams.h"
#include "runtime/experts.h"
#include "runtime/rank_view.h"
#include "runtime/region_model.h"
#include "runtime/region_model_impl.h"
#include "runtime/stage_params.h"

namespace piper::runtime {

using ir::Node;
using ir::NodeId;
using ir::Op;

namespace {
// Plan tags stay below this; the runtime's own messages (the trace) use tags above it.
constexpr int kPlanTagLimit = (1 << 30) - 1;
}  // namespace

struct Executor::Impl {
  const sched::Plan& plan;
  const ir::Graph& g;
  const TokenData& data;
  ExecutorOptions opt;
  RegionModel model;
  RankView view;
  torch::Device dev;
  // On a device: its streams and events, and the communicator that synchronizes before the library
  // touches device memory (the ops use `comm`, which is that one then).
  std::unique_ptr<DeviceQueues> queues;
  std::unique_ptr<Communicator> synced;
  Communicator& comm;
  int64_t seq = 0, model_seq = 0;  // tokens per sample, run and as the model was made
  std::map<int32_t, std::unique_ptr<StageParams>> params;  // per held stage
  std::map<int32_t, std::vector<PieceModules>> pieces;     // per held stage, per segment
  std::vector<std::vector<NodeId>> data_preds;             // per node: its data predecessors on this rank
  std::vector<int> consumers;                              // per node: its data successors on this rank
  std::unique_ptr<StreamThreads> threads;

  // Per step: what each piece holds between its ops, and what each op produced for its consumers.
  std::map<std::tuple<int32_t, int32_t, int16_t>, PieceIO> pieces_io;
  std::vector<std::vector<torch::Tensor>> values;
  std::unique_ptr<std::atomic<int>[]> unread;  // consumers of each node's values still to run
  std::vector<double> losses;                  // per node: the loss a last forward piece computed
  torch::Tensor tokens;  // this replica's samples of the step: [replica batch, seq + 1]

  std::string model_path;
  int64_t cur_step = 0;  // 1-based, for fault injection
  // Fault injection for tests (PIPER_FAULT=RANK:STEP:TOKEN:fail|stall|drop): op TOKEN of 1-based
  // STEP on RANK throws, never returns, or (a send) is not sent.
  struct Fault {
    int rank = -1;
    int64_t step = 0;
    std::string token, kind;
  };
  std::optional<Fault> fault;
  static std::optional<Fault> parse_fault(const char* spec) {
    if (!spec || !*spec) return std::nullopt;
    Fault f;
    std::vector<std::string> parts;
    std::string cur;
    for (const char* c = spec;; ++c) {
      if (*c == ':' || *c == 0) {
        parts.push_back(cur);
        cur.clear();
        if (*c == 0) break;
      } else {
        cur += *c;
      }
    }
    const auto number = [](const std::string& t) {
      return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos && t.size() < 10;
    };
    if (parts.size() != 4 || !number(parts[0]) || !number(parts[1]) ||
        (parts[3] != "fail" && parts[3] != "stall" && parts[3] != "drop"))
      throw std::runtime_error(fmt::format("PIPER_FAULT='{}': expected RANK:STEP:TOKEN:fail|stall|drop", spec));
    f.rank = std::stoi(parts[0]);
    f.step = std::stoll(parts[1]);
    f.token = parts[2];
    f.kind = parts[3];
    return f;
  }

  Impl(const sched::Plan& p, const std::string& path, const TokenData& d, Communicator& c, ExecutorOptions o)
      : plan(p), g(p.dag), data(d), opt(std::move(o)), model(path),
        view(make_rank_view(p, c.rank(), c.size(), std::min(c.max_tag(), kPlanTagLimit))), dev(device_of(opt.device)),
        queues(make_queues()), synced(queues ? make_device_synced_communicator(c, *queues) : nullptr),
        comm(synced ? *synced : c), model_path(path) {}

  static torch::Device device_of(const std::string& name) {
    try {
      return torch::Device(name);
    } catch (const std::exception&) {
      throw std::runtime_error(fmt::format("--device '{}': expected cpu, cuda or cuda:N", name));
    }
  }
  std::unique_ptr<DeviceQueues> make_queues() const {
    const std::string on = !opt.stream_device.empty() ? opt.stream_device : dev.is_cpu() ? "" : opt.device;
    if (on.empty()) return nullptr;
    return std::make_unique<DeviceQueues>(on, plan_device_streams(plan, view), g.nodes.size());
  }
  torch::TensorOptions on_device(torch::ScalarType t = torch::kFloat) const {
    return torch::TensorOptions().dtype(t).device(dev);
  }

  const Node& node(NodeId v) const { return g.nodes[static_cast<size_t>(v)]; }
  PieceIO& io_of(const Node& n) { return pieces_io.at({n.stage, n.microbatch, n.segment}); }
  PieceIO& io_at(const Node& n, int16_t segment) { return pieces_io.at({n.stage, n.microbatch, segment}); }
  StageParams& params_of(const Node& n) { return *params.at(n.stage); }
  const PieceModules& modules_of(const Node& n) {
    return pieces.at(n.stage).at(static_cast<size_t>(n.segment < 0 ? 0 : n.segment));
  }
  bool last_piece(const Node& n) const {
    return n.stage == view.last_stage && (n.segment < 0 || size_t(n.segment) + 1 == g.stage(n.stage).segments.size());
  }

  // ------------------------------------------------------------------ setup
  void setup() {
    set_memory_rank(comm.rank());
    plain_interpreter();
    auto& impl = model.impl();
    // The whole model moves before the stages take their weights (their flat buffers follow the
    // weights' device); the regions this rank does not hold are released below, there as here.
    if (!dev.is_cpu()) impl.root.to(dev);
    // Training mode (dropout as the model says), with a per-rank seed: reproducible run to run under
    // one strategy; masks differ between strategies, so they agree only where dropout is 0.
    impl.root.train(true);
    torch::manual_seed(opt.seed * 1000003ull + static_cast<uint64_t>(comm.rank()));
    seq = model_seq = impl.seq_len;
    if (opt.seq_len > 0) {
      if (opt.seq_len > seq)
        throw std::runtime_error(fmt::format("--seq-len {} is longer than the model's sequence length {}", opt.seq_len, seq));
      seq = opt.seq_len;
    }
    // A token past the model's vocabulary would fail deep in an embedding: say so up front.
    if (impl.vocab > 0 && data.vocab() > impl.vocab)
      if (auto [t, at] = data.max_token(); t >= impl.vocab)
        throw std::runtime_error(fmt::format("the data has token {} (at position {}) but the model's vocabulary is {}", t,
                                             at, impl.vocab));
    if (opt.global_batch % (view.replicas * view.microbatches) != 0)
      throw std::runtime_error(fmt::format("--batch-size {} does not split into {} replicas × {} microbatches",
                                           opt.global_batch, view.replicas, view.microbatches));
    const Manifest& m = plan.manifest;
    auto region = [&](RegionId r) { return impl.region(m.regions[static_cast<size_t>(r)].name); };
    std::set<std::string> kept;  // regions whose weights this rank keeps
    std::set<int32_t> tied_here;  // ties a stage on this rank already holds
    for (auto& [stage, sv] : view.stages) {
      const ir::StageFacts& f = *sv.facts;
      std::vector<torch::Tensor> dense, experts;
      StageParams::Names dense_names, expert_names;
      std::vector<size_t> copies;
      for (const ir::ParamSlot& slot : f.dense) {
        const ParamSpec& spec = m.regions[static_cast<size_t>(slot.region)].params[static_cast<size_t>(slot.index)];
        torch::Tensor t = module_parameter(region(slot.region), spec.name);
        std::string rname = m.regions[static_cast<size_t>(slot.region)].name, pname = spec.name;
        if (const int32_t tie = m.tie_of(slot.region, slot.index); tie >= 0) {
          // Another stage here holds the tensor: this one trains a copy of its own (its flat layout
          // owns its storage), kept equal by ALLREDUCE_T. Checkpoints know it by the tie's first name.
          if (!tied_here.insert(tie).second) {
            torch::NoGradGuard no_grad;
            t = t.detach().clone();
            set_module_parameter(region(slot.region), spec.name, t);
          }
          const TiedParam& canon = m.ties[static_cast<size_t>(tie)].members.front();
          if (canon.region != slot.region) copies.push_back(dense.size());
          rname = m.regions[static_cast<size_t>(canon.region)].name;
          pname = m.regions[static_cast<size_t>(canon.region)].params[static_cast<size_t>(canon.index)].name;
        }
        dense.push_back(t);
        dense_names.emplace_back(rname, pname);
      }
      int64_t expert_replicas = 1;
      std::vector<PieceModules> ps;
      for (size_t j = 0; j < f.segments.size(); ++j) {
        const ir::Segment& seg = f.segments[j];
        PieceModules pm;
        if (seg.sharded >= 0) {
          const auto& ex = sv.experts.at(static_cast<int32_t>(j));
          pm.expert = true;
          for (int64_t e : ex.owned) {
            const RegionId member = ex.shard->members[static_cast<size_t>(e)];
            auto mod = region(member);
            pm.experts.emplace_back(e, mod);
            for (const auto& p : mod.named_parameters()) {
              experts.push_back(p.value);
              expert_names.emplace_back(m.regions[static_cast<size_t>(member)].name, p.name);
            }
            kept.insert(m.regions[static_cast<size_t>(member)].name);
          }
          expert_replicas = static_cast<int64_t>(ex.group.size());
        } else {
          for (RegionId r : seg.regions) {
            const bool ends_moe = j + 1 < f.segments.size() && f.segments[j + 1].sharded >= 0 &&
                                  m.is_ancestor(r, f.segments[j + 1].sharded);
            if (ends_moe) {
              pm.moe_end = true;
              pm.attn = region(child_of_kind(r, "attention"));
              pm.router = region(child_of_kind(r, "router"));
            } else {
              pm.plain.push_back(region(r));
            }
          }
        }
        ps.push_back(std::move(pm));
      }
      for (const ir::ParamSlot& slot : f.dense) kept.insert(m.regions[static_cast<size_t>(slot.region)].name);
      pieces[stage] = std::move(ps);
      params[stage] = std::make_unique<StageParams>(sv, std::move(dense), std::move(experts), expert_replicas,
                                                    OptimizerOptions{opt.optimizer, opt.lr}, comm, std::move(dense_names),
                                                    std::move(expert_names));
      if (!copies.empty()) params[stage]->mark_copies(copies);
      if (queues)
        params[stage]->set_before_release([this](const torch::Tensor& t) { queues->used_by_current_stream(t); });
    }
    // Weights of regions this rank does not hold are released: the archive is read whole (TorchScript
    // has no partial load), but only the owned stages' weights (and experts) stay in memory.
    for (size_t r = 1; r < m.regions.size(); ++r) {
      if (kept.count(m.regions[r].name) || m.regions[r].params.empty()) continue;
      auto mod = impl.region(m.regions[r].name);
      for (const auto& spec : m.regions[r].params) set_module_parameter(mod, spec.name, torch::empty({0}));
    }
    for (const auto& [group, channel] : view.groups) comm.prepare_group(group, channel);
    data_preds.assign(g.nodes.size(), {});
    consumers.assign(g.nodes.size(), 0);
    // BW reads neither its forward's outputs nor its BI's input gradients (it starts from what BI
    // left in the graph), so those edges keep nothing alive; the memory model counts the same way.
    auto unread_by_bw = [&](const ir::Edge& e) {
      return node(e.dst).op == Op::BW && (node(e.src).op == Op::F || node(e.src).op == Op::BI);
    };
    for (const auto& e : g.edges)
      if (e.kind == ir::EdgeKind::Data && view.mine(plan, e.src) && view.mine(plan, e.dst) && !unread_by_bw(e)) {
        data_preds[static_cast<size_t>(e.dst)].push_back(e.src);
        ++consumers[static_cast<size_t>(e.src)];
      }
    unread = std::make_unique<std::atomic<int>[]>(g.nodes.size());
    threads = std::make_unique<StreamThreads>(g, view.program(plan), view.local_preds, comm.rank(), [this](size_t k) {
      plain_interpreter();
      if (queues) queues->enter(k);
    });
    threads->set_op_timeout(opt.op_timeout);
    threads->set_in_order(queues != nullptr);
    // This thread filled the flat buffers on its own stream; the op streams do not wait for it.
    if (queues) queues->synchronize_current();
    fault = parse_fault(std::getenv("PIPER_FAULT"));
  }

  // The child region of `under` with this kind (attention, router).
  RegionId child_of_kind(RegionId under, const std::string& kind) const {
    const auto& m = plan.manifest;
    for (size_t r = 0; r < m.regions.size(); ++r)
      if (m.regions[r].kind == kind && m.is_ancestor(under, static_cast<RegionId>(r))) return static_cast<RegionId>(r);
    throw std::runtime_error(fmt::format("expert parallelism: '{}' has no {} region (the runtime runs the zoo's "
                                         "MoE contract, docs/models.md)",
                                         m.regions[static_cast<size_t>(under)].name, kind));
  }

  // ------------------------------------------------------------------ dataflow
  // The predecessor that feeds `v` its activation (forward) or output gradient (backward).
  NodeId source(NodeId v, bool backward) const {
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

  std::vector<int64_t> per_sample_shape(RegionId region, bool input) const {
    const auto& r = plan.manifest.regions[static_cast<size_t>(region)];
    const auto& spec = input ? r.input : r.output;
    if (!spec) throw std::runtime_error("the manifest has no activation shape for " + r.name);
    // Per-sample shapes lead with the sequence when they have one: a shorter --seq-len shortens it.
    std::vector<int64_t> s{view.samples_per_microbatch};
    for (size_t i = 0; i < spec->shape.size(); ++i)
      s.push_back(i == 0 && spec->shape[0] == model_seq ? seq : spec->shape[i]);
    return s;
  }

  LossFn loss_for(const Node& n) {
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

  void forward(NodeId v) {
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
    run_forward(pm, io, !(n.flags & ir::kRecompute), loss);
    // Consumers get the outputs' data, not their graph: the graph is the piece's own, freed by its
    // backward (half by BI), not whenever the last consumer of the values happens to run.
    auto& out = values[static_cast<size_t>(v)];
    out.clear();
    for (const auto& t : io.outputs) out.push_back(t.detach());
    if (loss) losses[static_cast<size_t>(v)] = io.outputs.at(0).item<double>();
    if (n.flags & ir::kFreeParams) params_of(n).release_units(g.segment_of(n).dense);
  }

  void backward(NodeId v) {
    const Node& n = node(v);
    PieceIO& io = io_of(n);
    const PieceModules& pm = modules_of(n);
    std::vector<torch::Tensor> grads;
    if (n.op != Op::BW && !last_piece(n)) {
      const auto& from = values[static_cast<size_t>(source(v, true))];
      if (pm.moe_end) grads = {io.grad_residual, from.at(0), from.at(1)};
      else grads = {from.at(0)};
    }
    const ir::Range range = g.segment_of(n).dense;
    StageParams& sp = params_of(n);
    if (n.op != Op::BI) sp.begin_backward(range, n.microbatch);
    run_backward(pm, io, n.op, std::move(grads), loss_for(n));
    // The input gradients live as long as their consumers need them (values), not the whole step.
    if (n.op != Op::BW) values[static_cast<size_t>(v)] = std::move(io.grad_inputs);
    io.grad_inputs.clear();
    if (n.op != Op::BI) sp.end_backward(range);
    if (n.flags & ir::kFreeParams) sp.release_units(range);
  }

  void all_to_all(NodeId v) {
    const Node& n = node(v);
    ExpertExchange x{comm, view.stages.at(n.stage).experts.at(n.segment)};
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

  void send(NodeId v) {
    NodeId from = data_preds[static_cast<size_t>(v)].at(0);
    torch::Tensor t = values[static_cast<size_t>(from)].at(0).detach().contiguous();
    auto [peer, tag] = view.peers[static_cast<size_t>(v)];
    comm.send(t.data_ptr(), static_cast<size_t>(t.nbytes()), peer, tag);
  }

  void recv(NodeId v) {
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
  void sum_tied(int32_t tie) {
    const RankView::TieView& tv = view.ties.at(tie);
    std::vector<torch::Tensor> grads;
    for (int32_t s : tv.stages) grads.push_back(params.at(s)->tied_grad(tie));
    torch::NoGradGuard no_grad;
    for (size_t i = 1; i < grads.size(); ++i) grads[0].add_(grads[i]);
    if (tv.group.size() > 1)
      comm.all_reduce_sum(grads[0].data_ptr<float>(), static_cast<size_t>(grads[0].numel()), tv.group, kTieChannel);
    for (size_t i = 1; i < grads.size(); ++i) grads[i].copy_(grads[0]);
  }

  // Runs an op, then lets go of what its predecessors produced once their last consumer ran, so
  // boundary activations and gradients live as long as they are needed, not the whole step.
  void run(NodeId v) {
    if (fault && fault->rank == comm.rank() && fault->step == cur_step && fault->token == ir::token(node(v))) {
      if (fault->kind == "fail") throw std::runtime_error("injected fault (PIPER_FAULT)");
      if (fault->kind == "stall")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the watchdog ends the job
      if (fault->kind == "drop" && node(v).op == Op::Send) return;     // the peer never gets it
    }
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
  }

  void run_op(NodeId v) {
    const Node& n = node(v);
    switch (n.op) {
      case Op::F: return forward(v);
      case Op::B:
      case Op::BI:
      case Op::BW: return backward(v);
      case Op::U: return params_of(n).update();
      case Op::Send: return send(v);
      case Op::Recv: return recv(v);
      case Op::AllReduce:
        if (n.payload == ir::Payload::Tied) return sum_tied(n.bucket);
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

  // ------------------------------------------------------------------ a step
  StepResult step(int64_t s) {
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
    for (auto& [stage, sp] : params) sp->start_step();
    if (queues) queues->synchronize_current();  // the zeroed gradients, before any op stream adds to them
    pieces_io.clear();
    for (size_t v = 0; v < g.nodes.size(); ++v)
      if (view.mine(plan, static_cast<NodeId>(v)))
        pieces_io[{node(NodeId(v)).stage, node(NodeId(v)).microbatch, node(NodeId(v)).segment}];
    values.assign(g.nodes.size(), {});
    losses.assign(g.nodes.size(), 0.0);
    for (size_t v = 0; v < g.nodes.size(); ++v) unread[v] = consumers[v];
    std::string failure = threads->run(s + 1, [this](NodeId v) { run(v); },
                                       [this](const std::string& msg) { comm.abort(msg); }, &res.ops);
    if (!failure.empty()) comm.abort(failure);
    res.ops_began = std::chrono::duration<double>(threads->began().time_since_epoch()).count();
    if (queues) queues->synchronize();  // the step ends when its kernels have, not its launches

    // The loss lives on the last stage's ranks: sum it over everyone, average over replicas.
    double loss = 0;
    for (size_t v = 0; v < g.nodes.size(); ++v) {
      const Node& n = node(NodeId(v));
      if (n.op == Op::F && last_piece(n) && view.mine(plan, NodeId(v))) loss += losses[v];
    }
    std::vector<int> everyone(static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) everyone[static_cast<size_t>(r)] = r;
    comm.all_reduce_sum(&loss, 1, everyone, kRuntimeChannel);
    res.loss = loss / static_cast<double>(view.replicas);
    values.assign(g.nodes.size(), {});
    pieces_io.clear();
    tokens = torch::Tensor();
    res.memory = memory_stats(comm.rank());
    if (!dev.is_cpu())  // the device's tensors: its allocator's figures, where this LibTorch gives them
      if (auto m = device_memory_stats(opt.device)) res.memory = *m;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  }
};

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
  impl_ = std::make_unique<Impl>(plan, model_path, data, comm, std::move(options));
  impl_->setup();
}

Executor::~Executor() = default;

StepResult Executor::step(int64_t step) { return impl_->step(step); }

std::pair<double, double> Executor::param_checksum() {
  double sums[2] = {0, 0};
  for (auto& [stage, sp] : impl_->params) {
    auto [s, q] = sp->checksum(impl_->view.replica == 0);
    sums[0] += s;
    sums[1] += q;
  }
  std::vector<int> everyone(static_cast<size_t>(impl_->comm.size()));
  for (int r = 0; r < impl_->comm.size(); ++r) everyone[static_cast<size_t>(r)] = r;
  impl_->comm.all_reduce_sum(sums, 2, everyone, kRuntimeChannel);
  return {sums[0], sums[1]};
}

namespace {
std::vector<int> everyone(const Communicator& comm) {
  std::vector<int> all(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}
}  // namespace

std::string Executor::save_checkpoint(const std::string& dir, int64_t steps_done, const std::string& strategy) {
  Impl& x = *impl_;
  std::vector<StatePiece> mine;
  int64_t optimizer_steps = 0;
  for (auto& [stage, sp] : x.params) {
    for (auto& p : sp->saved_state(x.view.replica == 0)) mine.push_back(std::move(p));
    optimizer_steps = sp->optimizer_steps();
  }
  nlohmann::json meta{{"model", x.plan.manifest.model_name}, {"strategy", strategy}, {"optimizer", x.opt.optimizer},
                      {"optimizer_steps", optimizer_steps}, {"lr", x.opt.lr}, {"seed", x.opt.seed},
                      {"batch_size", x.opt.global_batch}};
  const auto all = everyone(x.comm);
  auto barrier = [&] {
    double z = 0;
    x.comm.all_reduce_sum(&z, 1, all, kRuntimeChannel);
  };
  // A failure on one rank must not leave the others waiting at a barrier: it ends the job.
  try {
    return write_checkpoint(dir, steps_done, mine, meta, x.comm.rank(), x.comm.size(), barrier);
  } catch (const std::exception& e) {
    x.comm.abort(fmt::format("rank {}: {}", x.comm.rank(), e.what()));
    throw;  // not reached (abort is [[noreturn]]); GCC does not see that through the virtual call
  }
}

int64_t Executor::load_checkpoint(const std::string& dir, std::string* note) {
  Impl& x = *impl_;
  const std::string path = latest_checkpoint(dir);
  std::vector<StatePiece> want;
  for (auto& [stage, sp] : x.params)
    for (auto& p : sp->loaded_state()) want.push_back(std::move(p));
  std::set<std::pair<std::string, std::string>> model_params;  // a tied tensor under its first name only
  const Manifest& man = x.plan.manifest;
  for (RegionId r = 0; r < RegionId(man.regions.size()); ++r)
    for (int32_t i = 0; i < int32_t(man.regions[static_cast<size_t>(r)].params.size()); ++i) {
      const int32_t tie = man.tie_of(r, i);
      if (tie >= 0 && !(man.ties[static_cast<size_t>(tie)].members.front() == TiedParam{r, i})) continue;
      model_params.emplace(man.regions[static_cast<size_t>(r)].name, man.regions[static_cast<size_t>(r)].params[static_cast<size_t>(i)].name);
    }
  const nlohmann::json m = read_checkpoint(path, want, model_params);
  if (m.value("optimizer", "") != x.opt.optimizer)
    throw std::runtime_error(fmt::format("checkpoint {}: saved with optimizer {}, this run uses {}", path,
                                         m.value("optimizer", "?"), x.opt.optimizer));
  for (auto& [stage, sp] : x.params) sp->loaded(m.value("optimizer_steps", int64_t{0}));
  if (note) {
    *note = fmt::format("resumed from {} (step {}, saved by {} on {} ranks)", path, m.value("step", int64_t{0}),
                        m.value("strategy", "?"), m.value("world", 0));
    if (m.value("seed", uint64_t{0}) != x.opt.seed || m.value("batch_size", int64_t{0}) != x.opt.global_batch)
      *note += fmt::format("; note: it was saved with --seed {} --batch-size {}, this run uses {} and {}, so the data differ",
                           m.value("seed", uint64_t{0}), m.value("batch_size", int64_t{0}), x.opt.seed, x.opt.global_batch);
  }
  return m.value("step", int64_t{0});
}

void Executor::save_model(const std::string& path) {
  Impl& x = *impl_;
  // Every rank sends what it owns (each element once) to rank 0: a JSON index, then the values.
  std::vector<StatePiece> mine;
  for (auto& [stage, sp] : x.params)
    for (auto& p : sp->saved_state(x.view.replica == 0)) mine.push_back(std::move(p));
  nlohmann::json index = nlohmann::json::array();
  std::vector<float> values;
  for (const auto& p : mine) {
    index.push_back({p.region, p.param, p.begin, p.end});
    const torch::Tensor v = p.value.detach().to(torch::kCPU, torch::kFloat).contiguous();
    values.insert(values.end(), v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
  }
  const int kLenTag = x.comm.max_tag() - 2, kIndexTag = x.comm.max_tag() - 1, kValueTag = x.comm.max_tag();  // above the plan's
  if (x.comm.rank() != 0) {
    const std::string text = index.dump();
    uint64_t sizes[2] = {text.size(), values.size()};
    x.comm.send(sizes, sizeof sizes, 0, kLenTag);
    x.comm.send(text.data(), text.size(), 0, kIndexTag);
    x.comm.send(values.data(), values.size() * sizeof(float), 0, kValueTag);
  } else {
    RegionModel out(x.model_path);  // a fresh copy: this rank released the weights it does not hold
    auto& impl = out.impl();
    torch::NoGradGuard no_grad;
    auto fill = [&](const nlohmann::json& idx, const std::vector<float>& vals) {
      size_t at = 0;
      for (const auto& e : idx) {
        const int64_t b = e[2], en = e[3];
        torch::Tensor target = module_parameter(impl.region(e[0]), e[1]);
        target.view({-1}).narrow(0, b, en - b).copy_(torch::from_blob(const_cast<float*>(vals.data()) + at, {en - b}));
        at += static_cast<size_t>(en - b);
      }
    };
    fill(index, values);
    for (int r = 1; r < x.comm.size(); ++r) {
      uint64_t sizes[2] = {0, 0};
      x.comm.recv(sizes, sizeof sizes, r, kLenTag);
      std::string text(sizes[0], '\0');
      x.comm.recv(text.data(), text.size(), r, kIndexTag);
      std::vector<float> vals(sizes[1]);
      x.comm.recv(vals.data(), vals.size() * sizeof(float), r, kValueTag);
      fill(nlohmann::json::parse(text), vals);
    }
    for (auto p : impl.root.parameters()) p.set_requires_grad(true);
    const std::string tmp = path + ".tmp";
    impl.root.save(tmp, {{"piper/manifest.json", impl.manifest}});
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error(fmt::format("--save-model: cannot write {}", path));
  }
  double z = 0;
  const auto all = everyone(x.comm);
  x.comm.all_reduce_sum(&z, 1, all, kRuntimeChannel);
}

}  // namespace piper::runtime
