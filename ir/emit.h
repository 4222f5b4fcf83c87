// Text forms of the DAG: token listing (golden files), dag-json (tools), Graphviz dot (pictures).
#pragma once
#include <string>

#include "ir/graph.h"

namespace piper::ir {

std::string emit_dag_text(const Graph& g);
std::string emit_dag_json(const Graph& g);
std::string emit_dot(const Graph& g);
std::string rank_list(const std::vector<int32_t>& ranks);  // "0-3,8,10"
// Where the plan lands on hosts (facts.hosts): each host's ranks (under `names` when given, by host
// index), which mesh axes stay inside a host and which cross, and per step what goes over the
// network (sends and collectives, with bytes). Empty for a plan on one host.
std::string emit_hosts(const Graph& g, const std::vector<std::string>& names = {});

}  // namespace piper::ir
