#include "runtime/executor.h"

#include <fmt/format.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/native/Resize.h>

#include "ir/emit.h"
#include "runtime/region_model.h"
#include "runtime/region_model_impl.h"

namespace piper::runtime {

using ir::Node;
using ir::NodeId;
using ir::Op;

namespace {
// Message tags: unique per (payload, stage, microbatch), so concurrent streams never cross wires.
int tag_of(const Node& n) { return ((n.payload == ir::Payload::Act ? 0 : 1) * 4096 + n.microbatch) * 4096 + n.stage; }

std::vector<int64_t> coords(int64_t rank, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> c(sizes.size());
  for (size_t i = sizes.size(); i-- > 0;) {
    c[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return c;
}
}  // namespace

struct Executor::Impl {
  const Plan& plan;
  const TokenData& data;
  Communicator& comm;
  ExecutorOptions opt;
  RegionModel model;
  int rank = 0;
  int32_t cls = -1;
  size_t position = 0;  // this rank's index in its class (pairs with the same index in a peer class)
  std::vector<int64_t> axis_sizes;
  int64_t replicas = 1, replica = 0, samples_per_mb = 1, seq = 0;
  int32_t last_stage = 0;

  // Per stage this rank holds: its region modules, parameters and optimizer.
  // A piece of a stage cut at sharded regions (expert parallelism): a dense run of regions, which
  // may end with a block whose experts are sharded (then it stops after the block's attention and
  // router: the zoo's contract, docs/models.md), or this rank's experts of one sharded list.
  struct Piece {
    std::vector<torch::jit::Module> plain;
    bool moe_end = false;
    torch::jit::Module attn, router;
    std::vector<std::pair<int64_t, torch::jit::Module>> experts;  // (expert index, module), local ones
    std::vector<int> ep_group;
    bool expert = false;
  };

  struct StageState {
    std::vector<torch::jit::Module> modules;
    std::vector<Piece> pieces;           // empty when the stage is not cut
    std::vector<torch::Tensor> params;   // everything this rank updates for the stage
    std::vector<torch::Tensor> reduced;  // what data parallelism reduces (all but sharded experts)
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    torch::Tensor flat_grads;  // while its gradients are being reduced
    std::map<int32_t, std::pair<int64_t, int64_t>> buckets;  // bucket -> [first, last) float offsets
    std::vector<int> dp_group;
    // ZeRO-1/2: this rank updates only its shard of each bucket (AdamW and SGD are elementwise, so the
    // sharded update is the full update), then all-gathers the parameters.
    int zero = 0;
    size_t member = 0;                          // this rank's index in dp_group
    std::map<int32_t, std::vector<size_t>> shard_offsets;  // bucket -> split of its range among members
    std::map<int32_t, torch::Tensor> shards;      // bucket -> this rank's parameter shard (optimised)
    std::map<int32_t, torch::Tensor> shard_grads; // bucket -> summed gradient shard
    std::map<int32_t, torch::Tensor> mb_grads;    // ZeRO-2: microbatch -> its gradients, moved out after its backward
    torch::Tensor flat_params;                    // gathered parameters, copied back after the last bucket
    int gathered = 0;
    // ZeRO-3: parameters live as shards; their storage is materialised from gathered buckets for
    // each forward/backward and released after it (the saved autograd graph keeps the tensors, which
    // are refilled with the same values before the backward, as FSDP does).
    bool materialized = true;
    std::vector<int64_t> param_offsets;           // where each parameter starts in the flat order
    std::map<NodeId, torch::Tensor> gather_buffers;  // per gather node: the bucket's full values
    std::map<NodeId, int> gather_uses;               // consumers left per gather node
  };
  std::map<int32_t, StageState> stages;

  // Per (stage, microbatch): the tensors that flow between ops of one step.
  struct Act {
    torch::Tensor input, output, loss, recv, grad_in, input_grad;
    // Expert parallelism: a dense piece's attention output and router results, the gathered tokens
    // and gates of an expert piece, its partial outputs, and the gradients that flow between them.
    torch::Tensor a, h, g, h_all, g_all, partial, grad_a, grad_h, grad_g, grad_partial;
    bool recompute = false;  // the forward ran without a graph; the backward reruns it
  };
  std::map<std::tuple<int32_t, int32_t, int16_t>, Act> acts;  // (stage, microbatch, piece)
  torch::Tensor tokens;  // this replica's samples of the step: [replica batch, seq + 1]

  // Completion of this rank's ops within a step.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> done;
  std::string failure;
  std::vector<std::vector<NodeId>> local_preds;

  Impl(const Plan& p, const std::string& path, const TokenData& d, Communicator& c, ExecutorOptions o)
      : plan(p), data(d), comm(c), opt(std::move(o)), model(path) {}

  const Node& node(NodeId v) const { return plan.dag.nodes[static_cast<size_t>(v)]; }

  // The ranks of `n.ranks` that share this rank's coordinates on every axis but the collective's.
  std::vector<int> group_along(const Node& n) const {
    auto mine = coords(rank, axis_sizes);
    std::vector<int> out;
    for (int32_t r : plan.dag.ranks(n.ranks)) {
      auto c = coords(r, axis_sizes);
      bool same = true;
      for (size_t i = 0; i < c.size(); ++i)
        if (static_cast<int32_t>(i) != n.axis && c[i] != mine[i]) same = false;
      if (same) out.push_back(r);
    }
    return out;
  }

  // The other end of each send/recv: its rank (the same position in the peer's class) and the
  // message tag, which both ends compute from the send node. Filled once in setup().
  std::vector<std::pair<int, int>> peers;

  void find_peers() {
    peers.assign(plan.dag.nodes.size(), {-1, -1});
    for (const auto& e : plan.dag.edges) {
      if (node(e.src).op != Op::Send || node(e.dst).op != Op::Recv) continue;
      const auto& cls_of = plan.schedule.node_class;
      const auto& send_ranks = plan.schedule.classes[static_cast<size_t>(cls_of[static_cast<size_t>(e.src)])].ranks;
      const auto& recv_ranks = plan.schedule.classes[static_cast<size_t>(cls_of[static_cast<size_t>(e.dst)])].ranks;
      int tag = tag_of(node(e.src));
      if (cls_of[static_cast<size_t>(e.src)] == cls) peers[static_cast<size_t>(e.src)] = {recv_ranks.at(position), tag};
      if (cls_of[static_cast<size_t>(e.dst)] == cls) peers[static_cast<size_t>(e.dst)] = {send_ranks.at(position), tag};
    }
  }

  std::pair<int, int> peer_of(NodeId v) const {
    auto p = peers[static_cast<size_t>(v)];
    if (p.first < 0) throw std::logic_error("send/recv without a partner: " + ir::token(node(v)));
    return p;
  }

  int64_t model_seq() const { return const_cast<RegionModel&>(model).impl().seq_len; }

  std::vector<int64_t> per_sample_shape(RegionId region, bool input) const {
    const auto& spec = input ? plan.manifest.regions[static_cast<size_t>(region)].input
                             : plan.manifest.regions[static_cast<size_t>(region)].output;
    if (!spec) throw std::runtime_error("the manifest has no activation shape for " + plan.manifest.regions[static_cast<size_t>(region)].name);
    // Per-sample shapes lead with the sequence when they have one: a shorter --seq-len shortens it.
    std::vector<int64_t> s{samples_per_mb};
    for (size_t i = 0; i < spec->shape.size(); ++i)
      s.push_back(i == 0 && spec->shape[0] == model_seq() ? seq : spec->shape[i]);
    return s;
  }

  void setup() {
    rank = comm.rank();
    const auto& s = plan.strategy;
    for (const auto& a : s.mesh) axis_sizes.push_back(a.size);
    cls = plan.schedule.class_of_rank(rank);
    if (cls < 0) throw std::runtime_error(fmt::format("rank {} has no program in this plan", rank));
    const auto& my = plan.schedule.classes[static_cast<size_t>(cls)].ranks;
    position = static_cast<size_t>(std::find(my.begin(), my.end(), rank) - my.begin());
    // Data-parallel replicas: every coordinate combination off the pipeline axis.
    auto mine = coords(rank, axis_sizes);
    int32_t pp_axis = -1;
    for (size_t i = 0; i < s.mesh.size(); ++i)
      if (s.mesh[i].name == s.pipeline_axis) pp_axis = static_cast<int32_t>(i);
    replicas = 1;
    replica = 0;
    for (size_t i = 0; i < s.mesh.size(); ++i) {
      if (static_cast<int32_t>(i) == pp_axis) continue;
      replica = replica * s.mesh[i].size + mine[i];
      replicas *= s.mesh[i].size;
    }
    if (opt.global_batch % (replicas * s.microbatches) != 0)
      throw std::runtime_error(fmt::format("--batch-size {} does not split into {} replicas × {} microbatches",
                                           opt.global_batch, replicas, s.microbatches));
    samples_per_mb = opt.global_batch / replicas / s.microbatches;
    seq = model.impl().seq_len;
    if (opt.seq_len > 0) {
      if (opt.seq_len > seq)
        throw std::runtime_error(fmt::format("--seq-len {} is longer than the model's sequence length {}", opt.seq_len, seq));
      seq = opt.seq_len;
    }
    last_stage = static_cast<int32_t>(s.stages.size()) - 1;

    // The stages this rank holds, their modules and parameters.
    auto& impl = model.impl();
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < impl.sequence.size(); ++i) index[impl.sequence[i]] = i;
    for (size_t v = 0; v < plan.dag.nodes.size(); ++v) {
      const Node& n = plan.dag.nodes[v];
      if (plan.schedule.node_class[v] != cls || !ir::is_chunk(n.op) || stages.count(n.stage)) continue;
      StageState st;
      const auto& piece_regions = plan.dag.piece_regions[static_cast<size_t>(n.stage)];
      if (piece_regions.size() <= 1) {
        for (RegionId r : s.stages[static_cast<size_t>(n.stage)].regions) {
          auto m = impl.modules.at(index.at(plan.manifest.regions[static_cast<size_t>(r)].name));
          st.modules.push_back(m);
          for (auto p : m.parameters()) st.params.push_back(p);
        }
        st.reduced = st.params;
      } else {
        build_pieces(n.stage, st);
      }
      for (auto& p : st.params) p.set_requires_grad(true);
      if (opt.optimizer == "adamw")
        st.optimizer = std::make_unique<torch::optim::AdamW>(st.params, torch::optim::AdamWOptions(opt.lr).weight_decay(0.0));
      else
        st.optimizer = std::make_unique<torch::optim::SGD>(st.params, torch::optim::SGDOptions(opt.lr));
      stages.emplace(n.stage, std::move(st));
    }
    // Weights of regions this rank does not hold are released: the archive is read whole (TorchScript
    // has no partial load), but only the owned stages' weights stay in memory.
    {
      std::set<std::string> owned;
      for (auto& [stage, st] : stages)
        for (RegionId r : s.stages[static_cast<size_t>(stage)].regions) owned.insert(plan.manifest.regions[static_cast<size_t>(r)].name);
      for (size_t i = 0; i < impl.sequence.size(); ++i) {
        if (owned.count(impl.sequence[i])) continue;
        for (auto sub : impl.modules[i].modules())
          for (const auto& np : sub.named_parameters(/*recurse=*/false))
            sub.register_parameter(np.name, torch::empty({0}), false);
      }
    }
    // Gradient buckets: contiguous float ranges of the stage's flattened gradients, in bucket order.
    std::map<int32_t, std::map<int32_t, int64_t>> bucket_bytes;
    for (size_t v = 0; v < plan.dag.nodes.size(); ++v) {
      const Node& n = plan.dag.nodes[v];
      if (plan.schedule.node_class[v] != cls || (n.op != Op::AllReduce && n.op != Op::ReduceScatter)) continue;
      bucket_bytes[n.stage][n.bucket] = n.bytes;
      auto& st = stages.at(n.stage);
      st.dp_group = group_along(n);
      if (n.op == Op::ReduceScatter) st.zero = std::max(st.zero, n.microbatch >= 0 ? 2 : 1);
    }
    for (size_t v = 0; v < plan.dag.nodes.size(); ++v) {
      const Node& n = plan.dag.nodes[v];
      if (plan.schedule.node_class[v] == cls && n.op == Op::AllGather && (n.flags & ir::kMaterialize)) stages.at(n.stage).zero = 3;
    }
    for (auto& [stage, bs] : bucket_bytes) {
      int64_t offset = 0, total = 0;
      for (const auto& p : stages.at(stage).reduced) total += p.numel();
      for (auto [k, bytes] : bs) {
        stages.at(stage).buckets[k] = {offset, offset + bytes / 4};
        offset += bytes / 4;
      }
      if (offset != total)
        throw std::runtime_error(fmt::format("stage {} replicates {} of its {} parameters: replicating part of a stage is "
                                             "not supported by the runtime yet",
                                             stage, offset, total));
      auto& st = stages.at(stage);
      if (st.zero == 0) continue;
      // Shards: each bucket's range split evenly (the first members take one more when uneven).
      st.member = static_cast<size_t>(std::find(st.dp_group.begin(), st.dp_group.end(), rank) - st.dp_group.begin());
      std::vector<torch::Tensor> flat;
      for (auto& p : st.params) flat.push_back(p.detach().reshape({-1}));
      st.flat_params = torch::cat(flat);
      std::vector<torch::Tensor> my_shards;
      const size_t g = st.dp_group.size();
      for (auto [k, range] : st.buckets) {
        size_t len = static_cast<size_t>(range.second - range.first);
        std::vector<size_t> off{0};
        for (size_t j = 0; j < g; ++j) off.push_back(off.back() + len / g + (j < len % g ? 1 : 0));
        st.shard_offsets[k] = off;
        auto shard = st.flat_params.slice(0, range.first + static_cast<int64_t>(off[st.member]),
                                          range.first + static_cast<int64_t>(off[st.member + 1])).clone().requires_grad_(true);
        st.shards[k] = shard;
        my_shards.push_back(shard);
      }
      if (opt.optimizer == "adamw")
        st.optimizer = std::make_unique<torch::optim::AdamW>(my_shards, torch::optim::AdamWOptions(opt.lr).weight_decay(0.0));
      else
        st.optimizer = std::make_unique<torch::optim::SGD>(my_shards, torch::optim::SGDOptions(opt.lr));
      int64_t o = 0;
      for (auto& p : st.params) {
        st.param_offsets.push_back(o);
        o += p.numel();
      }
      if (st.zero == 3) {
        own_storage(st);
        release_params(st);
      }
    }
    // Every collective group, declared up front in one sorted order on every member.
    std::set<std::pair<std::vector<int>, int>> groups;
    for (auto& [stage, st] : stages) {
      if (!st.dp_group.empty()) groups.insert({st.dp_group, 1});
      for (auto& piece : st.pieces)
        if (piece.expert) groups.insert({piece.ep_group, 4});
    }
    std::vector<int> everyone(static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) everyone[static_cast<size_t>(r)] = r;
    groups.insert({everyone, 2});
    for (const auto& [g, channel] : groups) comm.prepare_group(g, channel);
    find_peers();
    // Predecessors on this rank (cross-rank edges are send -> recv, which the communicator pairs).
    local_preds.assign(plan.dag.nodes.size(), {});
    for (const auto& e : plan.dag.edges)
      if (plan.schedule.node_class[static_cast<size_t>(e.src)] == cls && plan.schedule.node_class[static_cast<size_t>(e.dst)] == cls)
        local_preds[static_cast<size_t>(e.dst)].push_back(e.src);
  }

  // The child region of `under` with this kind (attention, router), as a module.
  torch::jit::Module child_of_kind(RegionId under, const std::string& kind) {
    const auto& m = plan.manifest;
    for (size_t r = 0; r < m.regions.size(); ++r)
      if (m.regions[r].kind == kind && m.is_ancestor(under, static_cast<RegionId>(r)))
        return model.impl().region(m.regions[r].name);
    throw std::runtime_error(fmt::format("expert parallelism: '{}' has no {} region (the runtime runs the zoo's "
                                         "MoE contract, docs/models.md)",
                                         m.regions[static_cast<size_t>(under)].name, kind));
  }

  void build_pieces(int32_t stage, StageState& st) {
    const auto& m = plan.manifest;
    const auto& regions = plan.dag.piece_regions[static_cast<size_t>(stage)];
    const auto& sharded = plan.dag.piece_sharded[static_cast<size_t>(stage)];
    auto& impl = model.impl();
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < impl.sequence.size(); ++i) index[impl.sequence[i]] = i;
    auto add_params = [&](torch::jit::Module& mod, bool reduce) {
      for (auto p : mod.parameters()) {
        st.params.push_back(p);
        if (reduce) st.reduced.push_back(p);
      }
    };
    for (size_t j = 0; j < regions.size(); ++j) {
      Piece piece;
      if (sharded[j] >= 0) {
        piece.expert = true;
        // Which experts are this rank's: its coordinate on the shard axis picks a contiguous block.
        const ShardDirective* dir = nullptr;
        for (const auto& d : plan.strategy.directives)
          if (const auto* sh = std::get_if<ShardDirective>(&d.body))
            if (std::find(sh->regions.begin(), sh->regions.end(), sharded[j]) != sh->regions.end()) dir = sh;
        int32_t axis = -1;
        for (size_t i = 0; i < plan.strategy.mesh.size(); ++i)
          if (plan.strategy.mesh[i].name == dir->axis) axis = static_cast<int32_t>(i);
        const auto& members = m.regions[static_cast<size_t>(sharded[j])].children;
        int64_t ways = axis_sizes[static_cast<size_t>(axis)], per = static_cast<int64_t>(members.size()) / ways;
        int64_t mine = coords(rank, axis_sizes)[static_cast<size_t>(axis)];
        for (int64_t e = 0; e < static_cast<int64_t>(members.size()); ++e) {
          auto mod = impl.region(m.regions[static_cast<size_t>(members[static_cast<size_t>(e)])].name);
          if (e / per == mine) {
            piece.experts.emplace_back(e, mod);
            add_params(mod, false);
          } else {
            for (auto sub : mod.modules())  // another rank's expert: its weights are released
              for (const auto& np : sub.named_parameters(false)) sub.register_parameter(np.name, torch::empty({0}), false);
          }
        }
        // The expert-parallel group: ranks that differ from this one only on the shard axis.
        auto mc = coords(rank, axis_sizes);
        for (int64_t r = 0; r < comm.size(); ++r) {
          auto c = coords(r, axis_sizes);
          bool same = true;
          for (size_t i = 0; i < c.size(); ++i)
            if (static_cast<int32_t>(i) != axis && c[i] != mc[i]) same = false;
          if (same) piece.ep_group.push_back(static_cast<int>(r));
        }
      } else {
        for (RegionId r : regions[j]) {
          bool moe = j + 1 < regions.size() && sharded[j + 1] >= 0 && m.is_ancestor(r, sharded[j + 1]);
          if (moe) {
            piece.moe_end = true;
            piece.attn = child_of_kind(r, "attention");
            piece.router = child_of_kind(r, "router");
            add_params(piece.attn, true);
            add_params(piece.router, true);
          } else {
            auto mod = impl.modules.at(index.at(m.regions[static_cast<size_t>(r)].name));
            piece.plain.push_back(mod);
            add_params(mod, true);
          }
        }
      }
      st.pieces.push_back(std::move(piece));
    }
  }

