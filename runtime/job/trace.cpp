#include "runtime/job/trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/view/rank_view.h"

namespace piper::runtime {

// Rank 0 collects every rank's spans into one Perfetto/Chrome trace: a process per rank, a thread
// per stream, on one time axis. Each rank times its ops on its own steady clock. Ranks on one host
// share that clock (CLOCK_MONOTONIC), so their times are used as they are. Across hosts, every rank
// reads its clock after a barrier, an instant common to all to within the barrier's exit skew (the
// MPI progress thread's sleep: up to a millisecond), and times are taken from there. Either way the
// earliest op of any rank starts at 0.
void write_trace(Communicator& comm, const std::vector<std::pair<int64_t, StepResult>>& steps, const std::string& path) {
  const size_t world = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  const std::vector<int> ranks = everyone(comm);
  comm.prepare_group(ranks, kHashChannel);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const size_t h = std::hash<std::string>{}(host);
  // Per rank: its host (two exact halves), its clock after the barrier, its first op's start.
  std::vector<double> facts(4 * world, 0.0);
  double sync = 0;
  comm.all_reduce_sum(&sync, 1, ranks, kHashChannel);
  comm.all_reduce_sum(&sync, 1, ranks, kHashChannel);  // the second starts with the ranks together
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  double first = now;
  for (const auto& [step, r] : steps) first = std::min(first, r.ops_began);
  facts[4 * me] = static_cast<double>(h >> 32);
  facts[4 * me + 1] = static_cast<double>(h & 0xffffffffu);
  facts[4 * me + 2] = now;
  facts[4 * me + 3] = first;
  comm.all_reduce_sum(facts.data(), facts.size(), ranks, kHashChannel);
  bool one_host = true;
  for (size_t r = 1; r < world; ++r) one_host &= facts[4 * r] == facts[0] && facts[4 * r + 1] == facts[1];
  double shift = 0;  // added to this rank's clock: the common axis
  if (!one_host) shift = facts[2] - now;  // rank 0's reading of the barrier's instant
  double origin = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < world; ++r) origin = std::min(origin, facts[4 * r + 3] + (one_host ? 0 : facts[2] - facts[4 * r + 2]));
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [step, r] : steps) {
    const double offset = r.ops_began + shift - origin;
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
  std::ofstream(path) << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

}  // namespace piper::runtime
