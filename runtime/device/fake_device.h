// A fake device for tests: LibTorch's PrivateUse1 slot given streams and events that only check and
// count what the executor asks of them, so the device side runs (tensors stay on the CPU).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper::runtime {

struct FakeDeviceCounts {
  int64_t streams = 0;        // taken from the pool
  int64_t records = 0;        // event records
  int64_t blocks = 0;         // event waits that reached the device
  int64_t synchronizes = 0;   // host waits for a stream
  int64_t kept = 0;           // record_stream calls (memory another stream still uses)
  std::vector<std::string> errors;  // what a real device would have run wrongly
};

// Registers the fake (once per process) and returns its device's name ("privateuseone:0").
std::string install_fake_device();
FakeDeviceCounts fake_device_counts();
void reset_fake_device_counts();

}  // namespace piper::runtime
