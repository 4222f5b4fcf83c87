// The NCCL backend of Communicator: one NCCL communicator and CUDA stream per (group, channel),
// created in the order the members declare their groups, each from an ncclUniqueId that the group's
// first rank sends over the bootstrap communicator (MPI under mpirun, the fake in tests).
#pragma once
#include <memory>

#include "runtime/comm/communicator.h"
#include "runtime/comm/nccl_api.h"

namespace piper::runtime {

// Buffers may be host memory (staged through device scratch) or device memory (used in place).
// Point-to-point messages go over one NCCL communicator per direction of a rank pair, created on
// first use; each carries a header, so ranks that issue one pair's messages in different orders
// get an error naming both tags instead of each other's data. Waits sleep, and poll the
// communicator's asynchronous error: a failed or aborted peer ends the wait with an exception.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     std::unique_ptr<NcclApi> api);

}  // namespace piper::runtime
