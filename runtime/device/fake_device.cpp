#include "runtime/device/fake_device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <map>
#include <mutex>

namespace piper::runtime {
namespace {
using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;
constexpr DeviceType kType = DeviceType::PrivateUse1;

struct Event {
  int64_t records = 0;
  std::map<c10::StreamId, int64_t> blocks;  // per waiting stream
};

std::mutex mu;
FakeDeviceCounts counts;
int64_t next_stream = 0;
thread_local Stream current{Stream::DEFAULT, Device(kType, 0)};

void error(const std::string& what) { counts.errors.push_back(what); }

// What CUDA's guard does, with the device's queues reduced to checks: events are recorded and
// waited for on the thread's current stream (the one its kernels go to), and each wait follows
// the record it means — one fresh record per wait and waiting stream.
struct FakeGuard final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kType; }
  Device exchangeDevice(Device d) const override { return d; }
  Device getDevice() const override { return Device(kType, 0); }
  void setDevice(Device) const override {}
  void uncheckedSetDevice(Device) const noexcept override {}
  Stream getStream(Device) const noexcept override { return current; }
  Stream getStreamFromGlobalPool(Device d, bool) const override {
    std::lock_guard lk(mu);
    ++counts.streams;
    return Stream(Stream::UNSAFE, d, ++next_stream);
  }
  Stream exchangeStream(Stream s) const noexcept override {
    Stream old = current;
    current = s;
    return old;
  }
  void destroyEvent(void* e, const DeviceIndex) const noexcept override { delete static_cast<Event*>(e); }
  void record(void** event, const Stream& s, const DeviceIndex, const c10::EventFlag) const override {
    std::lock_guard lk(mu);
    if (!*event) *event = new Event;
    ++static_cast<Event*>(*event)->records;
    ++counts.records;
    if (s != current) error(fmt::format("an event recorded on stream {} by a thread whose stream is {}", s.id(), current.id()));
  }
  void block(void* event, const Stream& s) const override {
    std::lock_guard lk(mu);
    auto* e = static_cast<Event*>(event);
    ++counts.blocks;
    const int64_t n = ++e->blocks[s.id()];
    if (n != e->records)
      error(fmt::format("stream {} waits for an event the {} time, recorded {} times: a wait before its record", s.id(), n,
                        e->records));
    if (s != current) error(fmt::format("stream {} made to wait by a thread whose stream is {}", s.id(), current.id()));
  }
  bool queryEvent(void*) const override { return true; }
  DeviceIndex deviceCount() const noexcept override { return 1; }
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {
    std::lock_guard lk(mu);
    ++counts.synchronizes;
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const Stream& s) const override {
    std::lock_guard lk(mu);
    ++counts.kept;
    if (s != current) error("memory kept for a stream other than the thread's");
  }
};
}  // namespace

std::string install_fake_device() {
  static c10::impl::DeviceGuardImplRegistrar registrar(kType, new FakeGuard);
  return "privateuseone:0";
}

FakeDeviceCounts fake_device_counts() {
  std::lock_guard lk(mu);
  return counts;
}

void reset_fake_device_counts() {
  std::lock_guard lk(mu);
  counts = FakeDeviceCounts{};
}

}  // namespace piper::runtime
