#include "runtime/comm/nccl_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace piper::runtime {

namespace {
// Bootstrap tags: a group's unique id from its first member; a point-to-point direction's id from
// its sender. Only this communicator uses its bootstrap, so they cannot collide.
constexpr int kGroupIdTag = 1, kPeerIdTag = 2;

// Device memory that grows to the largest request and is reused: staging costs one copy each way,
// not an allocation per call.
class Scratch {
 public:
  explicit Scratch(NcclApi& api) : api_(api) {}
  ~Scratch() {
    if (p_) api_.device_free(p_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  char* get(size_t bytes) {
    if (bytes > size_) {
      if (p_) api_.device_free(p_);
      p_ = static_cast<char*>(api_.device_alloc(bytes));
      size_ = bytes;
    }
    return p_;
  }

 private:
  NcclApi& api_;
  char* p_ = nullptr;
  size_t size_ = 0;
};

// One NCCL communicator with its stream and scratch; one operation at a time.
struct Channel {
  Channel(NcclApi& api, NcclComm c, DeviceStream s) : comm(c), stream(s), in(api), out(api) {}
  NcclComm comm;
  DeviceStream stream;
  Scratch in, out;
  std::mutex mu;
};

struct Header {  // precedes each point-to-point message
  int64_t tag;
  int64_t bytes;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> boot, std::unique_ptr<NcclApi> api)
      : boot_(std::move(boot)), api_(std::move(api)) {}
  ~NcclCommunicator() override {
    for (auto& [key, ch] : groups_) release(*ch);
    for (auto& [key, slot] : peers_)
      if (slot->ch) release(*slot->ch);
  }
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  int max_tag() const override { return std::numeric_limits<int>::max(); }  // tags travel in the header

  void limit_sms(const std::vector<int>& group, int channel, int sms) override { max_ctas_[{group, channel}] = sms; }

  void prepare_group(const std::vector<int>& group, int channel) override {
    auto key = std::make_pair(group, channel);
    if (groups_.count(key)) return;
    const int me = index_in(group);
    // Members create their groups in one order (the contract), so the id exchanges and the
    // blocking ncclCommInitRank calls pair up without deadlock.
    NcclUniqueId id{};
    if (me == 0) {
      id = api_->unique_id();
      for (size_t j = 1; j < group.size(); ++j) boot_->send(id.data(), id.size(), group[j], kGroupIdTag);
    } else {
      boot_->recv(id.data(), id.size(), group.front(), kGroupIdTag);
    }
    // A limited stream's communicator gets at most that many CTAs: NCCL runs one per multiprocessor.
    const auto cap = max_ctas_.find(key);
    NcclComm c = api_->init_comm(static_cast<int>(group.size()), id, me, cap == max_ctas_.end() ? 0 : cap->second);
    groups_[key] = std::make_unique<Channel>(*api_, c, api_->create_stream());
  }

  void all_reduce_sum(float* data, size_t n, const std::vector<int>& group, int channel) override {
    all_reduce(data, n, NcclType::F32, sizeof(float), group, channel);
  }
  void all_reduce_sum(double* data, size_t n, const std::vector<int>& group, int channel) override {
    all_reduce(data, n, NcclType::F64, sizeof(double), group, channel);
  }

  // NCCL splits evenly; ZeRO's parts may differ by an element: padded to the largest part.
  void reduce_scatter_sum(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                          int channel) override {
    Channel& ch = get(group, channel);
    std::lock_guard lk(ch.mu);
    const size_t k = group.size(), me = static_cast<size_t>(index_in(group)), part = largest_part(offsets);
    float* pad = reinterpret_cast<float*>(ch.in.get(k * part * sizeof(float)));
    float* mine = reinterpret_cast<float*>(ch.out.get(part * sizeof(float)));
    for (size_t j = 0; j < k; ++j)
      if (size_t c = offsets[j + 1] - offsets[j]) api_->copy(pad + j * part, in + offsets[j], c * sizeof(float), ch.stream);
    api_->reduce_scatter_sum(pad, mine, part, ch.comm, ch.stream);
    if (size_t c = offsets[me + 1] - offsets[me]) api_->copy(out, mine, c * sizeof(float), ch.stream);
    wait(ch, "reduce-scatter");
  }
  void all_gather(const float* in, float* out, const std::vector<size_t>& offsets, const std::vector<int>& group,
                  int channel) override {
    Channel& ch = get(group, channel);
    std::lock_guard lk(ch.mu);
    const size_t k = group.size(), me = static_cast<size_t>(index_in(group)), part = largest_part(offsets);
    if (!in) in = out + offsets[me];  // in place
    float* mine = reinterpret_cast<float*>(ch.in.get(part * sizeof(float)));
    float* pad = reinterpret_cast<float*>(ch.out.get(k * part * sizeof(float)));
    if (size_t c = offsets[me + 1] - offsets[me]) api_->copy(mine, in, c * sizeof(float), ch.stream);
    api_->all_gather(mine, pad, part, ch.comm, ch.stream);
    for (size_t j = 0; j < k; ++j)
      if (size_t c = offsets[j + 1] - offsets[j]) api_->copy(out + offsets[j], pad + j * part, c * sizeof(float), ch.stream);
    wait(ch, "all-gather");
  }

  // Grouped sends and receives, NCCL's all-to-all; this rank's own part is a local copy.
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes, const std::vector<int>& group, int channel) override {
    Channel& ch = get(group, channel);
    std::lock_guard lk(ch.mu);
    const size_t me = static_cast<size_t>(index_in(group));
    count_sent(channel, send_bytes, me);
    size_t total_send = 0, total_recv = 0;
    for (size_t b : send_bytes) total_send += b;
    for (size_t b : recv_bytes) total_recv += b;
    char* s = stage_in(ch.in, send, total_send, ch.stream);
    char* r = staged(ch.out, recv, total_recv);
    api_->group_start();
    size_t so = 0, ro = 0;
    for (size_t j = 0; j < group.size(); ++j) {
      if (j == me) {
        if (send_bytes[j]) api_->copy(r + ro, s + so, send_bytes[j], ch.stream);
      } else {
        if (send_bytes[j]) api_->send(s + so, send_bytes[j], static_cast<int>(j), ch.comm, ch.stream);
        if (recv_bytes[j]) api_->recv(r + ro, recv_bytes[j], static_cast<int>(j), ch.comm, ch.stream);
      }
      so += send_bytes[j];
      ro += recv_bytes[j];
    }
    api_->group_end();
    if (r != recv && total_recv) api_->copy(recv, r, total_recv, ch.stream);
    wait(ch, "all-to-all");
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    Channel& ch = peer_channel(rank(), peer);
    std::lock_guard lk(ch.mu);
    Header h{tag, static_cast<int64_t>(bytes)};
    char* buf = ch.in.get(sizeof(Header) + bytes);
    api_->copy(buf, &h, sizeof h, ch.stream);
    if (bytes) api_->copy(buf + sizeof h, data, bytes, ch.stream);
    api_->send(buf, sizeof h + bytes, 1, ch.comm, ch.stream);
    wait(ch, "send");
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    Channel& ch = peer_channel(peer, rank());
    std::lock_guard lk(ch.mu);
    char* buf = ch.out.get(sizeof(Header) + bytes);
    api_->recv(buf, sizeof(Header) + bytes, 0, ch.comm, ch.stream);
    Header h{};
    api_->copy(&h, buf, sizeof h, ch.stream);
    wait(ch, "recv");
    if (h.tag != tag || h.bytes != static_cast<int64_t>(bytes))
      throw std::runtime_error(fmt::format("NCCL recv from rank {}: got tag {} ({} bytes), expected tag {} ({} bytes): the "
                                           "two ranks issue their messages in different orders",
                                           peer, h.tag, h.bytes, tag, bytes));
    if (bytes) {
      api_->copy(data, buf + sizeof h, bytes, ch.stream);
      wait(ch, "recv");
    }
  }

