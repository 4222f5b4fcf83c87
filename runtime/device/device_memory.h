// Measured memory on a device: its own allocator's figures (CUDA's caching allocator), where the
// CPU's counting allocator (memory_counter.h) sees nothing.
#pragma once
#include <optional>
#include <string>

#include "runtime/device/memory_counter.h"

namespace piper::runtime {

// Live and peak bytes of tensor storage on `device` ("cuda:1"), not by category; nullopt for the
// CPU or when this LibTorch was built without the device's allocator (Debian's has no CUDA).
std::optional<MemoryStats> device_memory_stats(const std::string& device);
void reset_device_memory_peak(const std::string& device);  // the peak restarts from what is live now

}  // namespace piper::runtime
