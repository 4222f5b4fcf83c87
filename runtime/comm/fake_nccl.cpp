#include "runtime/comm/fake_nccl.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>

namespace piper::runtime {

struct FakeNcclWorld::State {
  std::mutex mu;
  std::condition_variable cv;
  long next_id = 0;
  std::map<long, int> joined;  // unique id -> members that called init_comm
  struct Part {
    const void* in;
    void* out;
  };
  struct Round {
    std::vector<Part> parts;
    int arrived = 0;
    bool done = false;
  };
  std::map<std::pair<long, long>, Round> rounds;  // (communicator id, its collective number)
  std::map<std::tuple<long, int, int>, std::deque<std::vector<char>>> mail;  // (communicator id, from, to)
  std::string async_error;
  std::map<int, std::vector<std::string>> log;
};

namespace {
using State = FakeNcclWorld::State;

long id_of(const NcclUniqueId& id) {
  long v = 0;
  std::memcpy(&v, id.data(), sizeof v);
  return v;
}

struct Comm {
  long id;
  int nranks, rank;
  long collectives = 0;  // this member's count: its next collective's round
  bool aborted = false;
};

struct Stream {
  std::deque<std::function<bool()>> work;  // each returns whether it has completed
};

class FakeNccl : public NcclApi {
 public:
  FakeNccl(std::shared_ptr<State> s, int rank) : s_(std::move(s)), rank_(rank) {}
  ~FakeNccl() override {
    for (auto& [p, n] : allocs_) delete[] p;
  }
  std::string describe() const override { return fmt::format("fake NCCL, rank {}", rank_); }
  NcclUniqueId unique_id() override {
    std::lock_guard lk(s_->mu);
    long v = ++s_->next_id;
    s_->log[rank_].push_back(fmt::format("unique_id {}", v));
    NcclUniqueId id{};
    std::memcpy(id.data(), &v, sizeof v);
    return id;
  }
  NcclComm init_comm(int nranks, const NcclUniqueId& uid, int rank, int max_ctas) override {
    const long id = id_of(uid);
    std::unique_lock lk(s_->mu);
    s_->log[rank_].push_back(fmt::format("init nranks={} rank={} id={}{}", nranks, rank, id,
                                         max_ctas > 0 ? fmt::format(" max_ctas={}", max_ctas) : ""));
    ++s_->joined[id];
    s_->cv.notify_all();
    s_->cv.wait(lk, [&] { return s_->joined[id] >= nranks || !s_->async_error.empty(); });
    if (!s_->async_error.empty()) throw std::runtime_error("NCCL ncclCommInitRank: " + s_->async_error);
    return new Comm{id, nranks, rank};
  }
  void destroy_comm(NcclComm c) override { delete static_cast<Comm*>(c); }
  void abort_comm(NcclComm c) override {
    std::lock_guard lk(s_->mu);
    static_cast<Comm*>(c)->aborted = true;
    s_->log[rank_].push_back(fmt::format("abort id={}", static_cast<Comm*>(c)->id));
  }
  std::string async_error(NcclComm c) override {
    std::lock_guard lk(s_->mu);
    if (static_cast<Comm*>(c)->aborted) return "communicator aborted";
    return s_->async_error;
  }

  DeviceStream create_stream() override { return new Stream; }
  void destroy_stream(DeviceStream s) override { delete static_cast<Stream*>(s); }
  bool stream_done(DeviceStream st) override {
    auto& work = static_cast<Stream*>(st)->work;
    while (!work.empty() && work.front()()) work.pop_front();
    return work.empty();
  }

  bool is_device_pointer(const void* p) override {
    std::lock_guard lk(alloc_mu_);  // a rank's streams call from several threads
    const char* c = static_cast<const char*>(p);
    for (auto& [base, n] : allocs_)
      if (c >= base && c < base + n) return true;
    return false;
  }
  void* device_alloc(size_t bytes) override {
    char* p = new char[bytes ? bytes : 1];
    std::lock_guard lk(alloc_mu_);
    allocs_[p] = bytes;
    return p;
  }
  void device_free(void* p) override {
    std::lock_guard lk(alloc_mu_);
    allocs_.erase(static_cast<char*>(p));
    delete[] static_cast<char*>(p);
  }
  void copy(void* dst, const void* src, size_t bytes, DeviceStream s) override {
    enqueue(s, [=, this] {
      std::memcpy(dst, src, bytes);
      return true;
    });
  }

