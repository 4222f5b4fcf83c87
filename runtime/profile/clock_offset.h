// Each rank's steady clock against rank 0's, for a time axis shared across hosts (piper-run --trace).
#pragma once
#include <vector>

#include "runtime/comm/communicator.h"

namespace piper::runtime {

// Collective over every rank: per rank, its clock minus rank 0's, in seconds (0 for rank 0).
// Ranks on rank 0's host share its clock (CLOCK_MONOTONIC) and get 0 without measuring; the others
// are measured by round trips from rank 0 (Cristian's method): the other rank reads its clock when
// rank 0's ping arrives, and the round with the shortest trip is taken, where that reading lies
// closest to the trip's midpoint (its error is at most half that trip, in practice far less).
std::vector<double> clock_offsets(Communicator& comm, const HostMap& hosts, int rounds = 64);

}  // namespace piper::runtime
