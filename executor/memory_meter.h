// Peak memory of a run, measured, not estimated.
//   CPU: a counting allocator installed as LibTorch's CPU allocator (c10::SetCPUAllocator) sees every
//        tensor byte on every thread; its data pointer equals its context, as raw_allocate requires.
//   CUDA: the caching allocator's statistics plus what the device reports in use (cudaMemGetInfo:
//        context, cuBLAS workspaces, NCCL buffers), read through torch_compat.h.
// No LibTorch in this header.
#pragma once

#include <cstdint>
#include <string>

namespace ftexec {

struct MemoryReading {
  int64_t current_bytes = 0;       // tensor bytes alive now (CUDA: allocated), host memory apart
  int64_t peak_bytes = 0;          // since the last reset (CUDA: peak allocated)
  int64_t reserved_peak_bytes = 0; // CUDA: peak held by the caching allocator; CPU: = peak_bytes
  int64_t device_used_bytes = 0;   // CUDA: total - free now; CPU: 0
  int64_t device_total_bytes = 0;  // CUDA: device memory; CPU: 0
  int64_t alloc_retries = 0;       // CUDA: cudaMalloc retries (fragmentation)
  int64_t host_current_bytes = 0;  // allocated under a HostMemoryScope (offloaded states), now
  int64_t host_peak_bytes = 0;     // ... and the most since the last reset
};

// Allocations this thread makes on the CPU while a scope is alive are host memory: an offloading
// strategy's optimizer states, gradients and parameter shards. On a CPU run device and host share
// one allocator, so the scope is what keeps them apart; on CUDA the CPU tensors are host anyway.
// Frees are attributed to the pool the bytes came from, whichever thread frees them.
class HostMemoryScope {
 public:
  explicit HostMemoryScope(bool active = true);  // inactive: counts nothing apart (not offloading)
  ~HostMemoryScope();
  HostMemoryScope(const HostMemoryScope&) = delete;
  HostMemoryScope& operator=(const HostMemoryScope&) = delete;

 private:
  bool outer_;
};

// Installs the counting CPU allocator (idempotent). Call before any tensor is made.
void cpu_meter_install();
// Allocations that would take the CPU total past `bytes` fail with an out-of-memory error
// (0: no limit). Lets a CPU run stand in for a device of a given size.
void cpu_meter_set_limit(int64_t bytes);

// device: "cpu" or "cuda:N".
MemoryReading memory_read(const std::string& device);
void memory_reset_peak(const std::string& device);

}  // namespace ftexec
