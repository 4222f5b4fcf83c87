// The executor's inside, shared by its files (runtime-internal; LibTorch inside): what one rank
// holds of the plan and how it runs a step. executor.cpp sets it up and steps it; ops.cpp runs each
// op; assembly.cpp builds the stages from the model; persistence.cpp saves and loads; fault.h
// injects faults for tests.
#pragma once
#include <torch/script.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/device/call_watch.h"
#include "runtime/device/device_queues.h"
#include "runtime/exec/chunk_runner.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/fault.h"
#include "runtime/exec/stage_params.h"
#include "runtime/model/region_model.h"
#include "runtime/view/rank_view.h"

namespace piper::runtime {

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
  std::map<int32_t, TensorGroup> context_groups;           // per held stage with context parallelism
  std::map<int32_t, GroupRing> context_rings;              // their rings (ring attention), over context_groups
  std::map<int32_t, TensorGroup> tensor_groups;            // per held stage with tensor parallelism
  bool drop_copy_sums = false;  // the equivalence test's negative control of `mirror` (PIPER_TEST_DROP_COLLECTIVE=mirror)
  std::vector<std::vector<ir::NodeId>> data_preds;         // per node: its data predecessors on this rank
  std::vector<int> consumers;                              // per node: its data successors on this rank
  std::unique_ptr<StreamThreads> threads;
  // The calls every rank makes outside the streams (the step's loss; the job's metrics, checkpoints).
  std::unique_ptr<CallWatch> calls;

  // Per step: what each piece holds between its ops, and what each op produced for its consumers.
  std::map<std::tuple<int32_t, int32_t, int16_t>, PieceIO> pieces_io;
  std::vector<std::vector<torch::Tensor>> values;
  std::unique_ptr<std::atomic<int>[]> unread;  // consumers of each node's values still to run
  std::vector<double> losses;                  // per node: the loss a last forward piece computed
  torch::Tensor tokens;  // this replica's samples of the step: [replica batch, seq + 1]

  std::string model_path;
  int64_t cur_step = 0;  // 1-based, for fault injection
  // This step's global gradient norm (ALLREDUCE_N) and the scale every update applies to its gradients.
  double grad_norm = -1, clip_scale = 1;
  // Validation (evaluate.cpp): the forward-only program, its predecessors and threads; while it
  // runs, forwards build no autograd graph.
  sched::ClassProgram eval_program;
  std::vector<std::vector<ir::NodeId>> eval_preds;
  std::unique_ptr<StreamThreads> eval_threads;
  std::atomic<bool> evaluating{false};
  std::optional<Fault> fault;
  // Sends started and not yet done (ops.cpp), each with the tensor it reads and its op: a stream
  // does not wait for its peer's receive. PIPER_BLOCKING_SENDS=1 waits as before, to measure the
  // difference (bench/send_priority_bench.sh).
  struct InFlight {
    std::unique_ptr<Communicator::PendingSend> send;
    torch::Tensor data;
    ir::NodeId op;
  };
  std::mutex sends_mu;
  std::vector<InFlight> in_flight;
  bool blocking_sends = false;

  Impl(const sched::Plan& p, const std::string& path, const TokenData& d, Communicator& c, ExecutorOptions o);

  const ir::Node& node(ir::NodeId v) const { return g.nodes[static_cast<size_t>(v)]; }
  PieceIO& io_of(const ir::Node& n) { return pieces_io.at({n.stage, n.microbatch, n.segment}); }
  PieceIO& io_at(const ir::Node& n, int16_t segment) { return pieces_io.at({n.stage, n.microbatch, segment}); }
  StageParams& params_of(const ir::Node& n) { return *params.at(n.stage); }
  const PieceModules& modules_of(const ir::Node& n) {
    return pieces.at(n.stage).at(static_cast<size_t>(n.segment < 0 ? 0 : n.segment));
  }
  bool last_piece(const ir::Node& n) const {
    return n.stage == view.last_stage && (n.segment < 0 || size_t(n.segment) + 1 == g.stage(n.stage).segments.size());
  }
  torch::TensorOptions on_device(torch::ScalarType t = torch::kFloat) const { return torch::TensorOptions().dtype(t).device(dev); }

  // Setup (executor.cpp), and the model assembled into this rank's stages (assembly.cpp).
  void setup();
  void check_inputs();
  // A communication op's peer or group and their hosts, for the watchdog ("from rank 2 on host h1").
  std::string describe_peers(ir::NodeId v, const HostMap& hosts) const;
  void assemble_stages();
  void index_dataflow();
  void sharded_modules(RegionId r, const ir::Segment& seg, PieceModules& pm);
  PieceModules with_groups(int32_t stage, PieceModules pm) const;
  std::vector<ir::Range> sequence_shared(const ir::StageFacts& f) const;
  void tensor_parallel_params(int32_t stage, const ir::StageFacts& f, std::vector<SliceOf> slices);
  void release_others(const std::set<std::string>& kept);
  RegionId child_of_kind(RegionId under, const std::string& kind) const;

  // The ops (ops.cpp).
  ir::NodeId source(ir::NodeId v, bool backward) const;
  std::vector<int64_t> per_sample_shape(RegionId region, bool input) const;
  LossFn loss_for(const ir::Node& n);
  void forward(ir::NodeId v);
  void backward(ir::NodeId v);
  void all_to_all(ir::NodeId v);
  void send(ir::NodeId v);
  void reap_sends();
  // Which ops the thread that makes them ready posts itself (StreamThreads::set_post_inline): a
  // started send on the CPU; none with blocking sends or on a device, whose sends launch on their
  // own stream's queue. A send a fault is injected into stays on its stream's thread.
  std::function<bool(ir::NodeId)> post_inline_sends();
  void finish_sends();
  void recv(ir::NodeId v);
  void sum_tied(int32_t tie);
  void sum_copies(int32_t stage);
  void global_norm();
  void run(ir::NodeId v);
  void run_op(ir::NodeId v);

  StepResult step(int64_t s);
  void begin_pass();
  double pass_loss();
  void end_pass();
  void prepare_evaluation();
  double evaluate(const TokenData& val, int64_t batches);
};

}  // namespace piper::runtime
