// The MPI backend of Communicator: nonblocking calls waited on without spinning, one duplicated
// communicator for point-to-point, one per (group, channel) for collectives, MPI_THREAD_MULTIPLE so
// streams can communicate concurrently.
#pragma once
#include <memory>

#include "runtime/comm/communicator.h"

namespace piper::runtime {

// Initialises MPI (with thread support) on first use; finalises at exit. Works without mpirun too
// (a world of one).
std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv);

}  // namespace piper::runtime
