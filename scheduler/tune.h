// piper-tune's search: the strategy library's schedules × their parameters for N ranks, each
// compiled and simulated; what deadlocks, fails a check or exceeds the memory budget is rejected
// with its reason, the rest ranked by simulated step time. Deterministic.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lang/manifest.h"
#include "scheduler/plan.h"

namespace piper::sched {

struct TuneOptions {
  int64_t np = 1;
  std::optional<int64_t> batch_size;    // global samples per step; checked to split over replicas and microbatches
  std::optional<double> memory_budget;  // bytes per device
  std::string machine_path, cost_spec;  // costs, as piper-check takes them (both empty: unit costs)
  std::vector<std::string> library;     // strategy files to search (empty: every file of the library folder)
  std::vector<std::string> search_path;  // where `use` and the library are found (empty: the default)
  bool recompute = true;  // also each plan with its blocks' activations recomputed (`layers[*]`, the library's name)
  std::function<void(size_t done, size_t total)> progress;
};

struct Candidate {
  std::string strategy;                               // a library file name, e.g. "1f1b.piper"
  std::vector<std::pair<std::string, int64_t>> sets;  // its parameters, in the file's order (flags 0/1)
  bool recompute = false;                             // `recompute layers[*];` added: activations recomputed
  std::string rejected;                               // why not ("" when it is a valid plan)
  double step_time = 0;                               // simulated (seconds with a machine, else units)
  double bubble = 0;                                  // mean idle fraction of the ranks' compute streams
  int64_t peak_bytes = 0;                             // the fullest rank's predicted peak
  std::string label() const;                          // "1f1b pp=2 mb=8", "+recompute" when set
};

struct TuneResult {
  std::vector<Candidate> ranked;    // valid plans, fastest first (ties: less memory, then label)
  std::vector<Candidate> rejected;  // in enumeration order
  size_t twins = 0;  // plans dropped as a knob changed nothing (a balanced cut equal to the even one)
  bool unit_costs = true;
  size_t plans() const { return ranked.size() + rejected.size() + twins; }
};

// The library's boolean knobs (`balance`, `stage_unit`): searched as 0/1, written as false/true.
bool is_flag(const std::string& name);
std::string param_text(const std::string& name, int64_t value);  // "4", "true"

// The parameters a library file declares, with those of the files it uses (first declaration order).
std::vector<std::string> strategy_params(const std::string& path, const std::vector<std::string>& search_path);

TuneResult tune(const Manifest& m, const TuneOptions& o);

// A short strategy that uses the library file with the candidate's parameters (what -o writes).
std::string candidate_text(const Candidate& c, const std::string& model, const TuneOptions& o);

}  // namespace piper::sched
