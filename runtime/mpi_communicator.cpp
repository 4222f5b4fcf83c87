#include "runtime/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>
#include <sys/prctl.h>

#include <algorithm>
#include <ctime>

#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>

namespace piper::runtime {

namespace {
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(fmt::format("MPI {} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
}

// Waits for a request without busy-polling. Open MPI's blocking calls spin in its progress loop,
// taking the core that a rank's compute (or a peer rank sharing the node) needs; so every call here
// is nonblocking and this waits: a few tests back to back (a message already on its way), then
// sleeps that double from 2 us up to kMaxSleep between tests. Each test also drives MPI's progress
// (rendezvous handshakes, the rounds of a nonblocking collective), so the cap bounds the latency
// each round can add; the timer slack is lowered so that the short sleeps are short.
constexpr int kSpins = 64;
constexpr long kMaxSleepNs = 200'000;

void wait(MPI_Request* req, MPI_Status* st, const char* what) {
  int done = 0;
  for (int i = 0; i < kSpins; ++i) {
    check(MPI_Test(req, &done, st), what);
    if (done) return;
  }
  thread_local bool slack_set = false;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1000UL);  // ns; the default 50 us would stretch every short sleep
    slack_set = true;
  }
  for (long ns = 2'000;; ns = std::min(2 * ns, kMaxSleepNs)) {
    timespec ts{0, ns};
    nanosleep(&ts, nullptr);
    check(MPI_Test(req, &done, st), what);
    if (done) return;
  }
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes (turned into exceptions naming the op), not as silent aborts.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_), "Comm_dup");
    MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    for (auto& [key, c] : groups_) MPI_Comm_free(&c);
    MPI_Comm_free(&p2p_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int max_tag() const override {
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found);
    return found ? *static_cast<int*>(value) : 32767;  // 32767: the least the MPI standard guarantees
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    MPI_Request req;
    check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "Isend");
    wait(&req, MPI_STATUS_IGNORE, "Send");
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    MPI_Status st;
    MPI_Request req;
    check(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "Irecv");
    wait(&req, &st, "Recv");
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
    wait(&req, MPI_STATUS_IGNORE, "Allreduce");
  }
  void all_reduce_sum(double* data, size_t n, const std::vector<int>& group, int channel) override {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm(group, channel), &req), "Iallreduce");
    wait(&req, MPI_STATUS_IGNORE, "Allreduce");
  }

  void reduce_scatter_sum(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                          int channel) override {
    std::vector<int> counts;
    for (size_t j = 0; j + 1 < offsets.size(); ++j) counts.push_back(static_cast<int>(offsets[j + 1] - offsets[j]));
    MPI_Request req;
    check(MPI_Ireduce_scatter(in, out, counts.data(), MPI_FLOAT, MPI_SUM, comm(group, channel), &req), "Ireduce_scatter");
    wait(&req, MPI_STATUS_IGNORE, "Reduce_scatter");
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
      wait(&req, MPI_STATUS_IGNORE, "Allgatherv");
      return;
    }
    MPI_Request req;
    check(MPI_Iallgatherv(in, counts[static_cast<size_t>(me)], MPI_FLOAT, out, counts.data(), displs.data(), MPI_FLOAT, c, &req),
          "Iallgatherv");
    wait(&req, MPI_STATUS_IGNORE, "Allgatherv");
  }

  [[noreturn]] void abort(const std::string& why) override {
    std::fprintf(stderr, "piper-run: error: %s\npiper-run: stopping every rank\n", why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

 private:
  MPI_Comm comm(const std::vector<int>& group, int channel) {
    auto it = groups_.find({group, channel});
    if (it == groups_.end())
      throw std::logic_error(fmt::format("collective on group of {} ranks (channel {}) was never prepared", group.size(), channel));
    return it->second;
  }
  int rank_ = 0, size_ = 1;
  MPI_Comm p2p_;
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
