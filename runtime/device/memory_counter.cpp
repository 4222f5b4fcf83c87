#include "runtime/device/memory_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "lang/units.h"
#include "runtime/device/torch_compat.h"

namespace piper::runtime {

namespace {
constexpr int kMaxRanks = 256;  // ranks of one process (fake worlds in tests)

struct Block {  // what a live allocation was charged to
  uint64_t bytes;
  int32_t rank;
  uint8_t category;
};

struct Counter {
  std::mutex mu;
  std::array<MemoryStats, kMaxRanks> stats{};
  std::array<int64_t, kMaxRanks> limit{};
  // LibTorch's raw_allocate needs the data pointer to be the context, so the bookkeeping lives
  // beside the allocation rather than in a header before it.
  std::unordered_map<void*, Block> blocks;
};
Counter& counter() {
  static Counter c;
  return c;
}

thread_local int t_rank = 0;
thread_local MemCategory t_category = MemCategory::Other;
thread_local std::string t_oom;
std::atomic<bool> installed{false};

void release(void* ptr) {
  {
    Counter& c = counter();
    std::lock_guard lk(c.mu);
    auto it = c.blocks.find(ptr);
    if (it != c.blocks.end()) {
      MemoryStats& s = c.stats[static_cast<size_t>(it->second.rank)];
      s.live -= static_cast<int64_t>(it->second.bytes);
      s.live_by[it->second.category] -= static_cast<int64_t>(it->second.bytes);
      c.blocks.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

class CountingAllocator final : public CompatAllocator {
 public:
  c10::DataPtr allocate_bytes(size_t n) const override {
    const int rank = t_rank;
    const auto cat = static_cast<uint8_t>(t_category);
    void* data = c10::alloc_cpu(n);
    {
      Counter& c = counter();
      std::lock_guard lk(c.mu);
      MemoryStats& s = c.stats[static_cast<size_t>(rank)];
      const int64_t limit = c.limit[static_cast<size_t>(rank)];
      if (limit > 0 && s.live + static_cast<int64_t>(n) > limit) {
        t_oom = fmt::format("out of memory: needs {} more ({} live), limit {}", human_bytes(double(n)),
                            human_bytes(double(s.live)), human_bytes(double(limit)));
        c10::free_cpu(data);
        throw OutOfMemory(t_oom);
      }
      c.blocks[data] = Block{n, rank, cat};
      s.live += static_cast<int64_t>(n);
      s.live_by[cat] += static_cast<int64_t>(n);
      ++s.allocations;
      if (s.live > s.peak) {
        s.peak = s.live;
        s.at_peak = s.live_by;
      }
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};
}  // namespace

void install_memory_counter() {
  static CountingAllocator allocator;
  static std::once_flag once;
  std::call_once(once, [] {
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    installed = true;
  });
}
bool memory_counter_installed() { return installed; }

void set_memory_rank(int rank) {
  if (rank < 0 || rank >= kMaxRanks) throw std::runtime_error(fmt::format("memory counter: rank {} out of range", rank));
  t_rank = rank;
}
int memory_rank() { return t_rank; }

MemScope::MemScope(MemCategory c) : saved_(t_category) { t_category = c; }
MemScope::~MemScope() { t_category = saved_; }

MemoryStats memory_stats(int rank) {
  Counter& c = counter();
  std::lock_guard lk(c.mu);
  return c.stats[static_cast<size_t>(rank)];
}

void reset_memory_peak(int rank) {
  Counter& c = counter();
  std::lock_guard lk(c.mu);
  MemoryStats& s = c.stats[static_cast<size_t>(rank)];
  s.peak = s.live;
  s.at_peak = s.live_by;
}

void set_memory_limit(int rank, int64_t bytes) {
  Counter& c = counter();
  std::lock_guard lk(c.mu);
  c.limit[static_cast<size_t>(rank)] = bytes;
}

std::string take_out_of_memory() { return std::exchange(t_oom, std::string()); }

}  // namespace piper::runtime
