// The stream threads on hand-built programs: ops run in their stream's order, except inside an
// overlap window, where the first ready op goes next.
#include "runtime/device/stream_threads.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

using namespace piper;
using namespace piper::runtime;

namespace {
// Two forward pieces a and b on the compute stream (stream 0) and c on the comm stream (1): a
// needs c. With a window, c does not end before b has run (as an all-to-all waits for a peer) —
// up to 5 s, so that an executor that kept the head's order fails the check instead of hanging.
// Returns the order the ops finished in (a, b, c are nodes 0, 1, 2).
std::vector<ir::NodeId> run(bool window) {
  ir::Graph g;
  ir::GroupId r0 = g.group({0});
  auto add = [&](ir::Op op, int32_t mb, ir::StreamId st) {
    ir::Node n;
    n.op = op;
    n.stage = 0;
    n.microbatch = mb;
    n.ranks = r0;
    n.stream = st;
    return g.add(n);
  };
  const ir::NodeId a = add(ir::Op::F, 0, 0), b = add(ir::Op::F, 1, 0), c = add(ir::Op::AllToAll, 0, 1);
  sched::ClassProgram program{{0}, {sched::StreamProgram{0, {a, b}, {}}, sched::StreamProgram{1, {c}, {}}}};
  if (window) program.streams[0].window = {0, 0};
  std::vector<std::vector<ir::NodeId>> preds(g.nodes.size());
  preds[static_cast<size_t>(a)] = {c};
  StreamThreads threads(g, program, preds, 0, nullptr);
  std::mutex mu;
  std::condition_variable ran;
  std::vector<ir::NodeId> order;
  const StreamThreads::RunOp op = [&](ir::NodeId v) {
    std::unique_lock lk(mu);
    if (v == c && window)
      ran.wait_for(lk, std::chrono::seconds(5), [&] { return std::find(order.begin(), order.end(), b) != order.end(); });
    order.push_back(v);
    ran.notify_all();
  };
  const StreamThreads::OnFailure fail = [](const std::string& m) { FAIL(m); };
  CHECK(threads.run(1, op, fail, nullptr) == "");
  return order;
}
}  // namespace

TEST_CASE("stream threads: outside a window an op waits its turn, inside one the first ready runs") {
  // b is ready from the start, but in order it follows a, which waits for c.
  CHECK(run(false) == std::vector<ir::NodeId>{2, 0, 1});
  // In a window b runs while a waits.
  CHECK(run(true) == std::vector<ir::NodeId>{1, 2, 0});
}
