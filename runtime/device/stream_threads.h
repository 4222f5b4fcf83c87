// The stream threads of one rank: a thread per logical stream of its program, kept for the whole
// run. Each step every thread runs its stream's ops in order (inside an overlap window, the first
// ready), each once its predecessors on this rank are done (events across streams); the first
// failure stops them all. A watchdog reports any op that runs or waits past a timeout, stream by
// stream, and ends the job.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ir/graph.h"
#include "scheduler/schedule.h"

namespace piper::runtime {

struct OpSpan {  // what ran, for the trace
  std::string token, stream;
  double start = 0, end = 0;  // seconds since the step's ops began (StreamThreads::began)
  int64_t live_bytes = 0;     // this rank's tensor memory when the op ended (with the memory counter)
  bool compute = false;       // a chunk of the model (F, B, W, U), not communication
};

class StreamThreads {
 public:
  using RunOp = std::function<void(ir::NodeId)>;
  // Called on the failing thread, at once (to abort the job so that no peer waits on this rank).
  using OnFailure = std::function<void(const std::string& message)>;

  // `thread_init(k)` runs first on the thread of program stream k (thread-local settings of the
  // libraries it calls: the interpreter's mode, the device stream it launches on).
  StreamThreads(const ir::Graph& g, const sched::ClassProgram& program, const std::vector<std::vector<ir::NodeId>>& preds,
                int rank, std::function<void(size_t stream)> thread_init);
  ~StreamThreads();
  StreamThreads(const StreamThreads&) = delete;
  StreamThreads& operator=(const StreamThreads&) = delete;

  // Runs every stream's ops of one step (1-based `step` in messages). Returns the first failure,
  // "rank R, step S, op T on stream N: what", or "" when all ran.
  std::string run(int64_t step, const RunOp& op, const OnFailure& on_failure, std::vector<OpSpan>* spans);
  // An op that runs, or waits for its events, longer than this fails the step with a report of
  // every stream (0: never). Set before run().
  void set_op_timeout(double seconds) { op_timeout_ = seconds; }
  // Every stream runs its ops in the program's order, overlap windows included: on a device, where
  // a thread only launches work, events name ops by their planned place (runtime/device_queues.h).
  void set_in_order(bool in_order) { in_order_ = in_order; }
  // What the watchdog's report adds to a communication op's row: its peer or group and their hosts
  // (a stuck receive names whom it waits for).
  void set_describe(std::function<std::string(ir::NodeId)> describe) { describe_ = std::move(describe); }
  // Ops that only post a nonblocking call (a started send): the thread that finishes an op runs
  // such a successor itself, when it heads its stream and that stream's thread waits for it, so
  // it is posted at once instead of when the scheduler next gives its stream's thread the core the
  // compute holds. Its stream's order holds; its span is its stream's. Set before run().
  void set_post_inline(std::function<bool(ir::NodeId)> post_inline) { post_inline_ = std::move(post_inline); }
  // When the last run() began: the origin of its spans' times.
  std::chrono::steady_clock::time_point began() const { return t0_; }
  // Where every stream is now, from any thread ("during step 12; its streams:" and a row each), or
  // "" between steps: what a rank the launcher stops says it was doing (runtime/job/stop_report.h).
  std::string report_now();

 private:
  void loop(size_t stream);
  // Runs v of `stream` on this thread (claimed under mu_ already), then any successor it makes
  // ready that may be posted inline. Returns false where v failed (the failure is recorded).
  bool execute(ir::NodeId v, size_t stream, bool posted_inline);
  bool ready(ir::NodeId v) const;  // under mu_
  void wake_all();                  // under mu_: every stream and the caller (a step, a failure, stop)
  void wake_successors(ir::NodeId v);  // under mu_: the streams of v's local successors
  // Under mu_: the report when some stream is stuck past the timeout, else "".
  std::string stuck_report(std::chrono::steady_clock::time_point now) const;
  std::string stream_rows(std::chrono::steady_clock::time_point now) const;  // under mu_: a row per stream

  const ir::Graph& g_;
  const sched::ClassProgram& program_;
  const std::vector<std::vector<ir::NodeId>>& preds_;
  const int rank_;
  std::function<void(size_t)> thread_init_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  // Each stream thread sleeps on its own condition variable, woken only when an op it may run next
  // could have become ready (a local predecessor finished), a step begins, or a stream failed: one
  // shared variable woke every stream of the rank at every op's end, each to find nothing to do
  // and sleep again, on the core the rank's compute runs on. `all_done_` is the caller's.
  std::vector<std::unique_ptr<std::condition_variable>> wake_;
  std::condition_variable all_done_;
  std::vector<std::vector<ir::NodeId>> succs_;  // local successors of each node (preds_ inverted)
  std::vector<int32_t> stream_of_;              // each node's program stream (-1: none on this rank)
  std::vector<char> done_;
  std::vector<char> claimed_;  // taken by a thread this step (running or done)
  uint64_t generation_ = 0;  // bumped per step; threads run one step per bump
  size_t finished_ = 0;      // threads done with this step
  bool stop_ = false;
  std::string failure_;
  int64_t step_ = 0;
  const RunOp* op_ = nullptr;
  const OnFailure* on_failure_ = nullptr;
  std::vector<OpSpan>* spans_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  double op_timeout_ = 0;
  bool in_order_ = false;
  std::function<std::string(ir::NodeId)> describe_;
  std::function<bool(ir::NodeId)> post_inline_;
  // Per stream: the op at its head (-1: finished the step), whether it runs (else it waits for its
  // events), and since when.
  struct Head {
    ir::NodeId op = -1;
    bool running = false;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Head> heads_;
};

}  // namespace piper::runtime