  [[noreturn]] void abort(const std::string& why) override {
    aborted_ = true;
    {
      std::lock_guard lk(peers_mu_);  // groups_ is complete before any stream runs
      for (auto& [key, ch] : groups_) api_->abort_comm(ch->comm);
      for (NcclComm c : peer_comms_) api_->abort_comm(c);
    }
    boot_->abort(why);
    std::abort();  // not reached: the bootstrap ends the job
  }

 private:
  int index_in(const std::vector<int>& group) const {
    auto it = std::find(group.begin(), group.end(), rank());
    if (it == group.end())
      throw std::logic_error(fmt::format("rank {} asked for a collective of a group it is not in", rank()));
    return static_cast<int>(it - group.begin());
  }
  void release(Channel& ch) {
    api_->destroy_comm(ch.comm);
    api_->destroy_stream(ch.stream);
  }
  static size_t largest_part(const std::vector<size_t>& offsets) {
    size_t m = 0;
    for (size_t j = 0; j + 1 < offsets.size(); ++j) m = std::max(m, offsets[j + 1] - offsets[j]);
    return std::max<size_t>(m, 1);
  }
  Channel& get(const std::vector<int>& group, int channel) {
    auto it = groups_.find({group, channel});
    if (it == groups_.end())
      throw std::logic_error(fmt::format("collective on group of {} ranks (channel {}) was never prepared", group.size(), channel));
    return *it->second;
  }
  // A buffer NCCL can read: device memory in place, host memory copied into scratch.
  char* stage_in(Scratch& s, const void* p, size_t bytes, DeviceStream st) {
    if (!bytes || api_->is_device_pointer(p)) return static_cast<char*>(const_cast<void*>(p));
    char* d = s.get(bytes);
    api_->copy(d, p, bytes, st);
    return d;
  }
  char* staged(Scratch& s, void* p, size_t bytes) {
    if (!bytes || api_->is_device_pointer(p)) return static_cast<char*>(p);
    return s.get(bytes);
  }
  void all_reduce(void* data, size_t n, NcclType t, size_t elem, const std::vector<int>& group, int channel) {
    Channel& ch = get(group, channel);
    std::lock_guard lk(ch.mu);
    char* d = stage_in(ch.in, data, n * elem, ch.stream);
    api_->all_reduce_sum(d, d, n, t, ch.comm, ch.stream);
    if (d != data && n) api_->copy(data, d, n * elem, ch.stream);
    wait(ch, "all-reduce");
  }

