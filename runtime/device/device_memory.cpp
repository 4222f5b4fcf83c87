#include "runtime/device/device_memory.h"

#include <c10/core/Device.h>

#if PIPER_TORCH_CUDA  // a LibTorch with CUDA (runtime/CMakeLists.txt); not compiled against Debian's
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace piper::runtime {

#if PIPER_TORCH_CUDA
std::optional<MemoryStats> device_memory_stats(const std::string& device) {
  const c10::Device d(device);
  if (!d.is_cuda()) return std::nullopt;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.has_index() ? d.index() : 0);
  const auto& bytes = stats.allocated_bytes[0];  // StatType::AGGREGATE: every pool
  MemoryStats m;
  m.live = bytes.current;
  m.peak = bytes.peak;
  m.allocations = stats.allocation[0].allocated;
  return m;
}

void reset_device_memory_peak(const std::string& device) {
  const c10::Device d(device);
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.has_index() ? d.index() : 0);
}
#else
std::optional<MemoryStats> device_memory_stats(const std::string&) { return std::nullopt; }
void reset_device_memory_peak(const std::string&) {}
#endif

}  // namespace piper::runtime
