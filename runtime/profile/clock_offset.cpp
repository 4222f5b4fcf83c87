#include "runtime/profile/clock_offset.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "runtime/view/rank_view.h"

namespace piper::runtime {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
constexpr int kPingTag = (1 << 30) + 2, kPongTag = (1 << 30) + 3;
}  // namespace

std::vector<double> clock_offsets(Communicator& comm, const HostMap& hosts, int rounds) {
  const size_t world = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  std::vector<double> offsets(world, 0.0);
  auto measured = [&](size_t r) { return hosts.host_of.at(r) != hosts.host_of.at(0); };
  // One peer at a time, so that no other traffic lengthens a trip.
  for (size_t r = 1; r < world; ++r) {
    if (!measured(r) || (me != 0 && me != r)) continue;
    const int peer = me == 0 ? static_cast<int>(r) : 0;
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < rounds; ++i) {
      if (me == 0) {
        const double t0 = now();
        double t1 = 0;
        comm.send(&t0, sizeof t0, peer, kPingTag);
        comm.recv(&t1, sizeof t1, peer, kPongTag);
        const double t2 = now();
        if (t2 - t0 < best) {
          best = t2 - t0;
          offsets[r] = t1 - (t0 + t2) / 2;
        }
      } else {
        double t0 = 0;
        comm.recv(&t0, sizeof t0, peer, kPingTag);
        const double t1 = now();
        comm.send(&t1, sizeof t1, peer, kPongTag);
      }
    }
  }
  if (me != 0) std::fill(offsets.begin(), offsets.end(), 0.0);  // rank 0 holds the measurements
  comm.prepare_group(everyone(comm), kHashChannel);  // (again where a caller did: no harm)
  comm.all_reduce_sum(offsets.data(), offsets.size(), everyone(comm), kHashChannel);
  return offsets;
}

}  // namespace piper::runtime
