// The executor's device side: each logical stream of a rank on a device stream of its own, and the
// waits runtime/device_streams.h keeps as events; a Communicator that hands the library only data
// whose kernels have finished. Written against LibTorch's device-generic streams and events, so it
// builds with any LibTorch and runs on any device type that has them (CUDA); tests use a fake.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/view/device_streams.h"

namespace at {
class Tensor;
}

namespace piper::runtime {

class DeviceQueues {
 public:
  // `device` names the device whose streams run the program ("cuda:0"). Throws a clear error
  // when this LibTorch has no such device type or the type has no streams and events.
  DeviceQueues(const std::string& device, DeviceStreamPlan plan, size_t nodes);
  ~DeviceQueues();
  DeviceQueues(const DeviceQueues&) = delete;
  DeviceQueues& operator=(const DeviceQueues&) = delete;

  // Device stream k runs the ops of the plan's program k; `stream_of(v)` is that k (-1: not here).
  int stream_of(ir::NodeId v) const;
  // On the host thread of program k, before its first op: device stream k becomes the thread's
  // current stream, so every kernel the thread launches goes there.
  void enter(size_t k);
  // Around op v on its thread: its stream waits for the events the plan names (recorded when
  // their ops were launched: the host starts v only after its predecessors), then after v the
  // event others wait for is recorded. The plan drops waits that earlier ones imply, which holds
  // only when every stream launches in the program's order (StreamThreads::set_in_order).
  void before(ir::NodeId v);
  void after(ir::NodeId v);
  // A tensor that op v read but another stream allocated: the allocator must not hand its memory
  // out again until v's stream is done with it (the caching allocator's record_stream).
  void used_by_current_stream(const at::Tensor& t);
  // The host waits until every stream has finished what was launched (a step's end).
  void synchronize();
  // The host waits until the calling thread's current stream has finished (before a library
  // reads or writes device memory on its own streams).
  void synchronize_current();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DeviceStreamPlan plan_;
  std::vector<std::pair<int32_t, int32_t>> at_;  // per node: (device stream, position), (-1, -1) if not here
};

// `inner` for an executor whose tensors live on a device: before each call the calling thread's
// stream is synchronized, so the library (NCCL on its own streams) reads finished data; each call
// returns once the operation is complete, so what it wrote is final for every stream. Not owned.
std::unique_ptr<Communicator> make_device_synced_communicator(Communicator& inner, DeviceQueues& queues);

}  // namespace piper::runtime
