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
constexpr size_t kHeader = 64;     // holds the size, keeps the data aligned

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_limit{0};

void count_free(void* ctx) {
  if (!ctx) return;
  char* base = static_cast<char*>(ctx) - kHeader;
  size_t n = 0;
  std::memcpy(&n, base, sizeof(n));
  g_current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
  std::free(base);
}

struct CountingCpuAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) FTEXEC_ALLOCATE_CONST override {
    if (n == 0) return {nullptr, nullptr, &count_free, c10::Device(c10::DeviceType::CPU)};
    const int64_t limit = g_limit.load(std::memory_order_relaxed);
    const int64_t now = g_current.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
    if (limit > 0 && now > limit) {
      g_current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", n, " bytes with ",
                       now - static_cast<int64_t>(n), " in use and a limit of ", limit, " bytes");
    }
    void* base = nullptr;
    if (posix_memalign(&base, kAlignment, n + kHeader) != 0 || !base) {
      g_current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", n, " bytes");
    }
    std::memcpy(base, &n, sizeof(n));
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
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
    return r;
  }
  r.current_bytes = g_current.load();
  r.peak_bytes = g_peak.load();
  r.reserved_peak_bytes = r.peak_bytes;
  return r;
}

void memory_reset_peak(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) {
    compat::cuda_reset_peak_stats(cuda_index(device));
    return;
  }
  g_peak.store(g_current.load());
}

}  // namespace ftexec
