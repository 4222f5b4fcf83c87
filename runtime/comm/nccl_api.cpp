// The real NcclApi: NCCL 2.x and the CUDA runtime. Built only with PIPER_WITH_NCCL (the CUDA
// toolkit and NCCL found); nccl_api_stub.cpp stands in otherwise.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>

#include "runtime/comm/nccl_api.h"

namespace piper::runtime {

namespace {
void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) throw std::runtime_error(fmt::format("NCCL {}: {}", call, ncclGetErrorString(r)));
}
void check(cudaError_t r, const char* call) {
  if (r != cudaSuccess) throw std::runtime_error(fmt::format("CUDA {}: {}", call, cudaGetErrorString(r)));
}
ncclComm_t comm(NcclComm c) { return static_cast<ncclComm_t>(c); }
cudaStream_t stream(DeviceStream s) { return static_cast<cudaStream_t>(s); }

class CudaNccl : public NcclApi {
 public:
  explicit CudaNccl(int device) : device_(device) {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device < 0 || device >= count)
      throw std::runtime_error(fmt::format("CUDA device {} does not exist: this machine has {}", device, count));
    check(cudaSetDevice(device), "cudaSetDevice");
  }
  std::string describe() const override {
    int v = 0;
    ncclGetVersion(&v);
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, device_);
    return fmt::format("NCCL {}.{}.{} on CUDA device {} ({})", v / 10000, (v / 100) % 100, v % 100, device_, p.name);
  }
  NcclUniqueId unique_id() override {
    ncclUniqueId id;
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    NcclUniqueId out;
    std::memcpy(out.data(), id.internal, out.size());
    return out;
  }
  NcclComm init_comm(int nranks, const NcclUniqueId& id, int rank, int max_ctas) override {
    // Every thread that talks to the device uses this rank's device.
    check(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId nid;
    std::memcpy(nid.internal, id.data(), id.size());
    ncclComm_t c = nullptr;
    // NCCL runs each channel as one CTA on its own multiprocessor: capping the CTAs caps the
    // multiprocessors its kernels take from compute (`sms` in the strategy).
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (max_ctas > 0) config.maxCTAs = max_ctas;
    check(ncclCommInitRankConfig(&c, nranks, nid, rank, &config), "ncclCommInitRankConfig");
    return c;
  }
  void destroy_comm(NcclComm c) override { check(ncclCommDestroy(comm(c)), "ncclCommDestroy"); }
  void abort_comm(NcclComm c) override { ncclCommAbort(comm(c)); }  // best effort, on the failure path
  std::string async_error(NcclComm c) override {
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(comm(c), &r) != ncclSuccess) return "ncclCommGetAsyncError failed";
    return r == ncclSuccess || r == ncclInProgress ? "" : ncclGetErrorString(r);
  }

  DeviceStream create_stream() override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(DeviceStream s) override { cudaStreamDestroy(stream(s)); }
  bool stream_done(DeviceStream s) override {
    cudaError_t r = cudaStreamQuery(stream(s));
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaStreamQuery");
    return true;
  }

  bool is_device_pointer(const void* p) override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "invalid value" for unregistered host memory
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  void* device_alloc(size_t bytes) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void device_free(void* p) override { cudaFree(p); }
  void copy(void* dst, const void* src, size_t bytes, DeviceStream s) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream(s)), "cudaMemcpyAsync");
  }

  void group_start() override { check(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() override { check(ncclGroupEnd(), "ncclGroupEnd"); }
  void all_reduce_sum(const void* in, void* out, size_t count, NcclType t, NcclComm c, DeviceStream s) override {
    check(ncclAllReduce(in, out, count, t == NcclType::F32 ? ncclFloat32 : ncclFloat64, ncclSum, comm(c), stream(s)),
          "ncclAllReduce");
  }
  void reduce_scatter_sum(const float* in, float* out, size_t recv_count, NcclComm c, DeviceStream s) override {
    check(ncclReduceScatter(in, out, recv_count, ncclFloat32, ncclSum, comm(c), stream(s)), "ncclReduceScatter");
  }
  void all_gather(const float* in, float* out, size_t send_count, NcclComm c, DeviceStream s) override {
    check(ncclAllGather(in, out, send_count, ncclFloat32, comm(c), stream(s)), "ncclAllGather");
  }
  void send(const void* buf, size_t bytes, int peer, NcclComm c, DeviceStream s) override {
    check(ncclSend(buf, bytes, ncclUint8, peer, comm(c), stream(s)), "ncclSend");
  }
  void recv(void* buf, size_t bytes, int peer, NcclComm c, DeviceStream s) override {
    check(ncclRecv(buf, bytes, ncclUint8, peer, comm(c), stream(s)), "ncclRecv");
  }

 private:
  int device_;
};
}  // namespace

std::unique_ptr<NcclApi> make_nccl_api(int device) { return std::make_unique<CudaNccl>(device); }
bool nccl_built() { return true; }

}  // namespace piper::runtime
