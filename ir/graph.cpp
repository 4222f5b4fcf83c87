#include "ir/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <deque>

namespace piper::ir {

const char* op_name(Op op) {
  switch (op) {
    case Op::F: return "F";
    case Op::B: return "B";
    case Op::BI: return "BI";
    case Op::BW: return "BW";
    case Op::U: return "U";
    case Op::Send: return "send";
    case Op::Recv: return "recv";
    case Op::AllReduce: return "all_reduce";
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllToAll: return "all_to_all";
    case Op::Broadcast: return "broadcast";
  }
  return "?";
}

GroupId Graph::group(const std::vector<int32_t>& ranks) {
  std::string key(reinterpret_cast<const char*>(ranks.data()), ranks.size() * sizeof(int32_t));
  auto [it, fresh] = group_index_.emplace(std::move(key), static_cast<GroupId>(groups_.size()));
  if (fresh) groups_.push_back(ranks);
  return it->second;
}

StreamId Graph::stream(std::string_view name) {
  for (size_t i = 0; i < streams.size(); ++i)
    if (streams[i] == name) return static_cast<StreamId>(i);
  streams.emplace_back(name);
  return static_cast<StreamId>(streams.size() - 1);
}

int32_t Graph::tensor(std::string_view name) {
  auto [it, fresh] = tensor_index_.emplace(std::string(name), static_cast<int32_t>(tensor_names.size()));
  if (fresh) tensor_names.emplace_back(name);
  return it->second;
}

void Graph::remove_dead_edges() {
  edges.erase(std::remove_if(edges.begin(), edges.end(), [](const Edge& e) { return e.kind == EdgeKind::Dead; }),
              edges.end());
}

Graph::Adjacency Graph::adjacency() const {
  Adjacency a;
  size_t n = nodes.size();
  a.out_offsets.assign(n + 1, 0);
  a.in_offsets.assign(n + 1, 0);
  for (const Edge& e : edges) {
    if (e.kind == EdgeKind::Dead) continue;
    ++a.out_offsets[static_cast<size_t>(e.src) + 1];
    ++a.in_offsets[static_cast<size_t>(e.dst) + 1];
  }
  for (size_t i = 0; i < n; ++i) {
    a.out_offsets[i + 1] += a.out_offsets[i];
    a.in_offsets[i + 1] += a.in_offsets[i];
  }
  a.out_edges.resize(static_cast<size_t>(a.out_offsets[n]));
  a.in_edges.resize(static_cast<size_t>(a.in_offsets[n]));
  std::vector<int32_t> out_fill(a.out_offsets.begin(), a.out_offsets.end() - 1);
  std::vector<int32_t> in_fill(a.in_offsets.begin(), a.in_offsets.end() - 1);
  for (size_t i = 0; i < edges.size(); ++i) {
    const Edge& e = edges[i];
    if (e.kind == EdgeKind::Dead) continue;
    a.out_edges[static_cast<size_t>(out_fill[static_cast<size_t>(e.src)]++)] = static_cast<int32_t>(i);
    a.in_edges[static_cast<size_t>(in_fill[static_cast<size_t>(e.dst)]++)] = static_cast<int32_t>(i);
  }
  return a;
}

std::optional<std::vector<NodeId>> Graph::topological_order(std::vector<NodeId>* on_cycle) const {
  Adjacency a = adjacency();
  size_t n = nodes.size();
  std::vector<int32_t> indegree(n);
  for (size_t i = 0; i < n; ++i) indegree[i] = a.in_offsets[i + 1] - a.in_offsets[i];
  std::vector<NodeId> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (indegree[i] == 0) order.push_back(static_cast<NodeId>(i));
  for (size_t head = 0; head < order.size(); ++head) {
    NodeId v = order[head];
    for (int32_t k = a.out_offsets[static_cast<size_t>(v)]; k < a.out_offsets[static_cast<size_t>(v) + 1]; ++k) {
      NodeId w = edges[static_cast<size_t>(a.out_edges[static_cast<size_t>(k)])].dst;
      if (--indegree[static_cast<size_t>(w)] == 0) order.push_back(w);
    }
  }
  if (order.size() == n) return order;
  if (on_cycle) {
    on_cycle->clear();
    for (size_t i = 0; i < n; ++i)
      if (indegree[i] > 0) on_cycle->push_back(static_cast<NodeId>(i));
  }
  return std::nullopt;
}

bool holds_value(const Graph& g, const Edge& e) {
  if (e.kind != EdgeKind::Data) return false;
  if (e.label >= 0 && static_cast<size_t>(e.label) < g.tensor_names.size() && g.tensor_names[static_cast<size_t>(e.label)] == "param_grads")
    return false;
  const Op dst = g.nodes[static_cast<size_t>(e.dst)].op, src = g.nodes[static_cast<size_t>(e.src)].op;
  return !(dst == Op::BW && (src == Op::F || src == Op::BI));
}

size_t Graph::memory_bytes() const {
  size_t b = nodes.capacity() * sizeof(Node) + edges.capacity() * sizeof(Edge);
  for (const auto& g : groups_) b += g.capacity() * sizeof(int32_t) + sizeof(g);
  return b;
}

namespace {
struct OpName {
  const char* name;
  Op op;
  Payload payload;
  bool backward;
};
// Longest names first so parsing can take the first prefix that matches.
constexpr OpName kNames[] = {
    {"REDUCESCATTER_G", Op::ReduceScatter, Payload::Grad, true},
    {"ALLGATHER_PF", Op::AllGather, Payload::Param, false},
    {"ALLGATHER_PB", Op::AllGather, Payload::Param, true},
    {"ALLREDUCE_G", Op::AllReduce, Payload::Grad, true},
    {"ALLREDUCE_T", Op::AllReduce, Payload::Tied, true},
    {"ALLREDUCE_C", Op::AllReduce, Payload::Copy, true},
    {"ALLREDUCE_N", Op::AllReduce, Payload::Norm, true},
    {"BROADCAST_P", Op::Broadcast, Payload::Param, false},
    {"ALLGATHER_P", Op::AllGather, Payload::Param, false},
    {"A2A_DF", Op::AllToAll, Payload::Dispatch, false},
    {"A2A_CF", Op::AllToAll, Payload::Combine, false},
    {"A2A_DB", Op::AllToAll, Payload::Dispatch, true},
    {"A2A_CB", Op::AllToAll, Payload::Combine, true},
    {"SEND_F", Op::Send, Payload::Act, false},
    {"RECV_F", Op::Recv, Payload::Act, false},
    {"SEND_B", Op::Send, Payload::ActGrad, true},
    {"RECV_B", Op::Recv, Payload::ActGrad, true},
    {"BI", Op::BI, Payload::None, true},
    {"BW", Op::BW, Payload::None, true},
    {"F", Op::F, Payload::None, false},
    {"B", Op::B, Payload::None, true},
    {"U", Op::U, Payload::None, false},
};

// ALLGATHER_P has two forms: after the update (once per step) and, for ZeRO-3, before a use.
bool matches(const OpName& o, const Node& n) {
  if (o.op != n.op || o.payload != n.payload) return false;
  if (is_chunk(n.op)) return true;
  if (n.op == Op::AllGather && n.microbatch < 0) return std::string_view(o.name) == "ALLGATHER_P";
  if (n.op == Op::AllGather) return std::string_view(o.name) != "ALLGATHER_P" && o.backward == bool(n.flags & kBackward);
  if (n.op == Op::AllToAll) return o.backward == bool(n.flags & kBackward);
  return true;
}
}  // namespace

std::string token(const Node& n) {
  const char* name = "?";
  for (const auto& o : kNames)
    if (matches(o, n)) {
      name = o.name;
      break;
    }
  std::string out = fmt::format("{}{}", n.stage, name);
  if (n.microbatch >= 0) out += std::to_string(n.microbatch);
  if (n.segment >= 0) out += fmt::format(".s{}", n.segment);
  if (n.bucket >= 0) out += fmt::format(".b{}", n.bucket);
  return out;
}

std::optional<Node> parse_token(std::string_view text) {
  auto number = [&](int32_t& out) {
    size_t len = 0;
    while (len < text.size() && text[len] >= '0' && text[len] <= '9') ++len;
    if (len == 0 || len > 9) return false;
    std::from_chars(text.data(), text.data() + len, out);
    text.remove_prefix(len);
    return true;
  };
  Node n;
  if (!number(n.stage)) return std::nullopt;
  const OpName* found = nullptr;
  for (const auto& o : kNames)
    if (text.substr(0, strlen(o.name)) == o.name) {
      // A name must not run on into more capitals ("F" is not a prefix match of "FOO").
      size_t len = strlen(o.name);
      if (len < text.size() && ((text[len] >= 'A' && text[len] <= 'Z') || text[len] == '_')) continue;
      found = &o;
      break;
    }
  if (!found) return std::nullopt;
  text.remove_prefix(strlen(found->name));
  n.op = found->op;
  n.payload = found->payload;
  if (!is_chunk(n.op) && found->backward) n.flags |= kBackward;
  if (!text.empty() && text[0] >= '0' && text[0] <= '9' && !number(n.microbatch)) return std::nullopt;
  if (text.substr(0, 2) == ".s") {
    text.remove_prefix(2);
    int32_t seg = 0;
    if (!number(seg)) return std::nullopt;
    n.segment = static_cast<int16_t>(seg);
  }
  if (text.substr(0, 2) == ".b") {
    text.remove_prefix(2);
    if (!number(n.bucket)) return std::nullopt;
  }
  if (!text.empty()) return std::nullopt;
  // ALLGATHER_PF/_PB carry a microbatch; ALLGATHER_P does not.
  if (n.op == Op::AllGather && n.microbatch >= 0 && std::string_view(found->name) == "ALLGATHER_P") return std::nullopt;
  return n;
}

}  // namespace piper::ir
