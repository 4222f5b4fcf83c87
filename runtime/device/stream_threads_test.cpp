// The stream threads on hand-built programs: ops run in their stream's order, except inside an
// overlap window, where the first ready op goes next.
#include "runtime/device/stream_threads.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace piper;
using namespace piper::runtime;

namespace {
// An op of stage 0 on rank group `r0`.
ir::NodeId add_op(ir::Graph& g, ir::GroupId r0, ir::Op op, int32_t mb, ir::StreamId st) {
  ir::Node n;
  n.op = op;
  n.stage = 0;
  n.microbatch = mb;
  n.ranks = r0;
  n.stream = st;
  return g.add(n);
}

// Two forward pieces a and b on the compute stream (stream 0) and c on the comm stream (1): a
// needs c. With a window, c does not end before b has run (as an all-to-all waits for a peer) —
// up to 5 s, so that an executor that kept the head's order fails the check instead of hanging.
// Returns the order the ops finished in (a, b, c are nodes 0, 1, 2).
std::vector<ir::NodeId> run(bool window) {
  ir::Graph g;
  ir::GroupId r0 = g.group({0});
  auto add = [&](ir::Op op, int32_t mb, ir::StreamId st) { return add_op(g, r0, op, mb, st); };
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

namespace {
// Forwards a and b on the compute stream (0), sends sb then sa on p2p_send (2), sa needing a and sb
// needing b. With inline posting, the thread that finishes b posts sb (its stream's head, waited
// for), but not sa when a finishes (sb heads the stream then). Returns which thread ran each op
// (true: the compute stream's) in the order they ran, or the failure when `fail_sb`.
struct Ran {
  std::vector<std::pair<ir::NodeId, bool>> ops;
  std::string failure;
};
Ran run_sends(bool post_inline, bool fail_sb) {
  ir::Graph g;
  ir::GroupId r0 = g.group({0});
  auto add = [&](ir::Op op, int32_t mb, ir::StreamId st) { return add_op(g, r0, op, mb, st); };
  const ir::NodeId a = add(ir::Op::F, 0, 0), b = add(ir::Op::F, 1, 0), sa = add(ir::Op::Send, 0, 2), sb = add(ir::Op::Send, 1, 2);
  sched::ClassProgram program{{0}, {sched::StreamProgram{0, {a, b}, {}}, sched::StreamProgram{2, {sb, sa}, {}}}};
  std::vector<std::vector<ir::NodeId>> preds(g.nodes.size());
  preds[static_cast<size_t>(sa)] = {a};
  preds[static_cast<size_t>(sb)] = {b};
  StreamThreads threads(g, program, preds, 0, nullptr);
  if (post_inline) threads.set_post_inline([&](ir::NodeId v) { return g.nodes[static_cast<size_t>(v)].op == ir::Op::Send; });
  std::mutex mu;
  std::thread::id compute;
  Ran out;
  const StreamThreads::RunOp op = [&](ir::NodeId v) {
    // a gives the send stream's thread time to wait for its head, as it does behind a real forward.
    if (v == a) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (v == sb && fail_sb) throw std::runtime_error("boom");
    std::lock_guard lk(mu);
    if (v == a) compute = std::this_thread::get_id();
    out.ops.emplace_back(v, std::this_thread::get_id() == compute);
  };
  out.failure = threads.run(1, op, [](const std::string&) {}, nullptr);
  return out;
}
}  // namespace

TEST_CASE("stream threads: a send is posted by the thread that made it ready, when it heads its stream") {
  using R = std::vector<std::pair<ir::NodeId, bool>>;
  // a, b, sb, sa are nodes 0, 1, 3, 2. Inline: sb on the compute thread, sa (not the head when a
  // ended) on its own stream's thread, after sb.
  Ran inline_ = run_sends(true, false);
  CHECK(inline_.failure == "");
  CHECK(inline_.ops == R{{0, true}, {1, true}, {3, true}, {2, false}});
  // Without it every send runs on its stream's thread.
  Ran own = run_sends(false, false);
  CHECK(own.ops == R{{0, true}, {1, true}, {3, false}, {2, false}});
  // A failure in a send posted inline names its own stream.
  const std::string failure = run_sends(true, true).failure;
  CHECK(failure.rfind("rank 0, step 1, op ", 0) == 0);
  CHECK(failure.find(" on stream p2p_send: boom") != std::string::npos);
}