  void group_start() override {}
  void group_end() override {}
  void all_reduce_sum(const void* in, void* out, size_t count, NcclType t, NcclComm c, DeviceStream s) override {
    collective(c, s, in, out, [count, t](std::vector<State::Part>& parts) {
      if (t == NcclType::F32) sum<float>(parts, count);
      else sum<double>(parts, count);
    });
  }
  void reduce_scatter_sum(const float* in, float* out, size_t recv_count, NcclComm c, DeviceStream s) override {
    collective(c, s, in, out, [recv_count](std::vector<State::Part>& parts) {
      for (size_t j = 0; j < parts.size(); ++j)
        for (size_t i = 0; i < recv_count; ++i) {
          float acc = 0;  // in member order, as the fake MPI world sums
          for (auto& p : parts) acc += static_cast<const float*>(p.in)[j * recv_count + i];
          static_cast<float*>(parts[j].out)[i] = acc;
        }
    });
  }
  void all_gather(const float* in, float* out, size_t send_count, NcclComm c, DeviceStream s) override {
    collective(c, s, in, out, [send_count](std::vector<State::Part>& parts) {
      for (auto& dst : parts)
        for (size_t j = 0; j < parts.size(); ++j)
          std::memcpy(static_cast<float*>(dst.out) + j * send_count, parts[j].in, send_count * sizeof(float));
    });
  }
  void send(const void* buf, size_t bytes, int peer, NcclComm c, DeviceStream s) override {
    Comm* comm = static_cast<Comm*>(c);
    enqueue(s, [=, this] {
      std::lock_guard lk(s_->mu);
      const char* p = static_cast<const char*>(buf);
      s_->mail[{comm->id, comm->rank, peer}].emplace_back(p, p + bytes);
      return true;
    });
  }
  void recv(void* buf, size_t bytes, int peer, NcclComm c, DeviceStream s) override {
    Comm* comm = static_cast<Comm*>(c);
    enqueue(s, [=, this] {
      std::lock_guard lk(s_->mu);
      auto& box = s_->mail[{comm->id, peer, comm->rank}];
      if (box.empty()) return false;
      std::memcpy(buf, box.front().data(), std::min(bytes, box.front().size()));
      box.pop_front();
      return true;
    });
  }

 private:
  template <typename T>
  static void sum(std::vector<State::Part>& parts, size_t n) {
    std::vector<T> acc(n, T(0));
    for (auto& p : parts)
      for (size_t i = 0; i < n; ++i) acc[i] += static_cast<const T*>(p.in)[i];
    for (auto& p : parts) std::memcpy(p.out, acc.data(), n * sizeof(T));
  }
  void enqueue(DeviceStream s, std::function<bool()> f) { static_cast<Stream*>(s)->work.push_back(std::move(f)); }
  // Joins its round when the stream reaches it; the last member to arrive computes everyone's result.
  void collective(NcclComm c, DeviceStream s, const void* in, void* out,
                  std::function<void(std::vector<State::Part>&)> compute) {
    Comm* comm = static_cast<Comm*>(c);
    const auto key = std::make_pair(comm->id, comm->collectives++);
    auto joined = std::make_shared<bool>(false);
    enqueue(s, [=, this] {
      std::lock_guard lk(s_->mu);
      State::Round& r = s_->rounds[key];
      if (!*joined) {
        r.parts.resize(static_cast<size_t>(comm->nranks));
        r.parts[static_cast<size_t>(comm->rank)] = {in, out};
        *joined = true;
        if (++r.arrived == comm->nranks) {
          compute(r.parts);
          r.done = true;
        }
      }
      return r.done;
    });
  }

  std::shared_ptr<State> s_;
  int rank_;
  std::mutex alloc_mu_;
  std::map<char*, size_t> allocs_;
};
}  // namespace

FakeNcclWorld::FakeNcclWorld() : state_(std::make_shared<State>()) {}
FakeNcclWorld::~FakeNcclWorld() = default;
std::unique_ptr<NcclApi> FakeNcclWorld::api(int rank) { return std::make_unique<FakeNccl>(state_, rank); }
void FakeNcclWorld::inject_async_error(const std::string& message) {
  std::lock_guard lk(state_->mu);
  state_->async_error = message;
  state_->cv.notify_all();
}
std::vector<std::string> FakeNcclWorld::log(int rank) const {
  std::lock_guard lk(state_->mu);
  auto it = state_->log.find(rank);
  return it == state_->log.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace piper::runtime
