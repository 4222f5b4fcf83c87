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

// A parameter as the search sees it, from its declaration (`param mb = 8 in {1, 2, 4, 8};`).
struct SearchParam {
  std::string name;
  std::vector<int64_t> values;  // its domain for this world (booleans 0/1); empty: kept at its default
  bool boolean = false;         // a flag: written true/false, labelled by its name when set
  bool sizes_mesh = false;      // a mesh axis is this parameter (`mesh pp = pp;`): the product is the world
};

struct Setting {
  std::string name;
  int64_t value = 0;
  bool boolean = false;
  int64_t plain = 0;  // its domain's first value
  std::string text() const;  // "4", "true"
};

struct Candidate {
  std::string strategy;        // a library file name, e.g. "1f1b.piper"
  std::vector<Setting> sets;   // its searched parameters, in the file's order
  bool recompute = false;                             // `recompute layers[*];` added: activations recomputed
  std::string rejected;                               // why not ("" when it is a valid plan)
  double step_time = 0;                               // simulated (seconds with a machine, else units)
  double bubble = 0;                                  // mean idle fraction of the ranks' compute streams
  int64_t peak_bytes = 0;                             // the fullest rank's predicted peak
  uint64_t plan_hash = 0;                             // the compiled plan's identity (twins share it)
  // Megatron's accounting (Narayanan et al. 2021): model FLOPs per step are three forwards' (the
  // backward twice the forward) of the manifest's regions over the global batch, recomputation not
  // counted; MFU divides their rate per device by its dense peak in the plan's precision. Zero when
  // the batch is not given, or the plan is not priced on a machine file's roofline.
  double model_flops = 0;
  double peak_flops = 0;
  double tflops_per_device(int64_t np) const { return step_time > 0 ? model_flops / step_time / double(np) / 1e12 : 0; }
  double mfu(int64_t np) const { return peak_flops > 0 ? tflops_per_device(np) * 1e12 / peak_flops : 0; }
  std::string label() const;                          // "1f1b pp=2 mb=8", "+recompute" when set
};

struct TuneResult {
  std::vector<Candidate> ranked;    // valid plans, fastest first (ties: less memory, then label)
  std::vector<Candidate> rejected;  // in enumeration order
  size_t twins = 0;  // dropped as a parameter changed nothing (a balanced cut equal to the even one)
  bool unit_costs = true;
  size_t plans() const { return ranked.size() + rejected.size() + twins; }
};

// The parameters a library file declares, with those of the files it uses (first declaration order),
// their domains evaluated for np ranks. piper-tune knows no parameter by name: what it searches is
// what the files declare.
std::vector<SearchParam> strategy_params(const std::string& path, const std::vector<std::string>& search_path, int64_t np);

TuneResult tune(const Manifest& m, const TuneOptions& o);

// The candidate's plan, compiled again (piper-tune --report draws its winner); nothing, with the
// first error in `errors`, when it does not compile.
std::optional<Plan> candidate_plan(const Candidate& c, const Manifest& m, const TuneOptions& o, std::string* errors);

// A short strategy that uses the library file with the candidate's parameters (what -o writes).
std::string candidate_text(const Candidate& c, const std::string& model, const TuneOptions& o);

}  // namespace piper::sched
