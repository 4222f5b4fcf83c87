#include "runtime/memory_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>

#include "lang/units.h"

namespace piper::runtime {

namespace {
constexpr int kMaxRanks = 256;      // ranks of one process (fake worlds in tests)
constexpr size_t kHeader = 64;      // keeps the data 64-byte aligned, as LibTorch's allocator does

struct Header {
  uint64_t bytes;
  int32_t rank;
  uint8_t category;
};

struct Counter {
  std::mutex mu;
  std::array<MemoryStats, kMaxRanks> stats{};
  std::array<int64_t, kMaxRanks> limit{};
};
Counter& counter() {
  static Counter c;
  return c;
}

thread_local int t_rank = 0;
thread_local MemCategory t_category = MemCategory::Other;
thread_local std::string t_oom;
std::atomic<bool> installed{false};

void release(void* ctx) {
  auto* h = static_cast<Header*>(ctx);
  {
    Counter& c = counter();
    std::lock_guard lk(c.mu);
    MemoryStats& s = c.stats[static_cast<size_t>(h->rank)];
    s.live -= static_cast<int64_t>(h->bytes);
    s.live_by[h->category] -= static_cast<int64_t>(h->bytes);
  }
  c10::free_cpu(ctx);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    const int rank = t_rank;
    const auto cat = static_cast<uint8_t>(t_category);
    {
      Counter& c = counter();
      std::lock_guard lk(c.mu);
      MemoryStats& s = c.stats[static_cast<size_t>(rank)];
      const int64_t limit = c.limit[static_cast<size_t>(rank)];
      if (limit > 0 && s.live + static_cast<int64_t>(n) > limit) {
        t_oom = fmt::format("out of memory: needs {} more ({} live), limit {}", human_bytes(double(n)),
                            human_bytes(double(s.live)), human_bytes(double(limit)));
        throw OutOfMemory(t_oom);
      }
      s.live += static_cast<int64_t>(n);
      s.live_by[cat] += static_cast<int64_t>(n);
      ++s.allocations;
      if (s.live > s.peak) {
        s.peak = s.live;
        s.at_peak = s.live_by;
      }
    }
    void* base = c10::alloc_cpu(n + kHeader);
    auto* h = static_cast<Header*>(base);
    h->bytes = n;
    h->rank = rank;
    h->category = cat;
    return {static_cast<char*>(base) + kHeader, base, &release, c10::Device(c10::DeviceType::CPU)};
  }
};
}  // namespace

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Params: return "params";
    case MemCategory::Grads: return "grads";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::Comm: return "comm";
    case MemCategory::Gather: return "gather";
    case MemCategory::Other: return "other";
  }
  return "?";
}

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
