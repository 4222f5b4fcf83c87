// How long each DAG node takes: from a machine description (FLOP/s, bandwidths) or unit costs.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "ir/graph.h"
#include "lang/manifest.h"
#include "lang/diagnostic.h"

namespace piper::sched {

struct Link {
  double bandwidth = 0;  // bytes per second, per rank
  double latency = 0;    // seconds per message
};

// Seconds as a straight line in one variable: per microbatch of x samples, or per x parameter bytes.
struct Affine {
  double fixed = 0, per = 0;
  double at(double x) const { return fixed + per * x; }
};

// One region's measured chunk times (`piper-run --profile`), per microbatch of x samples. BI and BW
// are measured with an input that needs its gradient; on the model's first region nothing does.
struct RegionTimes {
  Affine F, B, BI, BW;
};

// The roofline (machine file "roofline"): each piece of a region's work (manifest `work`) takes
// max(FLOPs / (peak × efficiency), bytes / (memory bandwidth × efficiency)). A matrix product's
// efficiency is `gemm_efficiency` times what tile and wave quantization leave of the device (output
// tiles of tile_m × tile_n spread over the SMs in waves: NVIDIA's Matrix Multiplication Background
// guide); attention's is flash attention's, forward and backward; memory-bound work streams.
struct Roofline {
  double peak_bf16 = 0, peak_fp32 = 0;  // dense FLOP/s per precision
  double gemm_efficiency = 1;
  int64_t tile_m = 128, tile_n = 128;
  double attention_forward = 1, attention_backward = 1;
  double memory_efficiency = 1;
};

struct Machine {
  std::string name;
  double flops = 0;             // sustained FLOP/s per device for the model's precision
  double memory_bytes = 0;      // device memory
  double memory_bandwidth = 0;  // bytes/s, for the optimizer update
  int64_t sms = 0;              // streaming multiprocessors per device (0: not stated; `sms` unpriced)
  std::optional<Roofline> roofline;  // prices regions by their `work` (else FLOPs at `flops`)
  Link default_link;                 // inside a host
  std::map<std::string, Link> axes;  // per mesh axis, e.g. pp across nodes, dp inside a node
  // Between hosts (per rank: a host's network bandwidth over the ranks that use it at once), for a
  // send or collective the plan's hosts say goes between them (ir::HostFacts). `ranks_per_host`:
  // how piper-check places a world on hosts when --hosts does not say (0: one host).
  std::optional<Link> network;
  std::optional<Link> network_collectives;  // collectives' own link between hosts (fitted to a ring's all-reduce)
  int64_t ranks_per_host = 0;
  // Measured on this machine (`piper-run --profile`), preferred where present: chunk times per
  // region by name (the model's; a region not listed falls back to FLOPs), the optimizer step per
  // parameter byte, and collectives' own link (a link fitted to the all-reduce, not to point-to-point).
  std::map<std::string, RegionTimes> regions;
  std::optional<Affine> update;
  std::optional<Link> collectives;
  // Measured over simulated time of a real training step (piper-run --profile runs one): what the
  // regions' times are multiplied by inside a step. B applies to BI and BW too. `collective`: the
  // seconds each collective takes beyond the link's formula when the executor issues it (handed to
  // its stream's thread, waited for without spinning), from a ZeRO-3 step's per-layer collectives.
  // `p2p`: the seconds a pipeline handoff that a stage waits for takes beyond the link's formula
  // (the transfer as the progress thread completes it, the consumer's wake-up), from a 1F1B step.
  struct Calibration {
    double F = 1, B = 1, U = 1;
    double collective = 0, p2p = 0;
  } calibration;
};

// Parses a machine description (machines/*.json). Errors are reported against the file.
std::optional<Machine> parse_machine(FileId file, const SourceManager& sources, DiagnosticEngine& diags);

// One piece of a region's work on `machine`'s roofline (which it must have) in pass `op` (F, B, BI,
// BW), at `rows` times its rows (samples, or tokens routed to an expert), split `ways` by tp.
double roofline_seconds(const Machine& machine, const Work& w, ir::Op op, double rows, int64_t ways, bool bf16);

// Unit costs for schedule studies: `--cost F=1,B=2,W=1,comm=0[,FB=3]`. B is a whole backward;
// a split one is BI = B - W plus BW = W. FB prices an overlapped pair as one interval (the published
// DualPipe formula's F&B); without it the pair's members run in turn, as the CPU executor runs them.
struct UnitCosts {
  double F = 1, B = 2, W = 1, comm = 0, update = 0;
  std::optional<double> FB;
};
std::optional<UnitCosts> parse_unit_costs(const std::string& spec, std::string* error);

// Whether a communication node runs on the network between hosts (its group spans hosts, or its
// pipeline handoff goes to another host): the tier the cost model prices it on, and reports show.
bool on_network(const ir::Graph& g, const ir::Node& n);

class CostModel {
 public:
  static CostModel unit(UnitCosts c) { CostModel m; m.unit_ = c; return m; }
  // `manifest` resolves the machine's measured regions by name (the model's first sequence region
  // takes no input gradient: a piece that starts with it has nothing for BI, all for BW).
  static CostModel machine(Machine mc, const std::vector<std::string>& axes, int64_t samples, const Manifest& manifest);
  // Seconds (or units) for one node of `g`; `group_size` is the number of ranks along a collective's
  // axis; `share` is a chunk's part of its stage's work (a piece's FLOPs over the stage's), since
  // unit costs are per whole stage.
  double cost(const ir::Graph& g, const ir::Node& n, int64_t group_size, double share = 1) const;
  // Whether every chunk of `g` is priced from measured region times (otherwise FLOPs or units).
  bool measured(const ir::Graph& g) const;
  // Whether chunks are priced on the machine's roofline from the manifest's `work`.
  bool roofline() const { return !work_.empty(); }
  // An overlapped group's duration given its members' costs.
  double overlap(double sum_of_members) const { return unit_ && unit_->FB ? *unit_->FB : sum_of_members; }
  // Whether an overlapped group is priced as one interval (unit costs' FB). Otherwise its members
  // run whole, one after another, as the executor's overlap window runs them.
  bool prices_pairs() const { return unit_ && unit_->FB; }
  bool is_unit() const { return unit_.has_value(); }
  // Chunk times measured in a run, by op token (op_times_from_trace): a chunk listed here costs what
  // it took there, whatever the machine or units say; the rest, communication included, as before.
  void set_measured_ops(std::map<std::string, double> seconds) { measured_ops_ = std::move(seconds); }
  const std::optional<Machine>& machine_desc() const { return machine_; }
  // The collectives a piece runs inside (tensor parallelism's all-reduces, context parallelism's
  // ring exchanges; none elsewhere): how many, the bytes they move, their seconds on the axis's tiers
  // (0 under unit costs), and whether its group spans hosts.
  struct PieceTraffic {
    int64_t calls = 0;
    double bytes = 0, seconds = 0;
    int32_t axis = -1;
    bool on_network = false;
    const char* op = "all_reduce (in pieces)";
    // Context parallelism: the shares' all-gather, its bytes and seconds (in `seconds`, not `bytes`).
    double gathered = 0, gathered_seconds = 0;
  };
  PieceTraffic piece_traffic(const ir::Graph& g, const ir::Node& n) const;

