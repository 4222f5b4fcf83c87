#include "runtime/device/stream_threads.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

#include "runtime/device/memory_counter.h"

namespace piper::runtime {

StreamThreads::StreamThreads(const ir::Graph& g, const sched::ClassProgram& program,
                             const std::vector<std::vector<ir::NodeId>>& preds, int rank, std::function<void(size_t)> thread_init)
    : g_(g), program_(program), preds_(preds), rank_(rank), thread_init_(std::move(thread_init)), done_(g.nodes.size(), 0),
      claimed_(g.nodes.size(), 0),
      heads_(program.streams.size()) {
  succs_.resize(g.nodes.size());
  stream_of_.assign(g.nodes.size(), -1);
  for (size_t v = 0; v < preds_.size(); ++v)
    for (ir::NodeId u : preds_[v]) succs_[static_cast<size_t>(u)].push_back(static_cast<ir::NodeId>(v));
  for (size_t s = 0; s < program_.streams.size(); ++s) {
    wake_.push_back(std::make_unique<std::condition_variable>());
    for (ir::NodeId v : program_.streams[s].ops) stream_of_[static_cast<size_t>(v)] = static_cast<int32_t>(s);
  }
  for (size_t s = 0; s < program_.streams.size(); ++s) threads_.emplace_back([this, s] { loop(s); });
}

StreamThreads::~StreamThreads() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    wake_all();
  }
  for (auto& t : threads_) t.join();
}

bool StreamThreads::ready(ir::NodeId v) const {
  for (ir::NodeId u : preds_[static_cast<size_t>(v)])
    if (!done_[static_cast<size_t>(u)]) return false;
  return true;
}

void StreamThreads::wake_all() {
  for (auto& w : wake_) w->notify_one();  // one thread waits on each
  all_done_.notify_all();
}

void StreamThreads::wake_successors(ir::NodeId v) {
  int32_t last = -1;  // successors on one stream are usually adjacent: notify it once
  for (ir::NodeId w : succs_[static_cast<size_t>(v)]) {
    const int32_t s = stream_of_[static_cast<size_t>(w)];
    // A stream whose head runs (its own thread's, or posted inline) is not waiting.
    if (s >= 0 && s != last && !heads_[static_cast<size_t>(s)].running) wake_[static_cast<size_t>(s)]->notify_one();
    last = s;
  }
}

std::string StreamThreads::run(int64_t step, const RunOp& op, const OnFailure& on_failure, std::vector<OpSpan>* spans) {
  std::unique_lock lk(mu_);
  std::fill(done_.begin(), done_.end(), 0);
  std::fill(claimed_.begin(), claimed_.end(), 0);
  failure_.clear();
  finished_ = 0;
  step_ = step;
  op_ = &op;
  on_failure_ = &on_failure;
  spans_ = spans;
  t0_ = std::chrono::steady_clock::now();
  for (auto& h : heads_) h = Head{-1, false, t0_};
  ++generation_;
  wake_all();
  // The watchdog: this thread wakes every second while the streams work.
  while (!all_done_.wait_for(lk, std::chrono::seconds(1), [&] { return finished_ == threads_.size(); })) {
    if (op_timeout_ <= 0 || !failure_.empty()) continue;
    const std::string report = stuck_report(std::chrono::steady_clock::now());
    if (report.empty()) continue;
    failure_ = report;
    wake_all();
    lk.unlock();
    // Peers stuck with this rank time out within a second or two: let them print their streams
    // before the job ends, so the output shows every rank's.
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    try {
      on_failure(fmt::format("rank {}, step {}: an op exceeded --op-timeout {} s (streams above)", rank_, step, op_timeout_));
    } catch (const std::exception&) {
    }
    lk.lock();
    all_done_.wait(lk, [&] { return finished_ == threads_.size(); });  // reached only where on_failure returns (tests)
  }
  return failure_;
}

std::string StreamThreads::stuck_report(std::chrono::steady_clock::time_point now) const {
  bool stuck = false;
  for (const Head& h : heads_) stuck |= h.op >= 0 && std::chrono::duration<double>(now - h.since).count() > op_timeout_;
  if (!stuck) return "";
  return fmt::format("rank {}, step {}: watchdog: an op ran or waited longer than --op-timeout {} s; its streams:{}", rank_,
                     step_, op_timeout_, stream_rows(now));
}

std::string StreamThreads::report_now() {
  std::lock_guard lk(mu_);
  if (generation_ == 0 || finished_ == threads_.size()) return "";
  return fmt::format("during step {}; its streams:{}", step_, stream_rows(std::chrono::steady_clock::now()));
}