  torch::Tensor run_stage(int32_t stage, torch::Tensor x) {
    for (auto& m : stages.at(stage).modules) x = m.forward({x}).toTensor();
    return x;
  }

  // Parameters loaded from the archive may sit on storage that cannot be resized: give them their own.
  static void own_storage(StageState& st) {
    torch::NoGradGuard no_grad;
    for (auto& p : st.params) p.set_data(p.detach().clone());
  }

  static void release_params(StageState& st) {
    for (auto& p : st.params) at::native::resize_bytes_cpu(p.storage().unsafeGetStorageImpl(), 0);
    st.materialized = false;
  }

  // ZeRO-3, at the start of a forward or backward: refill the parameters from this op's gathers.
  void materialize(NodeId v) {
    const Node& n = node(v);
    auto it = stages.find(n.stage);
    if (it == stages.end() || it->second.zero != 3 || !ir::is_chunk(n.op) || n.op == Op::U) return;
    auto& st = it->second;
    torch::NoGradGuard no_grad;
    if (!st.materialized) {
      for (auto& p : st.params)
        at::native::resize_bytes_cpu(p.storage().unsafeGetStorageImpl(), static_cast<size_t>(p.numel()) * p.element_size());
      st.materialized = true;
    }
    for (NodeId u : local_preds[static_cast<size_t>(v)]) {
      const Node& g = node(u);
      if (g.op != Op::AllGather || !(g.flags & ir::kMaterialize)) continue;
      torch::Tensor full;
      {
        std::lock_guard lk(mu);
        full = st.gather_buffers.at(u);
        if (--st.gather_uses.at(u) == 0) st.gather_buffers.erase(u);
      }
      auto [lo, hi] = st.buckets.at(g.bucket);
      for (size_t i = 0; i < st.params.size(); ++i) {
        int64_t a = std::max(lo, st.param_offsets[i]), b = std::min(hi, st.param_offsets[i] + st.params[i].numel());
        if (a >= b) continue;
        // Through variable_data(): same storage, own version counter, so the saved graph stays valid.
        st.params[i].variable_data().view({-1}).slice(0, a - st.param_offsets[i], b - st.param_offsets[i])
            .copy_(full.slice(0, a - lo, b - lo));
      }
    }
  }

