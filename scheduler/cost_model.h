// How long each DAG node takes: from a machine description (FLOP/s, bandwidths) or unit costs.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "ir/graph.h"
#include "lang/diagnostic.h"

namespace piper::sched {

struct Link {
  double bandwidth = 0;  // bytes per second, per rank
  double latency = 0;    // seconds per message
};

struct Machine {
  std::string name;
  double flops = 0;             // sustained FLOP/s per device for the model's precision
  double memory_bytes = 0;      // device memory
  double memory_bandwidth = 0;  // bytes/s, for the optimizer update
  Link default_link;
  std::map<std::string, Link> axes;  // per mesh axis, e.g. pp across nodes, dp inside a node
};

// Parses a machine description (machines/*.json). Errors are reported against the file.
std::optional<Machine> parse_machine(FileId file, const SourceManager& sources, DiagnosticEngine& diags);

// Unit costs for schedule studies: `--cost F=1,B=2,W=1,comm=0[,FB=3]`. B is a whole backward;
// a split one is BI = B - W plus BW = W. FB is an overlapped forward+backward pair (default F+B).
struct UnitCosts {
  double F = 1, B = 2, W = 1, comm = 0, update = 0;
  std::optional<double> FB;
};
std::optional<UnitCosts> parse_unit_costs(const std::string& spec, std::string* error);

class CostModel {
 public:
  static CostModel unit(UnitCosts c) { CostModel m; m.unit_ = c; return m; }
  static CostModel machine(Machine mc, const std::vector<std::string>& axes, int64_t samples) {
    CostModel m;
    m.machine_ = std::move(mc);
    m.axes_ = axes;
    m.samples_ = samples;
    return m;
  }
  // Seconds (or units) for one node; `group_size` is the number of ranks along a collective's axis;
  // `share` is a chunk's part of its stage's work (a piece's FLOPs over the stage's), since unit
  // costs are per whole stage.
  double cost(const ir::Node& n, int64_t group_size, double share = 1) const;
  // An overlapped group's duration given its members' costs.
  double overlap(double sum_of_members) const { return unit_ && unit_->FB ? *unit_->FB : sum_of_members; }
  bool is_unit() const { return unit_.has_value(); }
  const std::optional<Machine>& machine_desc() const { return machine_; }

 private:
  std::optional<UnitCosts> unit_;
  std::optional<Machine> machine_;
  std::vector<std::string> axes_;
  int64_t samples_ = 1;
};

}  // namespace piper::sched
