// Text forms of the DAG: token listing (golden files), dag-json (tools), Graphviz dot (pictures).
#pragma once
#include <string>

#include "ir/graph.h"

namespace piper::ir {

std::string emit_dag_text(const Graph& g);
std::string emit_dag_json(const Graph& g);
std::string emit_dot(const Graph& g);
std::string rank_list(const std::vector<int32_t>& ranks);  // "0-3,8,10"

}  // namespace piper::ir