  // ZeRO-3, after the op: the parameters' storage goes back to nothing.
  void release_after(NodeId v) {
    const Node& n = node(v);
    auto it = stages.find(n.stage);
    if (it == stages.end() || it->second.zero != 3 || !(n.flags & ir::kFreeParams)) return;
    release_params(it->second);
  }

  torch::Tensor flat_grads_of(StageState& st) {
    std::vector<torch::Tensor> flat;
    for (auto& p : st.reduced) flat.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}));
    return torch::cat(flat);
  }

  // ZeRO-2: once a microbatch's backward on a stage is complete, its gradients move out of the
  // parameters (to be reduce-scattered by the comm stream) and the parameters' gradients restart.
  void move_out_gradients(const Node& n) {
    auto it = stages.find(n.stage);
    if (it == stages.end() || it->second.zero < 2 || n.op == Op::BI) return;
    if (n.segment > 0) return;  // the stage's last backward piece (pieces run in reverse)
    auto& st = it->second;
    torch::Tensor g = flat_grads_of(st);
    for (auto& p : st.params)
      if (p.grad().defined()) p.mutable_grad().zero_();
    std::lock_guard lk(mu);
    st.mb_grads[n.microbatch] = g;
  }

  // Before the backward of a recomputed forward: run it again, now recording the graph.
  void rematerialize(const Node& n, Act& a) {
    if (!a.recompute) return;
    a.recompute = false;
    a.output = run_stage(n.stage, a.input);
    if (n.stage == last_stage) a.loss = loss_of(n, a.output);
  }

  torch::Tensor loss_of(const Node& n, const torch::Tensor& output) {
    auto targets = tokens.slice(0, n.microbatch * samples_per_mb, (n.microbatch + 1) * samples_per_mb).slice(1, 1);
    // Each microbatch's mean, scaled so the microbatches sum to the batch mean.
    return at::cross_entropy_loss(output.reshape({-1, output.size(-1)}), targets.reshape({-1})) /
           static_cast<double>(plan.strategy.microbatches);
  }

  void run(NodeId v) {
    materialize(v);
    run_op(v);
    release_after(v);
  }

  // Where a chunk's input comes from: a receive, or (stages on one rank, as at the bottom of a V)
  // the previous stage's output here — possibly through that stage's last combine.
  torch::Tensor forward_source(NodeId v) {
    for (NodeId u : local_preds[static_cast<size_t>(v)]) {
      const Node& x = node(u);
      auto key = std::make_tuple(x.stage, x.microbatch, x.segment);
      if (x.op == Op::Recv && x.payload == ir::Payload::Act) return acts.at(key).recv;
      if ((x.op == Op::F || (x.op == Op::AllToAll && x.payload == ir::Payload::Combine)) && x.stage != node(v).stage)
        return acts.at(key).output;
    }
    throw std::logic_error("no input for " + ir::token(node(v)));
  }

  // Where a backward's output gradient comes from: a receive, or the next stage's input gradient here.
  torch::Tensor grad_source(NodeId v) {
    for (NodeId u : local_preds[static_cast<size_t>(v)]) {
      const Node& x = node(u);
      // A weight gradient uses the output gradient its input-gradient half received.
      if (node(v).op == Op::BW && x.op == Op::BI && x.stage == node(v).stage && x.segment == node(v).segment)
        return grad_source(u);
      auto key = std::make_tuple(x.stage, x.microbatch, x.segment);
      if (x.op == Op::Recv && x.payload == ir::Payload::ActGrad) return acts.at(key).grad_in;
      if ((x.op == Op::B || x.op == Op::BI) && x.stage != node(v).stage) return acts.at(key).input_grad;
      if (x.op == Op::AllToAll && x.payload == ir::Payload::Dispatch && x.stage != node(v).stage)
        return acts.at(key).input_grad;
    }
    throw std::logic_error("no output gradient for " + ir::token(node(v)));
  }

  // Expert parallelism: one piece of a cut stage, or an all-to-all between pieces, implemented as a
  // dense dispatch: dispatch gathers every token's normalised hidden state and gates over the group
  // (each rank then runs its experts on all of them); combine sums the experts' weighted outputs over
  // the group and returns each rank its own tokens, plus the block's residual. Exact; more traffic
  // than a sparse top-k all-to-all. Backward: the transposes (all-gather <-> reduce-scatter).
  void run_piece(NodeId v) {
    const Node& n = node(v);
    auto& st = stages.at(n.stage);
    const int16_t j = n.segment, last = static_cast<int16_t>(st.pieces.size() - 1);
    auto act = [&](int16_t seg) -> Act& { return acts.at({n.stage, n.microbatch, seg}); };
    Piece& piece = st.pieces[static_cast<size_t>(j)];
    Act& a = act(j);
    if (n.op == Op::F) {
      if (piece.expert) {
        torch::Tensor y = torch::zeros_like(a.h_all);
        for (auto& [e, mod] : piece.experts) y = y + a.g_all.slice(-1, e, e + 1) * mod.forward({a.h_all}).toTensor();
        a.partial = y;
        return;
      }
      torch::Tensor x;
      if (j == 0)
        x = n.stage == 0 ? tokens.slice(0, n.microbatch * samples_per_mb, (n.microbatch + 1) * samples_per_mb).slice(1, 0, seq)
                         : forward_source(v).detach().requires_grad_(true);
      else
        x = act(static_cast<int16_t>(j - 1)).output.detach().requires_grad_(true);
      a.input = x;
      for (auto& mod : piece.plain) x = mod.forward({x}).toTensor();
      if (piece.moe_end) {
        a.a = piece.attn.forward({x}).toTensor();
        auto out = piece.router.forward({a.a}).toTuple();
        a.h = out->elements()[0].toTensor();
        a.g = out->elements()[1].toTensor();
      } else {
        a.output = x;
        if (n.stage == last_stage && j == last) a.loss = loss_of(n, x);
      }
      return;
    }
    if (n.op == Op::B) {
      if (piece.expert) {
        a.partial.backward(a.grad_partial);
        a.partial = torch::Tensor();
        return;
      }
      if (piece.moe_end) torch::autograd::backward({a.h, a.g, a.a}, {a.grad_h, a.grad_g, a.grad_a});
      else if (a.loss.defined()) a.loss.backward();
      else a.output.backward(grad_source(v));
      if (a.input.defined() && a.input.requires_grad()) a.input_grad = a.input.grad();
      a.h = a.g = a.a = torch::Tensor();
      return;
    }
    if (n.op == Op::BI || n.op == Op::BW) {
      // Zero-bubble halves: BI computes only what the previous piece waits for (graph retained),
      // BW the weight gradients.
      std::vector<torch::Tensor> outs, grads;
      if (piece.expert) outs = {a.partial}, grads = {a.grad_partial};
      else if (piece.moe_end) outs = {a.h, a.g, a.a}, grads = {a.grad_h, a.grad_g, a.grad_a};
      else if (a.loss.defined()) outs = {a.loss};
      else outs = {a.output}, grads = {grad_source(v)};
      if (n.op == Op::BI) {
        if (piece.expert) {
          auto gi = torch::autograd::grad(outs, {a.h_all, a.g_all}, grads, /*retain_graph=*/true);
          a.grad_h = gi[0], a.grad_g = gi[1];  // the gathered tokens' gradients, for the dispatch's transpose
        } else if (a.input.defined() && a.input.requires_grad()) {
          a.input_grad = torch::autograd::grad(outs, {a.input}, grads, /*retain_graph=*/true)[0];
        }
      } else {
        torch::autograd::backward(outs, grads);
        a.partial = a.h = a.g = a.a = torch::Tensor();
      }
      return;
    }
    if (n.op != Op::AllToAll) throw std::runtime_error(fmt::format("{} in a cut stage is not supported", ir::op_name(n.op)));
    // All-to-alls sit on an expert piece: `d` is the dense piece before it.
    Act& d = act(static_cast<int16_t>(j - 1));
    const auto& group = piece.ep_group;
    const size_t ways = group.size();
    auto equal = [&](int64_t per) {
      std::vector<size_t> off;
      for (size_t k = 0; k <= ways; ++k) off.push_back(k * static_cast<size_t>(per));
      return off;
    };
    const bool back = n.flags & ir::kBackward;
    if (!back && n.payload == ir::Payload::Dispatch) {
      auto hg = torch::cat({d.h, d.g}, -1).detach().contiguous();
      torch::Tensor all = torch::empty({static_cast<int64_t>(ways) * hg.size(0), hg.size(1), hg.size(2)});
      comm.all_gather(hg.data_ptr<float>(), all.data_ptr<float>(), equal(hg.numel()), group, 4);
      const int64_t dm = d.h.size(-1);
      a.h_all = all.slice(-1, 0, dm).contiguous().requires_grad_(true);
      a.g_all = all.slice(-1, dm, all.size(-1)).contiguous().requires_grad_(true);
    } else if (!back) {  // combine
      auto part = a.partial.detach().contiguous();
      torch::Tensor y = torch::empty({part.size(0) / static_cast<int64_t>(ways), part.size(1), part.size(2)});
      comm.reduce_scatter_sum(part.data_ptr<float>(), y.data_ptr<float>(), equal(y.numel()), group, 4);
      a.output = d.a.detach() + y;
    } else if (n.payload == ir::Payload::Combine) {  // the combine's transpose: gather the output gradient
      torch::Tensor gx = (j < last ? act(static_cast<int16_t>(j + 1)).input_grad : grad_source(v)).contiguous();
      d.grad_a = gx;
      torch::Tensor all = torch::empty({static_cast<int64_t>(ways) * gx.size(0), gx.size(1), gx.size(2)});
      comm.all_gather(gx.data_ptr<float>(), all.data_ptr<float>(), equal(gx.numel()), group, 4);
      a.grad_partial = all;
    } else {  // the dispatch's transpose: sum the token gradients back to their ranks
      // From a split backward's BI, or from the whole backward's accumulation.
      auto gh = a.grad_h.defined() ? a.grad_h : a.h_all.grad(), gg = a.grad_g.defined() ? a.grad_g : a.g_all.grad();
      auto ghg = torch::cat({gh, gg}, -1).contiguous();
      torch::Tensor out = torch::empty({ghg.size(0) / static_cast<int64_t>(ways), ghg.size(1), ghg.size(2)});
      comm.reduce_scatter_sum(ghg.data_ptr<float>(), out.data_ptr<float>(), equal(out.numel()), group, 4);
      const int64_t dm = a.h_all.size(-1);
      d.grad_h = out.slice(-1, 0, dm);
      d.grad_g = out.slice(-1, dm, out.size(-1));
      a.grad_h = a.grad_g = torch::Tensor();
    }
  }

  void run_op(NodeId v) {
    const Node& n = node(v);
    auto key = std::make_tuple(n.stage, n.microbatch, n.segment);
    if (n.segment >= 0 && (ir::is_chunk(n.op) || n.op == Op::AllToAll)) {
      run_piece(v);
      return;
    }
    switch (n.op) {
      case Op::F: {
        Act& a = acts[key];
        if (n.stage == 0) {
          a.input = tokens.slice(0, n.microbatch * samples_per_mb, (n.microbatch + 1) * samples_per_mb).slice(1, 0, seq);
        } else {
          a.input = forward_source(v).detach().requires_grad_(true);
        }
        if (n.flags & ir::kRecompute) {
          // Activation checkpointing: keep only the input now, recompute before the backward.
          torch::NoGradGuard no_grad;
          a.output = run_stage(n.stage, a.input);
          a.recompute = true;
        } else {
          a.output = run_stage(n.stage, a.input);
        }
        if (n.stage == last_stage) a.loss = loss_of(n, a.output);
        break;
      }
      case Op::B: {
        Act& a = acts[key];
        rematerialize(n, a);
        if (n.stage == last_stage) a.loss.backward();
        else a.output.backward(grad_source(v));
        if (n.stage > 0) a.input_grad = a.input.grad();
        a.output = torch::Tensor();  // activations are freed as soon as their backward ran
        move_out_gradients(n);
        break;
      }
      case Op::BI: {
        Act& a = acts[key];
        rematerialize(n, a);
        if (n.stage > 0) {
          auto out = n.stage == last_stage ? a.loss : a.output;
          std::vector<torch::Tensor> grad_out;
          if (n.stage != last_stage) grad_out.push_back(grad_source(v));
          a.input_grad = torch::autograd::grad({out}, {a.input}, grad_out, /*retain_graph=*/true)[0];
        }
        break;
      }
      case Op::BW: {
        Act& a = acts[key];
        if (n.stage == last_stage) torch::autograd::backward({a.loss});
        else torch::autograd::backward({a.output}, {grad_source(v)});
        a.output = torch::Tensor();
        move_out_gradients(n);
        break;
      }
      case Op::U: {
        auto& st = stages.at(n.stage);
        if (st.zero > 0) {
          for (auto& [k, shard] : st.shards) shard.mutable_grad() = st.shard_grads.at(k) / static_cast<double>(st.dp_group.size());
          st.optimizer->step();
          break;
        }
        if (st.flat_grads.defined()) {
          // Averaged gradients back into place.
          st.flat_grads.div_(static_cast<double>(st.dp_group.size()));
          int64_t off = 0;
          for (auto& p : st.reduced) {
            p.mutable_grad().copy_(st.flat_grads.slice(0, off, off + p.numel()).view_as(p));
            off += p.numel();
          }
          st.flat_grads = torch::Tensor();
        }
        st.optimizer->step();
        break;
      }
      case Op::Send: {
        Act& a = acts[key];
        torch::Tensor t = (n.payload == ir::Payload::Act ? a.output : a.input_grad).detach().contiguous();
        auto [peer, tag] = peer_of(v);
        comm.send(t.data_ptr(), static_cast<size_t>(t.nbytes()), peer, tag);
        break;
      }
      case Op::Recv: {
        Act& a = acts[key];
        // A received activation has the stage's input shape; a received gradient its output shape.
        const auto& regions = plan.strategy.stages[static_cast<size_t>(n.stage)].regions;
        bool act = n.payload == ir::Payload::Act;
        auto shape = per_sample_shape(act ? regions.front() : regions.back(), act);
        torch::Tensor buf = torch::empty(shape, torch::kFloat);
        auto [peer, tag] = peer_of(v);
        comm.recv(buf.data_ptr(), static_cast<size_t>(buf.nbytes()), peer, tag);
        (act ? a.recv : a.grad_in) = buf;
        break;
      }
      case Op::AllReduce: {
        auto& st = stages.at(n.stage);
        {
          std::lock_guard lk(mu);  // the first bucket of a stage flattens its gradients
          if (!st.flat_grads.defined()) {
            st.flat_grads = flat_grads_of(st);
          }
        }
        auto [lo, hi] = st.buckets.at(n.bucket);
        comm.all_reduce_sum(st.flat_grads.data_ptr<float>() + lo, static_cast<size_t>(hi - lo), st.dp_group, 1);
        break;
      }
      case Op::ReduceScatter: {
        auto& st = stages.at(n.stage);
        torch::Tensor source;
        {
          std::lock_guard lk(mu);
          if (n.microbatch >= 0) {
            source = st.mb_grads.at(n.microbatch);
          } else {
            if (!st.flat_grads.defined()) st.flat_grads = flat_grads_of(st);
            source = st.flat_grads;
          }
        }
        auto [lo, hi] = st.buckets.at(n.bucket);
        const auto& off = st.shard_offsets.at(n.bucket);
        torch::Tensor out = torch::empty({static_cast<int64_t>(off[st.member + 1] - off[st.member])});
        torch::Tensor bucket = source.slice(0, lo, hi).contiguous();
        comm.reduce_scatter_sum(bucket.data_ptr<float>(), out.data_ptr<float>(), off, st.dp_group, 1);
        std::lock_guard lk(mu);
        auto it = st.shard_grads.find(n.bucket);
        if (it == st.shard_grads.end()) st.shard_grads[n.bucket] = out;
        else it->second.add_(out);
        break;
      }
      case Op::AllGather: {
        auto& st = stages.at(n.stage);
        auto [lo, hi] = st.buckets.at(n.bucket);
        torch::Tensor shard = st.shards.at(n.bucket).detach().contiguous();
        torch::Tensor full = torch::empty({hi - lo});
        comm.all_gather(shard.data_ptr<float>(), full.data_ptr<float>(), st.shard_offsets.at(n.bucket), st.dp_group, 1);
        std::lock_guard lk(mu);
        if (n.flags & ir::kMaterialize) {  // ZeRO-3: kept for the forward or backward that uses it
          st.gather_buffers[v] = full;
          break;
        }
        st.flat_params.slice(0, lo, hi).copy_(full);
        if (++st.gathered == static_cast<int>(st.buckets.size())) {
          // The last bucket is in: the updated parameters go back into the modules.
          torch::NoGradGuard no_grad;
          int64_t o = 0;
          for (auto& p : st.params) {
            p.copy_(st.flat_params.slice(0, o, o + p.numel()).view_as(p));
            o += p.numel();
          }
          st.gathered = 0;
        }
        break;
      }
      default:
        throw std::runtime_error(fmt::format("{} is not supported by the runtime yet", ir::op_name(n.op)));
    }
  }

  StepResult step(int64_t s) {
    StepResult res;
    auto t0 = std::chrono::steady_clock::now();
    auto batch = data.batch(opt.seed, static_cast<uint64_t>(s), opt.global_batch, replica * (opt.global_batch / replicas),
                            opt.global_batch / replicas, seq);
    tokens = torch::from_blob(batch.data(), {opt.global_batch / replicas, seq + 1}, torch::kLong).clone();
    for (auto& [stage, st] : stages) {
      st.optimizer->zero_grad();
      for (auto& p : st.params)
        if (p.grad().defined()) p.mutable_grad().zero_();
      st.shard_grads.clear();
      st.mb_grads.clear();
      st.flat_grads = torch::Tensor();
      st.gather_buffers.clear();
      st.gather_uses.clear();
    }
    for (size_t v = 0; v < plan.dag.nodes.size(); ++v)
      for (NodeId u : local_preds[v])
        if (node(u).op == Op::AllGather && (node(u).flags & ir::kMaterialize)) stages.at(node(u).stage).gather_uses[u]++;
    acts.clear();
    for (size_t v = 0; v < plan.dag.nodes.size(); ++v)
      if (plan.schedule.node_class[v] == cls) {
        const Node& x = node(static_cast<NodeId>(v));
        acts[{x.stage, x.microbatch, x.segment}];
      }
    done.assign(plan.dag.nodes.size(), 0);
    failure.clear();

    std::mutex spans_mu;
    std::vector<std::thread> threads;
    const auto& streams = plan.schedule.classes[static_cast<size_t>(cls)].streams;
    for (const auto& prog : streams) {
      threads.emplace_back([&, prog_ptr = &prog] {
        const std::string stream = plan.dag.streams[prog_ptr->stream];
        for (NodeId v : prog_ptr->ops) {
          {
            std::unique_lock lk(mu);
            cv.wait(lk, [&] {
              if (!failure.empty()) return true;
              for (NodeId u : local_preds[static_cast<size_t>(v)])
                if (!done[static_cast<size_t>(u)]) return false;
              return true;
            });
            if (!failure.empty()) return;
          }
          double a = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          try {
            run(v);
          } catch (const std::exception& e) {
            std::string msg = fmt::format("rank {}, step {}, op {} on stream {}: {}", rank, s + 1, ir::token(node(v)),
                                          stream, e.what());
            {
              std::lock_guard lk(mu);
              if (failure.empty()) failure = msg;
            }
            cv.notify_all();
            return;
          }
          double b = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          {
            std::lock_guard lk(spans_mu);
            res.ops.push_back(OpSpan{ir::token(node(v)), stream, a, b});
          }
          {
            std::lock_guard lk(mu);
            done[static_cast<size_t>(v)] = 1;
          }
          cv.notify_all();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (!failure.empty()) comm.abort(failure);

    // The loss lives on the last stage's ranks: sum it over everyone, average over replicas.
    double loss = 0;
    for (auto& [key, a] : acts)
      if (std::get<0>(key) == last_stage && a.loss.defined()) loss += a.loss.item<double>();
    std::vector<int> everyone(static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) everyone[static_cast<size_t>(r)] = r;
    comm.all_reduce_sum(&loss, 1, everyone, 2);
    res.loss = loss / static_cast<double>(replicas);
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  }
};

void set_intra_op_threads(int n) { torch::set_num_threads(n); }

std::vector<std::string> Executor::unsupported(const Plan& plan) {
  std::set<std::string> out;
  bool a2a = false, zero = false;
  for (const Node& n : plan.dag.nodes) {
    if (n.op == Op::AllToAll) a2a = true;
    if (n.op == Op::ReduceScatter || n.op == Op::AllGather) zero = true;
    if (n.op == Op::Broadcast) out.insert("broadcast");
  }
  if (a2a && zero) out.insert("ZeRO together with expert parallelism");
  // The runtime trains in fp32; silently ignoring a lower precision would mislead.
  for (const auto& d : plan.strategy.directives)
    if (const auto* pr = std::get_if<PrecisionDirective>(&d.body); pr && pr->dtype != DType::F32)
      out.insert("precision bf16 (the runtime trains in fp32)");
  return {out.begin(), out.end()};
}

Executor::Executor(const Plan& plan, const std::string& model_path, const TokenData& data, Communicator& comm,
                   ExecutorOptions options)
    : impl_(std::make_unique<Impl>(plan, model_path, data, comm, std::move(options))) {
  auto missing = unsupported(plan);
  if (!missing.empty())
    throw std::runtime_error(fmt::format("this plan uses what the runtime does not execute yet: {}",
                                         fmt::join(missing, ", ")));
  impl_->setup();
}

Executor::~Executor() = default;

StepResult Executor::step(int64_t step) { return impl_->step(step); }

std::pair<double, double> Executor::param_checksum() {
  double sums[2] = {0, 0};
  auto add = [&](const torch::Tensor& t) {
    auto d = t.detach().to(torch::kDouble);
    sums[0] += d.sum().item<double>();
    sums[1] += (d * d).sum().item<double>();
  };
  for (auto& [stage, st] : impl_->stages) {
    if (st.zero > 0) {
      for (auto& [k, shard] : st.shards) add(shard);  // every member holds a distinct shard
    } else if (impl_->replica == 0) {
      for (auto& p : st.reduced) add(p);
    }
    // Sharded experts: every rank of the expert-parallel group holds distinct ones.
    for (auto& p : st.params)
      if (std::none_of(st.reduced.begin(), st.reduced.end(), [&](const torch::Tensor& r) { return r.is_same(p); })) add(p);
  }
  std::vector<int> everyone(static_cast<size_t>(impl_->comm.size()));
  for (int r = 0; r < impl_->comm.size(); ++r) everyone[static_cast<size_t>(r)] = r;
  impl_->comm.all_reduce_sum(sums, 2, everyone, 2);
  return {sums[0], sums[1]};
}

}  // namespace piper::runtime
