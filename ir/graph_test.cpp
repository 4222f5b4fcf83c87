#include "ir/graph.h"

#include <doctest/doctest.h>

using namespace piper::ir;

namespace {
Node make(Op op, Payload p, int32_t stage, int32_t mb, int16_t seg = -1, int32_t bucket = -1, uint8_t flags = 0) {
  Node n;
  n.op = op;
  n.payload = p;
  n.stage = stage;
  n.microbatch = mb;
  n.segment = seg;
  n.bucket = bucket;
  n.flags = flags;
  return n;
}
}  // namespace

TEST_CASE("every node kind prints as a token that parses back to the same role") {
  const std::vector<std::pair<Node, std::string>> cases = {
      {make(Op::F, Payload::None, 2, 0), "2F0"},
      {make(Op::B, Payload::None, 0, 13), "0B13"},
      {make(Op::BI, Payload::None, 1, 3), "1BI3"},
      {make(Op::BW, Payload::None, 1, 3), "1BW3"},
      {make(Op::U, Payload::None, 7, -1), "7U"},
      {make(Op::F, Payload::None, 1, 0, 2), "1F0.s2"},
      {make(Op::Send, Payload::Act, 1, 3), "1SEND_F3"},
      {make(Op::Recv, Payload::Act, 2, 3), "2RECV_F3"},
      {make(Op::Send, Payload::ActGrad, 2, 3, -1, -1, kBackward), "2SEND_B3"},
      {make(Op::Recv, Payload::ActGrad, 1, 3, -1, -1, kBackward), "1RECV_B3"},
      {make(Op::AllReduce, Payload::Grad, 0, -1, -1, 1, kBackward), "0ALLREDUCE_G.b1"},
      {make(Op::ReduceScatter, Payload::Grad, 0, 4, -1, 0, kBackward), "0REDUCESCATTER_G4.b0"},
      {make(Op::AllGather, Payload::Param, 3, -1, -1, 2), "3ALLGATHER_P.b2"},
      {make(Op::AllGather, Payload::Param, 3, 5, -1, 0), "3ALLGATHER_PF5.b0"},
      {make(Op::AllGather, Payload::Param, 3, 5, -1, 0, kBackward), "3ALLGATHER_PB5.b0"},
      {make(Op::AllToAll, Payload::Dispatch, 1, 2, 1), "1A2A_DF2.s1"},
      {make(Op::AllToAll, Payload::Combine, 1, 2, 1), "1A2A_CF2.s1"},
      {make(Op::AllToAll, Payload::Combine, 1, 2, 1, -1, kBackward), "1A2A_CB2.s1"},
      {make(Op::AllToAll, Payload::Dispatch, 1, 2, 1, -1, kBackward), "1A2A_DB2.s1"},
      {make(Op::Broadcast, Payload::Param, 0, -1), "0BROADCAST_P"},
  };
  for (const auto& [node, text] : cases) {
    CAPTURE(text);
    CHECK(token(node) == text);
    auto back = parse_token(text);
    REQUIRE(back);
    CHECK(*back == node);
  }
}

TEST_CASE("malformed tokens do not parse") {
  for (const char* bad : {"", "F0", "1FOO0", "x1F0", "1F0.s", "1F0.b", "1F0junk", "1ALLGATHER_P3", "99999999999F0"}) {
    CAPTURE(bad);
    CHECK(!parse_token(bad));
  }
}

TEST_CASE("rank groups are interned and edges index compactly") {
  Graph g;
  GroupId a = g.group({0, 1, 2});
  CHECK(g.group({0, 1, 2}) == a);
  CHECK(g.group({0, 1}) != a);
  CHECK(g.ranks(a) == std::vector<int32_t>{0, 1, 2});
  NodeId x = g.add(Node{}), y = g.add(Node{}), z = g.add(Node{});
  g.connect(x, y, EdgeKind::Data);
  g.connect(y, z, EdgeKind::Temporal);
  auto order = g.topological_order();
  REQUIRE(order);
  CHECK(*order == std::vector<NodeId>{x, y, z});
  g.connect(z, x, EdgeKind::Temporal);
  std::vector<NodeId> stuck;
  CHECK(!g.topological_order(&stuck));
  CHECK(stuck.size() == 3);
  CHECK(sizeof(Node) <= 56);  // compact storage: no heap allocation per node
}
