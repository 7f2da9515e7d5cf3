#include "executor/memory_meter.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "executor/torch_compat.h"

namespace ftexec {
namespace {

constexpr size_t kAlignment = 64;  // c10's gAlignment
constexpr size_t kHeader = 64;     // holds the size and the pool, keeps the data aligned

// Two pools: 0 the device (every CPU tensor of a CPU run), 1 the host (under a HostMemoryScope).
struct Pool {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
};
Pool g_pools[2];
std::atomic<int64_t> g_limit{0};  // on both pools together: the machine's memory
thread_local bool t_host = false;

void raise_peak(Pool& pool, int64_t now) {
  int64_t peak = pool.peak.load(std::memory_order_relaxed);
  while (now > peak && !pool.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void count_free(void* ctx) {
  if (!ctx) return;
  char* base = static_cast<char*>(ctx) - kHeader;
  size_t n = 0;
  unsigned char pool = 0;
  std::memcpy(&n, base, sizeof(n));
  std::memcpy(&pool, base + sizeof(n), 1);
  g_pools[pool].current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
  std::free(base);
}

struct CountingCpuAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) FTEXEC_ALLOCATE_CONST override {
    if (n == 0) return {nullptr, nullptr, &count_free, c10::Device(c10::DeviceType::CPU)};
    const unsigned char pool_index = t_host ? 1 : 0;
    Pool& pool = g_pools[pool_index];
    const int64_t limit = g_limit.load(std::memory_order_relaxed);
    const int64_t now = pool.current.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
    const int64_t both = now + g_pools[1 - pool_index].current.load(std::memory_order_relaxed);
    if (limit > 0 && both > limit) {
      pool.current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", n, " bytes with ",
                       both - static_cast<int64_t>(n), " in use and a limit of ", limit, " bytes");
    }
    void* base = nullptr;
    if (posix_memalign(&base, kAlignment, n + kHeader) != 0 || !base) {
      pool.current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", n, " bytes");
    }
    std::memcpy(base, &n, sizeof(n));
    std::memcpy(static_cast<char*>(base) + sizeof(n), &pool_index, 1);
    raise_peak(pool, now);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &count_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &count_free; }
#if FTEXEC_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif
};

CountingCpuAllocator g_allocator;

int cuda_index(const std::string& device) {
  const auto colon = device.find(':');
  return colon == std::string::npos ? 0 : std::atoi(device.c_str() + colon + 1);
}

}  // namespace

void cpu_meter_install() {
  static std::once_flag once;
  std::call_once(once, [] { c10::SetCPUAllocator(&g_allocator, /*priority=*/100); });
}

void cpu_meter_set_limit(int64_t bytes) { g_limit.store(bytes); }

HostMemoryScope::HostMemoryScope(bool active) : outer_(active && !t_host) {
  if (outer_) t_host = true;
}
HostMemoryScope::~HostMemoryScope() {
  if (outer_) t_host = false;
}

MemoryReading memory_read(const std::string& device) {
  MemoryReading r;
  if (device.rfind("cuda", 0) == 0) {
    const auto s = compat::cuda_memory_stats(cuda_index(device));
    r.current_bytes = s.allocated_current_bytes;
    r.peak_bytes = s.allocated_peak_bytes;
    r.reserved_peak_bytes = s.reserved_peak_bytes;
    r.device_used_bytes = s.device_used_bytes;
    r.device_total_bytes = s.device_total_bytes;
    r.alloc_retries = s.num_alloc_retries;
  } else {
    r.current_bytes = g_pools[0].current.load();
    r.peak_bytes = g_pools[0].peak.load();
    r.reserved_peak_bytes = r.peak_bytes;
  }
  r.host_current_bytes = g_pools[1].current.load();
  r.host_peak_bytes = g_pools[1].peak.load();
  return r;
}

void memory_reset_peak(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) {
    compat::cuda_reset_peak_stats(cuda_index(device));
  } else {
    g_pools[0].peak.store(g_pools[0].current.load());
  }
  g_pools[1].peak.store(g_pools[1].current.load());
}

}  // namespace ftexec
