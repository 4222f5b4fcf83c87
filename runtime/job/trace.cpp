#include "runtime/job/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/profile/clock_offset.h"
#include "runtime/view/rank_view.h"

namespace piper::runtime {

// Rank 0 collects every rank's spans into one Perfetto/Chrome trace: a process per rank, a thread
// per stream, on one time axis. Each rank times its ops on its own steady clock. Ranks on one host
// share that clock (CLOCK_MONOTONIC); a rank on another host is shifted by its clock's offset from
// rank 0's, measured by round trips (clock_offset.h): a barrier would leave the exit skew of the
// MPI progress thread's sleep, up to milliseconds. The earliest op of any rank starts at 0.
void write_trace(Communicator& comm, const std::vector<std::pair<int64_t, StepResult>>& steps, const std::string& path) {
  const size_t world = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  const std::vector<int> ranks = everyone(comm);
  comm.prepare_group(ranks, kHashChannel);
  const std::vector<double> offset_of = clock_offsets(comm, comm.hosts());
  // Per rank: its first op's start, on rank 0's clock.
  std::vector<double> first(world, 0.0);
  first[me] = std::numeric_limits<double>::max();
  for (const auto& [step, r] : steps) first[me] = std::min(first[me], r.ops_began - offset_of[me]);
  if (steps.empty()) first[me] = 0;
  comm.all_reduce_sum(first.data(), first.size(), ranks, kHashChannel);
  const double origin = *std::min_element(first.begin(), first.end());
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [step, r] : steps) {
    const double offset = r.ops_began - offset_of[me] - origin;
    for (const auto& op : r.ops) {
      events.push_back({{"name", op.token}, {"ph", "X"}, {"pid", comm.rank()}, {"tid", op.stream},
                        {"ts", (offset + op.start) * 1e6}, {"dur", (op.end - op.start) * 1e6}, {"args", {{"step", step + 1}}}});
      // A counter track: the rank's tensor memory after each op.
      events.push_back({{"name", "tensor memory"}, {"ph", "C"}, {"pid", comm.rank()}, {"ts", (offset + op.end) * 1e6},
                        {"args", {{"MiB", double(op.live_bytes) / (1 << 20)}}}});
    }
  }
  std::string mine = events.dump();
  const int kLenTag = 1 << 30, kDataTag = (1 << 30) + 1;
  if (comm.rank() != 0) {
    uint64_t n = mine.size();
    comm.send(&n, sizeof n, 0, kLenTag);
    comm.send(mine.data(), mine.size(), 0, kDataTag);
    return;
  }
  nlohmann::json all = nlohmann::json::array();
  auto add = [&](const nlohmann::json& evs, int rank) {
    all.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
    for (const auto& e : evs) all.push_back(e);
  };
  add(events, 0);
  for (int r = 1; r < comm.size(); ++r) {
    uint64_t n = 0;
    comm.recv(&n, sizeof n, r, kLenTag);
    std::string text(n, '\0');
    comm.recv(text.data(), n, r, kDataTag);
    add(nlohmann::json::parse(text), r);
  }
  // The shifts applied, so a reader can judge the alignment (on a test bed of namespaces on one
  // machine the true offsets are 0).
  std::ofstream(path) << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"},
                                        {"otherData", {{"clock_offsets_s", offset_of}}}}.dump() << "\n";
}

}  // namespace piper::runtime