 private:
  std::optional<UnitCosts> unit_;
  std::optional<Machine> machine_;
  std::map<std::string, double> measured_ops_;
  std::vector<std::string> axes_;
  int64_t samples_ = 1;
  std::vector<std::optional<RegionTimes>> region_times_;  // by RegionId; empty where not measured
  RegionId first_region_ = -1;
  std::vector<int64_t> subtree_flops_;  // by RegionId: forward FLOPs per sample of the subtree
  // The manifest's tree and work, for the roofline (by RegionId).
  struct RegionWork {
    std::vector<RegionId> children;
    std::vector<Work> work;
    int64_t flops = 0;
  };
  std::vector<RegionWork> work_;
  // A chunk's seconds on the roofline, or nothing when the machine has none or no region says its work.
  std::optional<double> roofline_chunk(const ir::Graph& g, const ir::Node& n) const;
  // A measured piece's time, or nothing when one of its regions was not measured.
  std::optional<double> measured_chunk(const ir::Graph& g, const ir::Node& n) const;
  double split_share(const ir::Graph& g, const ir::Node& n) const;
  PieceTraffic ring_traffic(const ir::Graph& g, const ir::Node& n) const;
  // A collective's seconds on the tiers its group spans (inside a host, across hosts).
  double collective_seconds(const ir::Graph& g, ir::Op op, double bytes, int64_t group, int32_t axis) const;
  // The link a communication node runs on, along `axis`; `crosses`: its group or peer is on another host.
  const Link& link_for(const std::string& axis, bool crosses, bool collective) const;
};

}  // namespace piper::sched
