// How ranks talk: point-to-point and collectives over byte/float buffers, behind one interface with
// an MPI backend (mpi_communicator.cpp) and an in-process fake (threads as ranks) for tests.
#pragma once
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace piper::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Blocking point-to-point. A (peer, tag) pair names one message; sends and receives of different
  // tags may run concurrently on different threads.
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;
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
  // Declares a group before its first collective, so a backend can build its communicator up front
  // (every member declares its groups in the same sorted order, from one thread).
  virtual void prepare_group(const std::vector<int>& group, int channel) {}
  // The largest message tag send/recv accept.
  virtual int max_tag() const { return std::numeric_limits<int>::max(); }
  // Ends the whole job (all ranks) after a fatal error on this one, at once: peers blocked in a
  // send, receive or collective do not wait for it.
  [[noreturn]] virtual void abort(const std::string& why) = 0;
};

// N ranks in one process: make_fake_world(N)[r] is rank r's communicator; use each from its own
// thread(s). abort() throws on the calling rank and makes every blocked peer throw too.
std::vector<std::unique_ptr<Communicator>> make_fake_world(int ranks);

}  // namespace piper::runtime
