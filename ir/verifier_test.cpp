#include "ir/verifier.h"

#include <doctest/doctest.h>

#include <algorithm>

using namespace piper::ir;

namespace {
// Two placed stages with a forward each, joined properly by send/recv.
struct Pipe {
  Graph g;
  NodeId f0, f1, send, recv;
  Pipe() {
    GroupId r0 = g.group({0}), r1 = g.group({1});
    f0 = g.add(Node{.op = Op::F, .stage = 0, .microbatch = 0, .ranks = r0});
    f1 = g.add(Node{.op = Op::F, .stage = 1, .microbatch = 0, .ranks = r1});
    send = g.add(Node{.op = Op::Send, .payload = Payload::Act, .stream = 2, .stage = 0, .microbatch = 0, .ranks = r0, .axis = 0, .bytes = 64});
    recv = g.add(Node{.op = Op::Recv, .payload = Payload::Act, .stream = 2, .stage = 1, .microbatch = 0, .ranks = r1, .axis = 0, .bytes = 64});
    g.connect(f0, send, EdgeKind::Data, 64);
    g.connect(send, recv, EdgeKind::Data, 64);
    g.connect(recv, f1, EdgeKind::Data, 64);
  }
};
bool says(const std::vector<std::string>& problems, const std::string& text) {
  return std::any_of(problems.begin(), problems.end(), [&](auto& p) { return p.find(text) != std::string::npos; });
}
}  // namespace

TEST_CASE("a well-formed graph verifies") {
  Pipe p;
  CHECK(verify(p.g).empty());
}

TEST_CASE("the verifier catches broken graphs") {
  SUBCASE("a data edge across ranks without send/recv") {
    Pipe p;
    p.g.connect(p.f0, p.f1, EdgeKind::Data, 64);
    CHECK(says(verify(p.g), "crosses ranks without a send/recv"));
    CHECK(verify(p.g, /*p2p_done=*/false).empty());
  }
  SUBCASE("a send without its recv") {
    Pipe p;
    p.g.edges[1].dst = p.f1;
    auto problems = verify(p.g);
    CHECK(says(problems, "0SEND_F0 has 0 matching recvs"));
    CHECK(says(problems, "1RECV_F0 has 0 matching sends"));
  }
  SUBCASE("a mismatched pair") {
    Pipe p;
    p.g.nodes[static_cast<size_t>(p.recv)].bytes = 32;
    CHECK(says(verify(p.g), "paired with a mismatched"));
  }
  SUBCASE("a cycle") {
    Pipe p;
    p.g.connect(p.f1, p.f0, EdgeKind::Data);
    CHECK(says(verify(p.g), "cycle"));
  }
  SUBCASE("a backward without its forward") {
    Pipe p;
    p.g.add(Node{.op = Op::B, .stage = 1, .microbatch = 0, .ranks = p.g.nodes[1].ranks});
    CHECK(says(verify(p.g), "1B0 does not follow its forward"));
  }
  SUBCASE("gradients that reach an update both reduced and not") {
    Pipe p;
    GroupId r0 = p.g.nodes[0].ranks;
    NodeId b = p.g.add(Node{.op = Op::B, .stage = 0, .microbatch = 0, .ranks = r0});
    NodeId u = p.g.add(Node{.op = Op::U, .stage = 0, .ranks = r0});
    NodeId ar = p.g.add(Node{.op = Op::AllReduce, .payload = Payload::Grad, .flags = kBackward, .stream = 1, .stage = 0, .bucket = 0, .ranks = r0, .axis = 0, .bytes = 8});
    p.g.connect(p.f0, b, EdgeKind::Data);
    p.g.connect(b, u, EdgeKind::Data);
    p.g.connect(b, ar, EdgeKind::Data);
    p.g.connect(ar, u, EdgeKind::Data);
    CHECK(says(verify(p.g), "both reduced and unreduced"));
  }
  SUBCASE("a backward whose gradients no path takes to the update") {
    Pipe p;
    GroupId r0 = p.g.nodes[0].ranks;
    NodeId b = p.g.add(Node{.op = Op::B, .stage = 0, .microbatch = 0, .ranks = r0});
    NodeId u = p.g.add(Node{.op = Op::U, .stage = 0, .ranks = r0});
    p.g.connect(p.f0, b, EdgeKind::Data);
    CHECK(says(verify(p.g), "0B0 does not reach 0U"));
    p.g.connect(b, u, EdgeKind::Temporal);  // an order suffices: the gradients are where the optimizer reads them
    CHECK(verify(p.g).empty());
  }
  SUBCASE("a duplicated chunk") {
    Pipe p;
    p.g.add(p.g.nodes[0]);
    CHECK(says(verify(p.g), "0F0 appears twice"));
  }
  SUBCASE("a storage layout whose shards overlap or leave elements unstepped") {
    Pipe p;
    StageFacts st;
    st.dense_elems = 10;
    st.storage.zero = 2;
    st.storage.members = {MemberStorage{{Range{0, 5}}, 10, 5}, MemberStorage{{Range{5, 10}}, 10, 5}};
    p.g.facts.stages = {st};
    CHECK(verify(p.g).empty());
    p.g.facts.stages[0].storage.members[1].stepped = {Range{4, 10}};
    CHECK(says(verify(p.g), "elements 4..5 are stepped by two members"));
    p.g.facts.stages[0].storage.members[1].stepped = {Range{6, 10}};
    CHECK(says(verify(p.g), "elements 5..6 are stepped by no members"));
    p.g.facts.stages[0].storage.members[1].stepped = {Range{5, 9}};
    CHECK(says(verify(p.g), "the members step 9 of 10 elements"));
    p.g.facts.stages[0].storage.zero = 0;
    CHECK(says(verify(p.g), "a member without ZeRO does not step its whole layout"));
  }
}
