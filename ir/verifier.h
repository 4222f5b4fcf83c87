// Structural invariants of the Global Training DAG; a violation is a bug in Piper, not the user's.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.h"

namespace piper::ir {

// The problems found (empty when the graph is well-formed). Between place and p2p, data edges may
// still cross ranks: `p2p_done` says whether that invariant applies yet.
std::vector<std::string> verify(const Graph& g, bool p2p_done = true);

}  // namespace piper::ir
