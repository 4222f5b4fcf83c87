#include "runtime/comm/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace piper::runtime {

namespace {
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(fmt::format("MPI {} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
}

// Waits on MPI requests without busy-polling. Open MPI's blocking calls spin in its progress loop,
// taking the core a rank's compute (or a peer rank sharing the node) needs, so every call here is
// nonblocking and one progress thread per rank tests what is outstanding; the stream threads that
// wait sleep on a condition variable. Between rounds of tests the thread sleeps, 2 us at first and
// doubling up to a cap while nothing completes; a new request or a completion starts it over.
// Each test also drives MPI's progress (rendezvous handshakes, a nonblocking collective's rounds),
// so the cap bounds the latency a round can add. One poller, not one per waiting stream: measured
// on 1F1B pp=2 (2 cores), each stream polling on its own with a 20 us cap ran at 1.8k tokens/s,
// with 200 us at 6-7k, with 1 ms at 8.4k. Each poll that lands while the rank computes preempts its
// compute thread (1F1B: ~250 preemptions a step); while only receives are outstanding the thread
// therefore runs as SCHED_IDLE (set_idle), polling on cores that would idle anyway. Where it can,
// the cap is 20 us, not 1 ms: a handoff a stage waited for then delays it 96 us on average, not
// 294 (1F1B pp=2; a collective's excess 0.2-0.3 ms, not 0.35-0.5), at the same throughput
// (bench/progress_bench.sh, docs/runtime.md).
class Progress {
 public:
  // `allow_idle`: this node has a core for each of its ranks. Oversubscribed, a waiting rank's core
  // is rarely free, and a SCHED_IDLE poller would leave its receive untested for long.
  explicit Progress(bool allow_idle) : allow_idle_(allow_idle), thread_([this] { loop(); }) {}
  ~Progress() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_.notify_one();
    thread_.join();
  }
  struct Pending {
    MPI_Request req;
    MPI_Status status{};
    int rc = MPI_SUCCESS;
    bool finished = false;  // under mu_
    bool receive = false;
  };
  // Hands `req` to the thread and returns: tested until it completes (then `finished`).
  // `receive`: the request completes by its peer's doing (data arriving; a started send's buffer
  // read by its peer on this node), so testing it needs a core only when one is free (see the loop).
  std::shared_ptr<Pending> post(MPI_Request req, bool receive) {
    auto p = std::make_shared<Pending>();
    p->req = req;
    p->receive = receive;
    std::lock_guard lk(mu_);
    if (!receive) set_idle(false);  // at once: the thread may sleep as SCHED_IDLE on a busy core
    pending_.push_back(p);
    ++posted_;
    work_.notify_one();
    return p;
  }
  bool finished(const Pending& p) {
    std::lock_guard lk(mu_);
    return p.finished;
  }
  void wait_for(const Pending& p) {
    std::unique_lock lk(mu_);
    done_.wait(lk, [&] { return p.finished; });
  }
  // Waits until `req` completes (its status into *st unless null); an MPI error throws, naming `what`.
  void wait(MPI_Request req, MPI_Status* st, const char* what, bool receive = false) {
    int done = 0;
    MPI_Status status;
    check(MPI_Test(&req, &done, &status), what);  // a small message may be done already
    if (!done) {
      auto p = post(req, receive);
      wait_for(*p);
      check(p->rc, what);
      status = p->status;
    }
    if (st) *st = status;
  }

 private:
  // While only receives are outstanding the thread runs as SCHED_IDLE: it tests them whenever the
  // core would otherwise idle (a stream waiting for one of them leaves it idle) and never preempts
  // compute to do so. A send or a collective needs this rank's CPU to advance (its rounds, the
  // rendezvous' end): normal priority again.
  void set_idle(bool idle) {  // under mu_
    if (idle == idle_ || !can_idle_ || tid_ == 0) return;
    sched_param none{};
    if (sched_setscheduler(tid_, idle ? SCHED_IDLE : SCHED_OTHER, &none) == 0) idle_ = idle;
    else can_idle_ = false;  // (back to normal cannot fail: it is only tried once idle worked)
  }
  // Leaving SCHED_IDLE needs RLIMIT_NICE >= 20 or CAP_SYS_NICE (root has it; users often not):
  // tried on a throwaway thread, since a thread that cannot leave it would starve collectives.
  static bool idle_is_reversible() {
    bool ok = false;
    std::thread([&] {
      sched_param none{};
      ok = sched_setscheduler(0, SCHED_IDLE, &none) == 0 && sched_setscheduler(0, SCHED_OTHER, &none) == 0;
    }).join();
    return ok;
  }
  bool idle_ = false, can_idle_ = true;
  bool allow_idle_ = true;
  pid_t tid_ = 0;  // the progress thread's
  static constexpr long kMinSleepNs = 2'000, kShortCapNs = 20'000, kLongCapNs = 1'000'000;
  long max_sleep_ns_ = kLongCapNs;

  void loop() {
    prctl(PR_SET_TIMERSLACK, 1000UL);  // ns; the default 50 us would stretch the short sleeps
    {
      std::lock_guard lk(mu_);
      tid_ = static_cast<pid_t>(syscall(SYS_gettid));
      const char* off = std::getenv("PIPER_PROGRESS_IDLE");  // "0": never idle (to measure the difference)
      can_idle_ = allow_idle_ && !(off && std::string(off) == "0") && idle_is_reversible();
      // With a core per rank and idle priority at hand the short cap; else a poll preempts compute.
      max_sleep_ns_ = can_idle_ ? kShortCapNs : kLongCapNs;
      if (const char* cap = std::getenv("PIPER_PROGRESS_MAX_SLEEP_US"))  // to compare caps (progress_bench.sh)
        max_sleep_ns_ = std::clamp(std::atol(cap), 2L, 100'000L) * 1000;
    }
    long sleep = kMinSleepNs;
    std::unique_lock lk(mu_);
    for (;;) {
      work_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      std::vector<std::shared_ptr<Pending>> now = pending_;  // others only append while the lock is free
      lk.unlock();
      std::vector<std::shared_ptr<Pending>> completed;
      for (const auto& p : now) {
        int flag = 0;
        p->rc = MPI_Test(&p->req, &flag, &p->status);
        if (flag || p->rc != MPI_SUCCESS) completed.push_back(p);
      }
      lk.lock();
      if (!completed.empty()) {
        for (const auto& p : completed) {
          p->finished = true;
          pending_.erase(std::find(pending_.begin(), pending_.end(), p));
        }
        done_.notify_all();
        sleep = kMinSleepNs;
      }
      if (pending_.empty()) continue;
      set_idle(std::all_of(pending_.begin(), pending_.end(), [](const auto& p) { return p->receive; }));
      const uint64_t seen = posted_;
      if (work_.wait_for(lk, std::chrono::nanoseconds(sleep), [&] { return stop_ || posted_ != seen; })) sleep = kMinSleepNs;
      else sleep = std::min(2 * sleep, max_sleep_ns_);
    }
  }

  std::mutex mu_;
  std::condition_variable work_, done_;
  std::vector<std::shared_ptr<Pending>> pending_;
  uint64_t posted_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

class MpiCommunicator : public Communicator {
  // The ranks on this node (MPI's shared-memory split) against its cores.
  static bool one_core_per_rank() {
    MPI_Comm node;
    int local = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_size(node, &local);
      MPI_Comm_free(&node);
    }
    return static_cast<unsigned>(local) <= std::thread::hardware_concurrency();
  }

 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes (turned into exceptions naming the op), not as silent aborts.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_), "Comm_dup");
    MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN);
    hosts_ = find_hosts();
  }
  ~MpiCommunicator() override {
    for (auto& [key, c] : groups_) MPI_Comm_free(&c);
    MPI_Comm_free(&p2p_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  HostMap hosts() const override { return hosts_; }
  int max_tag() const override {
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found);
    return found ? *static_cast<int*>(value) : 32767;  // 32767: the least the MPI standard guarantees
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    MPI_Request req;
    check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "Isend");
    progress_.wait(req, nullptr, "Send", /*receive=*/local(peer) && send_idle());
  }
  // A send to this node's rank completes by the peer's doing (its single-copy read), so a started
  // one is tested at idle priority, as a receive is: polled at normal priority (every <= 20 us
  // while it waits for the peer's receive) it took 3-8% of the zero-bubble schedules' compute
  // (bench/send_priority_bench.sh, docs/runtime.md). Across hosts the sender's CPU moves the data.
  std::unique_ptr<PendingSend> start_send(const void* data, size_t bytes, int peer, int tag) override {
    struct Started : PendingSend {
      Progress* progress;
      std::shared_ptr<Progress::Pending> p;
      bool done() override {
        if (!progress->finished(*p)) return false;
        check(p->rc, "Send");
        return true;
      }
      void wait() override {
        progress->wait_for(*p);
        check(p->rc, "Send");
      }
    };
    MPI_Request req;
    check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "Isend");
    auto out = std::make_unique<Started>();
    out->progress = &progress_;
    out->p = progress_.post(req, /*receive=*/local(peer));
    return out;
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    MPI_Status st;
    MPI_Request req;
    check(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "Irecv");
    progress_.wait(req, &st, "Recv", /*receive=*/true);
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (static_cast<size_t>(got) != bytes)
      throw std::runtime_error(fmt::format("MPI Recv from rank {}: {} bytes, expected {}", peer, got, bytes));
  }

  void prepare_group(const std::vector<int>& group, int channel) override {
    auto key = std::make_pair(group, channel);
    if (groups_.count(key)) return;
    MPI_Group world, sub;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, static_cast<int>(group.size()), group.data(), &sub);
    MPI_Comm c;
    // Collective over the group's members only; the tag keeps concurrent creations apart.
    check(MPI_Comm_create_group(MPI_COMM_WORLD, sub, channel, &c), "Comm_create_group");
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    MPI_Group_free(&sub);
    MPI_Group_free(&world);
    groups_[key] = c;
  }

  void all_reduce_sum(float* data, size_t n, const std::vector<int>& group, int channel) override {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm(group, channel), &req), "Iallreduce");
    progress_.wait(req, nullptr, "Allreduce");
  }
  void all_reduce_sum(double* data, size_t n, const std::vector<int>& group, int channel) override {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm(group, channel), &req), "Iallreduce");
    progress_.wait(req, nullptr, "Allreduce");
  }

  void reduce_scatter_sum(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                          int channel) override {
    std::vector<int> counts;
    for (size_t j = 0; j + 1 < offsets.size(); ++j) counts.push_back(static_cast<int>(offsets[j + 1] - offsets[j]));
    MPI_Request req;
    check(MPI_Ireduce_scatter(in, out, counts.data(), MPI_FLOAT, MPI_SUM, comm(group, channel), &req), "Ireduce_scatter");
    progress_.wait(req, nullptr, "Reduce_scatter");
  }
  void all_gather(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                  int channel) override {
    std::vector<int> counts, displs;
    for (size_t j = 0; j + 1 < offsets.size(); ++j) {
      counts.push_back(static_cast<int>(offsets[j + 1] - offsets[j]));
      displs.push_back(static_cast<int>(offsets[j]));
    }
    int me = 0;
    MPI_Comm c = comm(group, channel);
    MPI_Comm_rank(c, &me);
    if (!in) {  // this member's part already sits in place in `out`
      MPI_Request req;
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, counts.data(), displs.data(), MPI_FLOAT, c, &req),
            "Iallgatherv");
      progress_.wait(req, nullptr, "Allgatherv");
      return;
    }
    MPI_Request req;
    check(MPI_Iallgatherv(in, counts[static_cast<size_t>(me)], MPI_FLOAT, out, counts.data(), displs.data(), MPI_FLOAT, c, &req),
          "Iallgatherv");
    progress_.wait(req, nullptr, "Allgatherv");
  }

  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
                    const std::vector<int>& group, int channel) override {
    MPI_Comm c = comm(group, channel);
    int me = 0;
    MPI_Comm_rank(c, &me);
    count_sent(channel, send_bytes, static_cast<size_t>(me));
    std::vector<int> sc, sd, rc, rd;
    int so = 0, ro = 0;
    for (size_t j = 0; j < group.size(); ++j) {
      sc.push_back(static_cast<int>(send_bytes[j]));
      sd.push_back(so);
      so += sc.back();
      rc.push_back(static_cast<int>(recv_bytes[j]));
      rd.push_back(ro);
      ro += rc.back();
    }
    MPI_Request req;
    check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, c, &req), "Ialltoallv");
    progress_.wait(req, nullptr, "Alltoallv");
  }

  [[noreturn]] void abort(const std::string& why) override {
    std::fprintf(stderr, "piper-run: error: %s\npiper-run: stopping every rank\n", why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

 private:
  // MPI's shared-memory split says which ranks share a node: each node's lowest rank names it, the
  // nodes numbered in that order. Names from MPI_Get_processor_name (the host's name).
  HostMap find_hosts() const {
    MPI_Comm node;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "Comm_split_type");
    int lowest = rank_;
    check(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node), "Allreduce");
    MPI_Comm_free(&node);
    std::vector<int> leaders(static_cast<size_t>(size_));
    check(MPI_Allgather(&lowest, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD), "Allgather");
    std::vector<char> name(MPI_MAX_PROCESSOR_NAME, '\0'), names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    int len = 0;
    MPI_Get_processor_name(name.data(), &len);
    check(MPI_Allgather(name.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                        MPI_COMM_WORLD), "Allgather");
    HostMap h;
    std::map<int, int32_t> index;  // a node's lowest rank -> its host number
    for (int r = 0; r < size_; ++r) {
      const int leader = leaders[static_cast<size_t>(r)];
      if (!index.count(leader)) {
        index[leader] = static_cast<int32_t>(h.names.size());
        h.names.emplace_back(&names[static_cast<size_t>(leader) * MPI_MAX_PROCESSOR_NAME]);
      }
      h.host_of.push_back(index[leader]);
    }
    return h;
  }
  HostMap hosts_;
  bool local(int peer) const {
    return static_cast<size_t>(peer) < hosts_.host_of.size() &&
           hosts_.host_of[static_cast<size_t>(peer)] == hosts_.host_of[static_cast<size_t>(rank_)];
  }
  // A blocking send to this node's rank tested at idle priority: only to measure that choice
  // (PIPER_PROGRESS_SEND_IDLE=1, bench/send_priority_bench.sh). The stream that sent then waits for
  // the completion until the core idles, and the handoffs behind it come late.
  static bool send_idle() {
    static const bool on = [] {
      const char* v = std::getenv("PIPER_PROGRESS_SEND_IDLE");
      return v && std::string(v) == "1";
    }();
    return on;
  }
  MPI_Comm comm(const std::vector<int>& group, int channel) {
    auto it = groups_.find({group, channel});
    if (it == groups_.end())
      throw std::logic_error(fmt::format("collective on group of {} ranks (channel {}) was never prepared", group.size(), channel));
    return it->second;
  }
  int rank_ = 0, size_ = 1;
  MPI_Comm p2p_;
  Progress progress_{one_core_per_rank()};
  std::map<std::pair<std::vector<int>, int>, MPI_Comm> groups_;  // written before threads start
};

struct MpiSession {
  MpiSession(int* argc, char*** argv) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "piper-run: error: this MPI does not support MPI_THREAD_MULTIPLE (streams communicate concurrently)\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};
}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv) {
  static MpiSession session(argc, argv);
  return std::make_unique<MpiCommunicator>();
}

}  // namespace piper::runtime
