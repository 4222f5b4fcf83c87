#include "runtime/device/device_queues.h"

#include <ATen/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

namespace piper::runtime {

struct DeviceQueues::Impl {
  c10::Device device;
  c10::impl::VirtualGuardImpl guard;
  std::vector<c10::Stream> streams;
  std::vector<c10::Event> events;

  static c10::Device parse(const std::string& name) {
    try {
      return c10::Device(name);
    } catch (const std::exception&) {
      throw std::runtime_error(fmt::format("device '{}': expected a device such as cuda or cuda:1", name));
    }
  }
  static c10::Device checked(const std::string& name) {
    c10::Device d = parse(name);
    const std::string type = c10::DeviceTypeName(d.type(), /*lower_case=*/true);
    if (d.is_cpu()) throw std::logic_error("DeviceQueues: the CPU has no device streams");
    if (!c10::impl::hasDeviceGuardImpl(d.type()))
      throw std::runtime_error(fmt::format(
          "device '{}': this LibTorch was built without {} (Debian's has none); build Piper against a LibTorch that "
          "has it (docs/runtime.md, \"GPUs\")",
          name, type));
    const int count = c10::impl::getDeviceGuardImpl(d.type())->deviceCount();
    if (!d.has_index()) d.set_index(0);
    if (d.index() >= count)
      throw std::runtime_error(fmt::format("device '{}': this machine has {} {} device(s)", name, count, type));
    return d;
  }
  explicit Impl(const std::string& name) : device(checked(name)), guard(device.type()) {}
};

DeviceQueues::DeviceQueues(const std::string& device, DeviceStreamPlan plan, size_t nodes)
    : impl_(std::make_unique<Impl>(device)), plan_(std::move(plan)), at_(nodes, {-1, -1}) {
  for (size_t k = 0; k < plan_.programs.size(); ++k) {
    // One pooled stream per logical stream: kernels of different logical streams may overlap.
    impl_->streams.push_back(impl_->guard.getStreamFromGlobalPool(impl_->device));
    for (size_t i = 0; i < plan_.programs[k].size(); ++i)
      at_.at(static_cast<size_t>(plan_.programs[k][i].op)) = {int32_t(k), int32_t(i)};
  }
  impl_->events.reserve(static_cast<size_t>(plan_.events));
  for (int32_t e = 0; e < plan_.events; ++e) impl_->events.emplace_back(impl_->device.type());
}

DeviceQueues::~DeviceQueues() = default;

int DeviceQueues::stream_of(ir::NodeId v) const { return at_.at(static_cast<size_t>(v)).first; }

void DeviceQueues::enter(size_t k) {
  impl_->guard.setDevice(impl_->device);  // a new thread starts on device 0 whatever the rank's
  impl_->guard.exchangeStream(impl_->streams.at(k));
}

void DeviceQueues::before(ir::NodeId v) {
  const auto [k, i] = at_.at(static_cast<size_t>(v));
  if (k < 0) throw std::logic_error(fmt::format("DeviceQueues: op {} does not run on this rank", v));
  for (int32_t e : plan_.programs[size_t(k)][size_t(i)].wait)
    impl_->events[static_cast<size_t>(e)].block(impl_->streams[size_t(k)]);
}

void DeviceQueues::after(ir::NodeId v) {
  const auto [k, i] = at_.at(static_cast<size_t>(v));
  const int32_t e = plan_.programs[size_t(k)][size_t(i)].record;
  if (e >= 0) impl_->events[static_cast<size_t>(e)].record(impl_->streams[size_t(k)]);
}

void DeviceQueues::used_by_current_stream(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  impl_->guard.recordDataPtrOnStream(t.storage().data_ptr(), impl_->guard.getStream(impl_->device));
}

void DeviceQueues::synchronize() {
  for (const c10::Stream& s : impl_->streams) impl_->guard.synchronizeStream(s);
}

void DeviceQueues::synchronize_current() { impl_->guard.synchronizeStream(impl_->guard.getStream(impl_->device)); }

namespace {
class DeviceSynced : public Communicator {
 public:
  DeviceSynced(Communicator& inner, DeviceQueues& q) : in_(inner), q_(q) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    q_.synchronize_current();
    in_.send(data, bytes, peer, tag);
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    q_.synchronize_current();  // the buffer may still be in use by kernels before it
    in_.recv(data, bytes, peer, tag);
  }
  void all_reduce_sum(float* data, size_t n, const std::vector<int>& group, int channel) override {
    q_.synchronize_current();
    in_.all_reduce_sum(data, n, group, channel);
  }
  void all_reduce_sum(double* data, size_t n, const std::vector<int>& group, int channel) override {
    q_.synchronize_current();
    in_.all_reduce_sum(data, n, group, channel);
  }
  void reduce_scatter_sum(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                          int channel) override {
    q_.synchronize_current();
    in_.reduce_scatter_sum(in, out, offsets, group, channel);
  }
  void all_gather(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                  int channel) override {
    q_.synchronize_current();
    in_.all_gather(in, out, offsets, group, channel);
  }
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes, const std::vector<int>& group, int channel) override {
    q_.synchronize_current();
    in_.all_to_all_v(send, send_bytes, recv, recv_bytes, group, channel);
  }
  void prepare_group(const std::vector<int>& group, int channel) override { in_.prepare_group(group, channel); }
  void limit_sms(const std::vector<int>& group, int channel, int sms) override { in_.limit_sms(group, channel, sms); }
  int max_tag() const override { return in_.max_tag(); }
  [[noreturn]] void abort(const std::string& why) override {
    in_.abort(why);
    std::abort();  // not reached (abort is [[noreturn]]); GCC does not see that through the virtual call
  }

 private:
  Communicator& in_;
  DeviceQueues& q_;
};
}  // namespace

std::unique_ptr<Communicator> make_device_synced_communicator(Communicator& inner, DeviceQueues& queues) {
  return std::make_unique<DeviceSynced>(inner, queues);
}

}  // namespace piper::runtime
