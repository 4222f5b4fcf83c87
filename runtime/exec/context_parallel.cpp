#include "runtime/exec/context_parallel.h"

#include <torch/torch.h>

namespace piper::runtime {

// Every member sends `t` to the next and receives the previous one's (member j then holds what j-1
// held). An all_to_all_v with one peer each way: the communicators' personalised exchange, so MPI
// and NCCL carry it without a send/recv pair that could deadlock in a ring.
torch::Tensor GroupRing::shift(const torch::Tensor& t) const {
  const int64_t k = ways(), me = member();
  if (k < 2) return t;
  torch::Tensor in = t.contiguous(), out = torch::empty_like(in);
  const size_t bytes = static_cast<size_t>(in.nbytes());
  std::vector<size_t> send(static_cast<size_t>(k), 0), recv(static_cast<size_t>(k), 0);
  send[static_cast<size_t>((me + 1) % k)] = bytes;
  recv[static_cast<size_t>((me + k - 1) % k)] = bytes;
  g_.comm->all_to_all_v(in.data_ptr(), send, out.data_ptr(), recv, g_.group, g_.channel);
  return out;
}

}  // namespace piper::runtime
