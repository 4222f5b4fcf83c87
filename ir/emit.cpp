#include "ir/emit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace piper::ir {

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

namespace {
std::string flag_text(uint8_t f) {
  std::vector<const char*> out;
  if (f & kRecompute) out.push_back("recompute");
  if (f & kMaterialize) out.push_back("materialize");
  if (f & kFreeParams) out.push_back("free_params");
  if (f & kShardGrads) out.push_back("shard_grads");
  return fmt::format("{}", fmt::join(out, ","));
}
}  // namespace

std::string emit_dag_text(const Graph& g) {
  Graph::Adjacency adj = g.adjacency();
  // Nodes are named by their tokens; a token that occurs twice (two replicate axes reducing the
  // same stage, say) gets its node id appended.
  std::unordered_map<std::string, int> uses;
  std::vector<std::string> names(g.nodes.size());
  for (size_t v = 0; v < g.nodes.size(); ++v) uses[names[v] = token(g.nodes[v])]++;
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (uses[names[v]] > 1) names[v] += fmt::format("#{}", v);
  std::string out = fmt::format("# {} nodes, {} edges. token ranks stream [axis] [bytes] [flags] <- inputs "
                                "(t: ordering only)\n",
                                g.nodes.size(), g.edges.size());
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& n = g.nodes[v];
    out += fmt::format("{} r{} {}", names[v], n.ranks >= 0 ? rank_list(g.ranks(n.ranks)) : "?", g.streams[n.stream]);
    if (n.axis >= 0) out += " axis=" + g.axis_name(n.axis);
    if (n.bytes) out += fmt::format(" {}B", n.bytes);
    if (n.overlap >= 0) out += fmt::format(" overlap={}", n.overlap);
    if (n.flags & ~kBackward) out += " " + flag_text(n.flags);
    std::vector<std::string> ins;
    for (int32_t k = adj.in_offsets[v]; k < adj.in_offsets[v + 1]; ++k) {
      const Edge& e = g.edges[static_cast<size_t>(adj.in_edges[static_cast<size_t>(k)])];
      std::string in = (e.kind == EdgeKind::Temporal ? "t:" : "") + names[static_cast<size_t>(e.src)];
      if (std::find(ins.begin(), ins.end(), in) == ins.end()) ins.push_back(std::move(in));  // e.g. saved + loss
    }
    if (!ins.empty()) out += fmt::format(" <- {}", fmt::join(ins, " "));
    out += "\n";
  }
  return out;
}

std::string emit_dag_json(const Graph& g) {
  using nlohmann::json;
  json nodes = json::array(), edges = json::array();
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& n = g.nodes[v];
    json j = {{"id", v},
              {"token", token(n)},
              {"kind", is_chunk(n.op) ? "chunk" : "comm"},
              {"op", op_name(n.op)},
              {"ranks", n.ranks >= 0 ? g.ranks(n.ranks) : std::vector<int32_t>{}},
              {"stream", g.streams[n.stream]},
              {"stage", n.stage},
              {"microbatch", n.microbatch},
              {"chunk", n.chunk},
              {"bytes", n.bytes}};
    if (n.segment >= 0) j["segment"] = n.segment;
    if (n.bucket >= 0) j["bucket"] = n.bucket;
    if (n.overlap >= 0) j["overlap"] = n.overlap;
    if (n.axis >= 0) j["axis"] = g.axis_name(n.axis);
    if (n.flags & ~kBackward) j["flags"] = flag_text(n.flags);
    nodes.push_back(std::move(j));
  }
  for (const Edge& e : g.edges) {
    json j = {{"src", e.src}, {"dst", e.dst}, {"kind", e.kind == EdgeKind::Temporal ? "temporal" : "data"}};
    if (e.kind == EdgeKind::Data) {
      j["bytes"] = e.bytes;
      if (e.label >= 0) j["tensor"] = g.tensor_names[static_cast<size_t>(e.label)];
    }
    edges.push_back(std::move(j));
  }
  return json{{"nodes", nodes}, {"edges", edges}}.dump(1) + "\n";
}

std::string emit_dot(const Graph& g) {
  std::string out = "digraph piper {\n  rankdir=LR;\n  node [shape=box, style=filled, fontname=monospace];\n";
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& n = g.nodes[v];
    const char* color = n.op == Op::F ? "#9fd89f" : n.op == Op::B || n.op == Op::BI ? "#9fbfe8"
                      : n.op == Op::BW ? "#c8a2e8" : n.op == Op::U ? "#e8e8a0" : "#f2c18d";
    out += fmt::format("  n{} [label=\"{}\\nr{}\", fillcolor=\"{}\"];\n", v, token(n),
                       n.ranks >= 0 ? rank_list(g.ranks(n.ranks)) : "?", color);
  }
  for (const Edge& e : g.edges)
    out += fmt::format("  n{} -> n{}{};\n", e.src, e.dst, e.kind == EdgeKind::Temporal ? " [style=dashed]" : "");
  return out + "}\n";
}

}  // namespace piper::ir
