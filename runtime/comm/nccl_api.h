// NCCL and the CUDA runtime behind one interface: the real one (nccl_api.cpp, built with
// PIPER_WITH_NCCL) and an in-process fake (fake_nccl.cpp), so the NCCL communicator's logic runs in
// tests on machines without a GPU.
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <string>

namespace piper::runtime {

using NcclUniqueId = std::array<char, 128>;  // NCCL_UNIQUE_ID_BYTES
enum class NcclType { F32, F64 };

// Handles are opaque: an ncclComm_t and a cudaStream_t in the real API.
using NcclComm = void*;
using DeviceStream = void*;

// Every call either succeeds or throws std::runtime_error naming the call and NCCL's or CUDA's
// message. Enqueued work (copies, collectives) completes asynchronously on its stream.
class NcclApi {
 public:
  virtual ~NcclApi() = default;
  virtual std::string describe() const = 0;  // library version and device, for logs
  virtual NcclUniqueId unique_id() = 0;
  // Blocks until all `nranks` members have called it with the same id (ncclCommInitRankConfig).
  // `max_ctas` > 0 caps the thread blocks (so multiprocessors) its kernels take; 0: NCCL's default.
  virtual NcclComm init_comm(int nranks, const NcclUniqueId& id, int rank, int max_ctas) = 0;
  virtual void destroy_comm(NcclComm comm) = 0;
  virtual void abort_comm(NcclComm comm) = 0;      // unblocks work stuck in it (ncclCommAbort)
  virtual std::string async_error(NcclComm comm) = 0;  // "" while healthy (ncclCommGetAsyncError)

  virtual DeviceStream create_stream() = 0;
  virtual void destroy_stream(DeviceStream s) = 0;
  virtual bool stream_done(DeviceStream s) = 0;  // everything enqueued on it has finished (cudaStreamQuery)

  virtual bool is_device_pointer(const void* p) = 0;
  virtual void* device_alloc(size_t bytes) = 0;
  virtual void device_free(void* p) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, DeviceStream s) = 0;  // any direction, ordered on s

  // Calls between group_start and group_end are issued together (send/recv pairs cannot deadlock).
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  virtual void all_reduce_sum(const void* in, void* out, size_t count, NcclType t, NcclComm c, DeviceStream s) = 0;
  // Equal parts only: member j gets elements [j*recv_count, (j+1)*recv_count) of the sum.
  virtual void reduce_scatter_sum(const float* in, float* out, size_t recv_count, NcclComm c, DeviceStream s) = 0;
  virtual void all_gather(const float* in, float* out, size_t send_count, NcclComm c, DeviceStream s) = 0;
  virtual void send(const void* buf, size_t bytes, int peer, NcclComm c, DeviceStream s) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, NcclComm c, DeviceStream s) = 0;
};

// The real API on CUDA device `device`. Without PIPER_WITH_NCCL it throws, saying how to build it.
std::unique_ptr<NcclApi> make_nccl_api(int device);
bool nccl_built();  // this binary was built with PIPER_WITH_NCCL

}  // namespace piper::runtime