std::string StreamThreads::stream_rows(std::chrono::steady_clock::time_point now) const {
  auto secs = [&](const Head& h) { return std::chrono::duration<double>(now - h.since).count(); };
  std::string out;
  for (size_t s = 0; s < heads_.size(); ++s) {
    const Head& h = heads_[s];
    std::string what;
    const std::string peer = h.op >= 0 && describe_ ? describe_(h.op) : "";
    if (h.op < 0) {
      what = "finished the step";
    } else if (h.running) {
      what = fmt::format("running {}{} for {:.1f} s", ir::token(g_.nodes[static_cast<size_t>(h.op)]),
                         peer.empty() ? "" : " (" + peer + ")", secs(h));
    } else {
      std::vector<std::string> waits;
      for (ir::NodeId u : preds_[static_cast<size_t>(h.op)])
        if (!done_[static_cast<size_t>(u)]) waits.push_back(ir::token(g_.nodes[static_cast<size_t>(u)]));
      what = fmt::format("{} waits {:.1f} s for {}", ir::token(g_.nodes[static_cast<size_t>(h.op)]), secs(h),
                         fmt::join(waits, ", "));
    }
    out += fmt::format("\n  rank {} | {:<10} | {}{}", rank_, g_.streams[program_.streams[s].stream], what,
                       h.op >= 0 && secs(h) > op_timeout_ ? "   <-- STUCK" : "");
  }
  return out;
}

void StreamThreads::loop(size_t s) {
  set_memory_rank(rank_);
  if (thread_init_) thread_init_(s);
  const sched::StreamProgram& prog = program_.streams[s];
  const size_t n = prog.ops.size();
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      wake_[s]->wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    // Ops run in the program's order, except inside an overlap window (a `||` pair's pieces), where
    // the first ready op of those not run yet goes next: while one task waits for its all-to-all
    // or receive, the other computes.
    size_t next = 0;  // the first op not run yet
    for (;;) {
      ir::NodeId v = -1;
      {
        std::unique_lock lk(mu_);
        while (next < n && done_[static_cast<size_t>(prog.ops[next])]) ++next;  // run here, or posted inline
        if (next == n || !failure_.empty()) break;
        if (!claimed_[static_cast<size_t>(prog.ops[next])]) heads_[s] = Head{prog.ops[next], false, std::chrono::steady_clock::now()};
        wake_[s]->wait(lk, [&] {
          if (!failure_.empty() || done_[static_cast<size_t>(prog.ops[next])]) return true;
          const int32_t w = prog.window.empty() || in_order_ ? -1 : prog.window[next];
          for (size_t i = next; i < n && (i == next || (w >= 0 && prog.window[i] == w)); ++i)
            if (!claimed_[static_cast<size_t>(prog.ops[i])] && ready(prog.ops[i])) {
              v = prog.ops[i];
              return true;
            }
          return false;
        });
        if (!failure_.empty()) break;
        if (v < 0) continue;  // another thread posted the head: move past it
        claimed_[static_cast<size_t>(v)] = 1;
        heads_[s] = Head{v, true, std::chrono::steady_clock::now()};
      }
      if (!execute(v, s, false)) break;
    }
    std::lock_guard lk(mu_);
    heads_[s].op = -1;
    ++finished_;
    all_done_.notify_all();
  }
}

bool StreamThreads::execute(ir::NodeId v, size_t s, bool posted_inline) {
  const std::string& stream = g_.streams[program_.streams[s].stream];
  const auto a = std::chrono::steady_clock::now();
  std::string error;
  try {
    (*op_)(v);
  } catch (const std::exception& e) {
    const std::string oom = take_out_of_memory();  // the clean message, whatever wrapped it
    error = oom.empty() ? e.what() : oom;
  }
  const auto b = std::chrono::steady_clock::now();
  if (!error.empty()) {
    std::string msg;
    {
      std::lock_guard lk(mu_);
      if (failure_.empty())
        failure_ = msg = fmt::format("rank {}, step {}, op {} on stream {}: {}", rank_, step_, ir::token(g_.nodes[static_cast<size_t>(v)]),
                                     stream, error);
      wake_all();
    }
    if (!msg.empty()) try {
        (*on_failure_)(msg);  // ends the job: no peer may wait for this rank
      } catch (const std::exception&) {
      }
    return false;
  }
  std::vector<std::pair<ir::NodeId, size_t>> posts;  // successors this thread posts next
  {
    std::lock_guard lk(mu_);
    if (spans_)
      spans_->push_back(OpSpan{ir::token(g_.nodes[static_cast<size_t>(v)]), stream,
                               std::chrono::duration<double>(a - t0_).count(), std::chrono::duration<double>(b - t0_).count(),
                               memory_stats(rank_).live, ir::is_chunk(g_.nodes[static_cast<size_t>(v)].op)});
    done_[static_cast<size_t>(v)] = 1;
    // Claimed before the successors' streams are woken, so that a stream whose head this thread
    // posts is not woken to find it taken.
    for (ir::NodeId w : succs_[static_cast<size_t>(v)]) {
      const int32_t t = stream_of_[static_cast<size_t>(w)];
      if (!post_inline_ || !failure_.empty() || t < 0 || static_cast<size_t>(t) == s) continue;  // s runs it next anyway
      Head& h = heads_[static_cast<size_t>(t)];
      if (h.op != w || h.running || claimed_[static_cast<size_t>(w)] || !ready(w) || !post_inline_(w)) continue;
      claimed_[static_cast<size_t>(w)] = 1;
      h = Head{w, true, std::chrono::steady_clock::now()};
      posts.emplace_back(w, static_cast<size_t>(t));
    }
    wake_successors(v);
    if (posted_inline) wake_[s]->notify_one();  // its stream's thread moves past it
  }
  for (const auto& [w, t] : posts)
    if (!execute(w, t, true)) return false;
  return true;
}

}  // namespace piper::runtime