  // Sleeps between polls (nothing spins on the cores compute needs) and watches the communicator's
  // asynchronous error, as PyTorch's NCCL watchdog does.
  void wait(Channel& ch, const char* op) {
    auto sleep = std::chrono::microseconds(2);
    while (!api_->stream_done(ch.stream)) {
      if (std::string e = api_->async_error(ch.comm); !e.empty())
        throw std::runtime_error(fmt::format("NCCL {} on rank {}: {}", op, rank(), e));
      if (aborted_) throw std::runtime_error(fmt::format("NCCL {} on rank {}: the job is stopping", op, rank()));
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(500));
    }
  }

  // The communicator for messages from `src` to `dst` (two ranks: src is NCCL rank 0), created by
  // both on first use; the sender makes the id. Creation blocks until the peer joins, so it holds
  // only its own slot's lock: rank A's send thread creating A->B while rank B's creates B->A must
  // not stop either receive thread from joining.
  Channel& peer_channel(int src, int dst) {
    std::shared_ptr<PeerSlot> slot;
    {
      std::lock_guard lk(peers_mu_);
      auto& p = peers_[{src, dst}];
      if (!p) p = std::make_shared<PeerSlot>();
      slot = p;
    }
    std::call_once(slot->once, [&] {
      NcclUniqueId id{};
      const bool sender = src == rank();
      if (sender) {
        id = api_->unique_id();
        boot_->send(id.data(), id.size(), dst, kPeerIdTag);
      } else {
        boot_->recv(id.data(), id.size(), src, kPeerIdTag);
      }
      NcclComm c = api_->init_comm(2, id, sender ? 0 : 1, 0);
      slot->ch = std::make_unique<Channel>(*api_, c, api_->create_stream());
      std::lock_guard lk(peers_mu_);
      peer_comms_.push_back(c);  // for abort, which must not read a slot still being filled
    });
    return *slot->ch;
  }

  std::unique_ptr<Communicator> boot_;
  std::unique_ptr<NcclApi> api_;
  std::map<std::pair<std::vector<int>, int>, std::unique_ptr<Channel>> groups_;  // written before streams start
  std::map<std::pair<std::vector<int>, int>, int> max_ctas_;  // limit_sms, read by prepare_group
  struct PeerSlot {
    std::once_flag once;
    std::unique_ptr<Channel> ch;
  };
  std::mutex peers_mu_;
  std::map<std::pair<int, int>, std::shared_ptr<PeerSlot>> peers_;  // (from, to)
  std::vector<NcclComm> peer_comms_;  // the ones created, under peers_mu_
  std::atomic<bool> aborted_{false};
};
}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     std::unique_ptr<NcclApi> api) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), std::move(api));
}

}  // namespace piper::runtime
