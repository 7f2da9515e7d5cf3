// The one place that knows LibTorch 1.13 (Debian's CPU build) from 2.x (the pip wheel's CUDA build).
// Nothing else in ftexec branches on TORCH_VERSION_*; it asks this header instead.
//   - SDPA: at::scaled_dot_product_attention with `scale` exists from 2.1, `enable_gqa` from 2.5.
//   - c10d: ProcessGroupGloo/NCCL derive from c10d::ProcessGroup in 1.13 and c10d::Backend in 2.x:
//     compat::C10dGroup names the base, make_gloo_group()/make_nccl_group() build one. The c10d part is
//     compiled only in the translation unit that defines FTEXEC_INCLUDE_C10D before this header
//     (executor/comm.cpp), so the other executor sources stay free of c10d and Gloo headers.
//   - autograd: a hook after a leaf's gradient is accumulated (DDP's and ZeRO's trigger) goes on the
//     leaf's AccumulateGrad node (what c10d's Reducer does in 1.13; Python's
//     register_post_accumulate_grad_hook arrived in 2.1 on top of the same node).
//   - storage: FSDP/ZeRO-3 free a gathered unit by resizing its storage to 0 bytes and refill it later,
//     so the tensors autograd saved keep their identity (storage_resize()).
//   - CUDA caching-allocator statistics: the aggregate entry is index [0] in both (the StatType enum
//     moved in 2.x), read through cuda_memory_stats() below.
// CUDA code is compiled only when the LibTorch found by CMake has CUDA (FTEXEC_WITH_CUDA).
#pragma once

#include <cstdint>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <functional>
#include <memory>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#if defined(FTEXEC_WITH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#if defined(FTEXEC_INCLUDE_C10D)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL) && defined(FTEXEC_WITH_CUDA)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif

#define FTEXEC_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace ftexec::compat {

// "1.13" or "2.5": what measured.json reports.
inline const char* torch_version() { return TORCH_VERSION; }

// ---- attention ---------------------------------------------------------------------------------
constexpr bool kHasSdpa = FTEXEC_TORCH_AT_LEAST(2, 1);
constexpr bool kSdpaHasGqa = FTEXEC_TORCH_AT_LEAST(2, 5);

// Causal SDPA over q [B, H, S, d] and k, v [B, H_kv, S, d]. Where SDPA takes GQA natively (2.5+)
// k and v stay unrepeated (what the planner's fused-attention term assumes); before that the caller
// passes them repeated to H heads. Only call when kHasSdpa.
inline at::Tensor sdpa_causal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
#if FTEXEC_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          scale, /*enable_gqa=*/k.size(1) != q.size(1));
#elif FTEXEC_TORCH_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          scale);
#else
  (void)q, (void)k, (void)v, (void)scale;
  TORCH_CHECK(false, "scaled_dot_product_attention needs libtorch >= 2.1 (this is ", TORCH_VERSION, ")");
#endif
}

// Whether sdpa_causal's kernel skips the key blocks above the causal diagonal (about half of S x S, what
// the planner times a fused causal kernel at: planner/compute_model.cpp flops_per_token): on CUDA the
// flash and memory-efficient kernels bound each query block's keys by the diagonal (flash-attention's
// compute_attn_1rowblock, Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_kernel.h at
// 0142ff05acc56c45755638857e77e35f1c350098); on CPU the flash kernel from 2.2 does too (cpu_flash_attention:
// num_keys = is_causal ? min(m + qBlockSize, kvSize) : kvSize, pytorch/pytorch
// aten/src/ATen/native/cpu/FlashAttentionKernel.cpp at 430c4e3b39c505f6a21e11e7e655cac8f3b53521), while
// 2.1 on CPU runs the math path over the whole masked S x S. Without SDPA (1.13) ftexec runs eager attention,
// which computes every block.
inline bool sdpa_causal_skips_blocks(bool cuda) { return kHasSdpa && (cuda || FTEXEC_TORCH_AT_LEAST(2, 2)); }

// ---- allocators --------------------------------------------------------------------------------
// c10::Allocator::allocate() lost its `const` and copy_data() became pure virtual in 2.3.
#if FTEXEC_TORCH_AT_LEAST(2, 3)
#define FTEXEC_ALLOCATE_CONST
#define FTEXEC_ALLOCATOR_HAS_COPY_DATA 1
#else
#define FTEXEC_ALLOCATE_CONST const
#define FTEXEC_ALLOCATOR_HAS_COPY_DATA 0
#endif

