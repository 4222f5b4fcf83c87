// How ranks talk: point-to-point and collectives over byte/float buffers, behind one interface with
// an MPI backend (mpi_communicator.cpp) and an in-process fake (threads as ranks) for tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace piper::runtime {

// Which host each rank runs on, as the launcher placed them: hosts numbered by their lowest rank,
// each with its name.
struct HostMap {
  std::vector<int32_t> host_of;    // per rank
  std::vector<std::string> names;  // per host
  size_t count() const { return names.size(); }
  // "rank 3 on host h1" ("rank 3" on one host): how reports name a rank.
  std::string rank_label(int rank) const {
    if (count() < 2 || static_cast<size_t>(rank) >= host_of.size()) return "rank " + std::to_string(rank);
    return "rank " + std::to_string(rank) + " on host " + names[static_cast<size_t>(host_of[static_cast<size_t>(rank)])];
  }
  // "every rank, 0-3 on hosts h0, h1" ("every rank, 0-3" on one host): how a job-wide call is named.
  std::string everyone_label(int ranks) const {
    std::string s = "every rank, 0-" + std::to_string(ranks - 1);
    if (count() < 2) return s;
    s += " on hosts ";
    for (size_t h = 0; h < count(); ++h) s += (h ? ", " : "") + names[h];
    return s;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Blocking point-to-point. A (peer, tag) pair names one message; sends and receives of different
  // tags may run concurrently on different threads.
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;
  // A send that does not hold its caller's stream: started, then tested (done(); an error throws
  // there or from wait()). Its buffer stays untouched and alive until it is done. A rendezvous send
  // blocks until the peer has posted its receive; started instead, the stream runs on meanwhile.
  class PendingSend {
   public:
    virtual ~PendingSend() = default;
    virtual bool done() = 0;
    virtual void wait() = 0;
  };
  // Backends without a send of their own that returns early: the blocking send, already done.
  virtual std::unique_ptr<PendingSend> start_send(const void* data, size_t bytes, int peer, int tag) {
    send(data, bytes, peer, tag);
    struct Sent : PendingSend {
      bool done() override { return true; }
      void wait() override {}
    };
    return std::make_unique<Sent>();
  }
  // Sum over the ranks of `group` (ascending, includes this rank). Collectives on one group are
  // issued in the same order by every member; `channel` separates independent sequences (a stream's
  // collectives from the runtime's own bookkeeping), each with its own order.
  virtual void all_reduce_sum(float* data, size_t n, const std::vector<int>& group, int channel) = 0;
  virtual void all_reduce_sum(double* data, size_t n, const std::vector<int>& group, int channel) = 0;
  // ZeRO's halves of an all-reduce. `offsets` (group size + 1 entries) split the n elements among the
  // members in group order. reduce_scatter_sum: sum `in` (n elements) over the group; member j gets
  // elements [offsets[j], offsets[j+1]) in `out`. all_gather: member j contributes those elements
  // (`in`, or nullptr when they already sit in place in `out`); everyone gets all n in `out`.
  virtual void reduce_scatter_sum(const float* in, float* out, const std::vector<size_t>& offsets,
                                  const std::vector<int>& group, int channel) = 0;
  virtual void all_gather(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                          int channel) = 0;
  // Personalised exchange: member j of `group` gets send_bytes[j] bytes from this rank (the parts
  // lie one after another in `send`, in group order) and this rank gets recv_bytes[j] from member
  // j (likewise in `recv`). Both sides know the counts (exchange them first when they vary).
  virtual void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                            const std::vector<size_t>& recv_bytes, const std::vector<int>& group, int channel) = 0;
  // Bytes this rank sent to other ranks with all_to_all_v on `channel` so far (what expert
  // parallelism's dispatch and combine cost, measured).
  int64_t bytes_sent(int channel) const {
    std::lock_guard lk(sent_mu_);
    auto it = sent_.find(channel);
    return it == sent_.end() ? 0 : it->second;
  }
  // Declares a group before its first collective, so a backend can build its communicator up front
  // (every member declares its groups in the same sorted order, from one thread).
  virtual void prepare_group(const std::vector<int>& group, int channel) {}
  // The plan's `sms N` on the stream whose collectives use (group, channel): their communicator may
  // occupy at most N of the device's multiprocessors (NCCL: ncclConfig_t.maxCTAs). Said before
  // prepare_group, by every member alike; backends without multiprocessors ignore it.
  virtual void limit_sms(const std::vector<int>& group, int channel, int sms) {}
  // Where the ranks run (the MPI backend asks MPI which ranks share a node); one host by default.
  virtual HostMap hosts() const { return HostMap{std::vector<int32_t>(static_cast<size_t>(size()), 0), {"localhost"}}; }
  // The largest message tag send/recv accept.
  virtual int max_tag() const { return std::numeric_limits<int>::max(); }
  // Ends the whole job (all ranks) after a fatal error on this one, at once: peers blocked in a
  // send, receive or collective do not wait for it.
  [[noreturn]] virtual void abort(const std::string& why) = 0;

 protected:
  // Backends call this from all_to_all_v: the bytes for members other than `me`.
  void count_sent(int channel, const std::vector<size_t>& send_bytes, size_t me) {
    int64_t n = 0;
    for (size_t j = 0; j < send_bytes.size(); ++j)
      if (j != me) n += static_cast<int64_t>(send_bytes[j]);
    std::lock_guard lk(sent_mu_);
    sent_[channel] += n;
  }

 private:
  mutable std::mutex sent_mu_;
  std::map<int, int64_t> sent_;
};

// Every rank of `comm`, in order: the group of job-wide collectives.
inline std::vector<int> everyone(const Communicator& comm) {
  std::vector<int> all(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

// N ranks in one process: make_fake_world(N)[r] is rank r's communicator; use each from its own
// thread(s). abort() throws on the calling rank and makes every blocked peer throw too.
std::vector<std::unique_ptr<Communicator>> make_fake_world(int ranks);

}  // namespace piper::runtime
