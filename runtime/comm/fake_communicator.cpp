#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "runtime/comm/communicator.h"

namespace piper::runtime {

namespace {
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::vector<char>> mail;  // (from, to, tag) -> message
  struct Round {
    std::vector<double> sum;
    int arrived = 0, left = 0;
  };
  std::map<std::tuple<std::vector<int>, int, long>, Round> rounds;  // (group, channel, round number)
  std::map<std::tuple<int, std::vector<int>, int>, long> next_round;  // per rank, group, channel
  std::string aborted;
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<Shared> s, int rank, int size) : s_(std::move(s)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    std::unique_lock lk(s_->mu);
    check();
    auto key = std::make_tuple(rank_, peer, tag);
    if (s_->mail.count(key)) throw std::logic_error("fake communicator: a message with this tag is already in flight");
    s_->mail[key].assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    s_->cv.notify_all();
    // Blocking semantics, like a rendezvous send: wait until the receiver took it.
    s_->cv.wait(lk, [&] { return !s_->aborted.empty() || !s_->mail.count(key); });
    check();
  }

  // Posted as a send is, without waiting: done once the receiver took it (the message is copied
  // at once, so the buffer is free earlier than MPI's would be).
  std::unique_ptr<PendingSend> start_send(const void* data, size_t bytes, int peer, int tag) override {
    struct Posted : PendingSend {
      FakeCommunicator* comm;
      std::tuple<int, int, int> key;
      bool done() override {
        std::lock_guard lk(comm->s_->mu);
        comm->check();
        return !comm->s_->mail.count(key);
      }
      void wait() override {
        std::unique_lock lk(comm->s_->mu);
        comm->s_->cv.wait(lk, [&] { return !comm->s_->aborted.empty() || !comm->s_->mail.count(key); });
        comm->check();
      }
    };
    auto out = std::make_unique<Posted>();
    out->comm = this;
    out->key = std::make_tuple(rank_, peer, tag);
    std::lock_guard lk(s_->mu);
    check();
    if (s_->mail.count(out->key)) throw std::logic_error("fake communicator: a message with this tag is already in flight");
    s_->mail[out->key].assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    s_->cv.notify_all();
    return out;
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    std::unique_lock lk(s_->mu);
    auto key = std::make_tuple(peer, rank_, tag);
    s_->cv.wait(lk, [&] { return !s_->aborted.empty() || s_->mail.count(key); });
    check();
    auto& msg = s_->mail[key];
    if (msg.size() != bytes) throw std::runtime_error("fake communicator: message size mismatch");
    std::memcpy(data, msg.data(), bytes);
    s_->mail.erase(key);
    s_->cv.notify_all();
  }

  template <typename T>
  void reduce(T* data, size_t n, const std::vector<int>& group, int channel) {
    std::unique_lock lk(s_->mu);
    check();
    long round = s_->next_round[{rank_, group, channel}]++;
    auto key = std::make_tuple(group, channel, round);
    auto& r = s_->rounds[key];
    if (r.sum.empty()) r.sum.assign(n, 0.0);
    // Sum in group order for determinism: wait for our turn.
    size_t me = static_cast<size_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
    s_->cv.wait(lk, [&] { return !s_->aborted.empty() || static_cast<size_t>(s_->rounds[key].arrived) == me; });
    check();
    auto& rr = s_->rounds[key];
    for (size_t i = 0; i < n; ++i) rr.sum[i] += static_cast<double>(data[i]);
    ++rr.arrived;
    s_->cv.notify_all();
    s_->cv.wait(lk, [&] { return !s_->aborted.empty() || s_->rounds[key].arrived == static_cast<int>(group.size()); });
    check();
    auto& done = s_->rounds[key];
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<T>(done.sum[i]);
    if (++done.left == static_cast<int>(group.size())) s_->rounds.erase(key);
  }

  void all_reduce_sum(float* data, size_t n, const std::vector<int>& group, int channel) override {
    reduce(data, n, group, channel);
  }
  void all_reduce_sum(double* data, size_t n, const std::vector<int>& group, int channel) override {
    reduce(data, n, group, channel);
  }

  // Built on the summing rounds: exact, since every element has one non-zero contribution (gather)
  // or is summed in group order as all_reduce does (scatter).
  void reduce_scatter_sum(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                          int channel) override {
    std::vector<float> all(in, in + offsets.back());
    reduce(all.data(), all.size(), group, channel);
    size_t me = static_cast<size_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
    std::copy(all.begin() + static_cast<long>(offsets[me]), all.begin() + static_cast<long>(offsets[me + 1]), out);
  }
  void all_gather(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                  int channel) override {
    size_t me = static_cast<size_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
    std::vector<float> all(offsets.back(), 0.0f);
    if (!in) in = out + offsets[me];  // in place
    std::copy(in, in + (offsets[me + 1] - offsets[me]), all.begin() + static_cast<long>(offsets[me]));
    reduce(all.data(), all.size(), group, channel);
    std::copy(all.begin(), all.end(), out);
  }

  // Every part is left in the mailbox under a tag of the round (negative: plan tags are not), then
  // collected.
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
                    const std::vector<int>& group, int channel) override {
    const size_t me = static_cast<size_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
    count_sent(channel, send_bytes, me);
    std::unique_lock lk(s_->mu);
    check();
    const long round = s_->next_round[{rank_, group, channel}]++;
    const int tag = -1 - static_cast<int>(round * 64 + channel);
    const char* from = static_cast<const char*>(send);
    for (size_t j = 0; j < group.size(); ++j) {
      s_->mail[{rank_, group[j], tag}].assign(from, from + send_bytes[j]);
      from += send_bytes[j];
    }
    s_->cv.notify_all();
    char* to = static_cast<char*>(recv);
    for (size_t j = 0; j < group.size(); ++j) {
      auto key = std::make_tuple(group[j], rank_, tag);
      s_->cv.wait(lk, [&] { return !s_->aborted.empty() || s_->mail.count(key); });
      check();
      auto& msg = s_->mail[key];
      if (msg.size() != recv_bytes[j]) throw std::runtime_error("fake communicator: all_to_all_v size mismatch");
      std::memcpy(to, msg.data(), msg.size());
      to += recv_bytes[j];
      s_->mail.erase(key);
    }
  }

  [[noreturn]] void abort(const std::string& why) override {
    {
      std::lock_guard lk(s_->mu);
      if (s_->aborted.empty()) s_->aborted = "rank " + std::to_string(rank_) + ": " + why;
    }
    s_->cv.notify_all();
    throw std::runtime_error(why);
  }

 private:
  void check() {
    if (!s_->aborted.empty()) throw std::runtime_error("job aborted: " + s_->aborted);
  }
  std::shared_ptr<Shared> s_;
  int rank_, size_;
};
}  // namespace

std::vector<std::unique_ptr<Communicator>> make_fake_world(int ranks) {
  auto shared = std::make_shared<Shared>();
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_unique<FakeCommunicator>(shared, r, ranks));
  return out;
}

}  // namespace piper::runtime