// ---- CUDA memory -------------------------------------------------------------------------------
constexpr bool kBuiltWithCuda =
#if defined(FTEXEC_WITH_CUDA)
    true;
#else
    false;
#endif

struct CudaMemoryStats {
  int64_t allocated_current_bytes = 0;  // tensors alive now
  int64_t allocated_peak_bytes = 0;
  int64_t active_peak_bytes = 0;        // blocks in use, incl. rounding up of allocation sizes
  int64_t reserved_current_bytes = 0;   // held by the caching allocator
  int64_t reserved_peak_bytes = 0;
  int64_t num_alloc_retries = 0;        // cudaMalloc retries after freeing the cache: fragmentation
  int64_t device_used_bytes = 0;        // cudaMemGetInfo: total - free (context, cuBLAS, NCCL too)
  int64_t device_total_bytes = 0;
};

inline CudaMemoryStats cuda_memory_stats(int device) {
  CudaMemoryStats s;
#if defined(FTEXEC_WITH_CUDA)
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  s.allocated_current_bytes = stats.allocated_bytes[0].current;
  s.allocated_peak_bytes = stats.allocated_bytes[0].peak;
  s.active_peak_bytes = stats.active_bytes[0].peak;
  s.reserved_current_bytes = stats.reserved_bytes[0].current;
  s.reserved_peak_bytes = stats.reserved_bytes[0].peak;
  s.num_alloc_retries = stats.num_alloc_retries;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    s.device_used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
    s.device_total_bytes = static_cast<int64_t>(total_bytes);
  }
#else
  (void)device;
#endif
  return s;
}

inline void cuda_reset_peak_stats(int device) {
#if defined(FTEXEC_WITH_CUDA)
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#else
  (void)device;
#endif
}

inline int cuda_device_count() {
#if defined(FTEXEC_WITH_CUDA)
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

inline void cuda_synchronize() {
#if defined(FTEXEC_WITH_CUDA)
  cudaDeviceSynchronize();
#endif
}

// ---- autograd hooks ----------------------------------------------------------------------------
// Calls `fn` each time autograd has accumulated a gradient into leaf `param` (param.grad() is then
// up to date). Returns the AccumulateGrad node: keep it alive as long as the hook must fire (the
// leaf only holds a weak reference to it).
inline std::shared_ptr<torch::autograd::Node> add_post_accumulate_hook(const at::Tensor& param, std::function<void()> fn) {
  auto acc = torch::autograd::impl::grad_accumulator(param);
  TORCH_CHECK(acc, "add_post_accumulate_hook: the tensor is not a leaf that requires grad");
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [fn = std::move(fn)](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
        fn();
        return outputs;
      }));
  return acc;
}

// ---- storage -----------------------------------------------------------------------------------
// Gives `t`'s storage `nbytes` fresh (uninitialised) bytes from its allocator, or frees them
// (nbytes 0). Every tensor sharing the storage sees the change; their sizes and offsets stay.
inline void storage_resize(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes) return;
  s->set_data_ptr_noswap(nbytes ? s->allocator()->allocate(nbytes) : at::DataPtr(nullptr, s->device()));
  s->set_nbytes(nbytes);
}

// ---- c10d --------------------------------------------------------------------------------------
#if defined(FTEXEC_INCLUDE_C10D)
#if FTEXEC_TORCH_AT_LEAST(2, 0)
using C10dGroup = c10d::Backend;       // ProcessGroupGloo/NCCL derive from Backend in 2.x
#else
using C10dGroup = c10d::ProcessGroup;  // ... and from ProcessGroup in 1.13
#endif

inline c10::intrusive_ptr<C10dGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     std::chrono::milliseconds timeout, const std::string& host) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  options->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

constexpr bool kHasNccl =
#if defined(USE_C10D_NCCL) && defined(FTEXEC_WITH_CUDA)
    true;
#else
    false;
#endif

// NCCL (CUDA builds of LibTorch 2.x only; cannot be compiled against Debian's CPU 1.13).
inline c10::intrusive_ptr<C10dGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     std::chrono::milliseconds timeout) {
#if defined(USE_C10D_NCCL) && defined(FTEXEC_WITH_CUDA)
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  TORCH_CHECK(false, "NCCL: this ftexec was built without USE_C10D_NCCL / CUDA (libtorch ", TORCH_VERSION, ")");
#endif
}
#endif  // FTEXEC_INCLUDE_C10D

}  // namespace ftexec::compat
