// PyTorch's CUDA caching allocator, replayed on a sequence of allocations and frees: which segments it
// reserves, how it splits and merges cached blocks, and whether a request fails after it has released
// every cached segment it can. The rules are c10/cuda/CUDACachingAllocator.cpp's (pytorch/pytorch at
// 001074d25084fdb87a799823e395a50f5ec044d3), default configuration (no max_split_size, no expandable
// segments, one stream):
//   - every request is rounded up to a multiple of 512 B (round_size); requests up to 1 MiB come from the
//     small pool, larger ones from the large pool (get_pool);
//   - a request takes the smallest cached free block of its pool that is large enough (get_free_block:
//     blocks ordered by size, then address) and splits off the rest when more than 1 MiB remains (large
//     pool) or at least 512 B (small pool) (should_split);
//   - without such a block it reserves a new segment: 2 MiB for a small request, 20 MiB for one under
//     10 MiB, else the request rounded up to 2 MiB (get_allocation_size);
//   - when the device has no room for the segment it releases every cached segment that is whole and free
//     (release_cached_blocks: a segment split by a live tensor cannot be returned) and retries once; a second
//     failure is the out-of-memory error;
//   - a freed block merges with free neighbours of its segment (free_block, try_merge_blocks).
// So memory a live tensor pins in a segment that once held a larger one stays reserved (the "slivers" of
// the allocator's Note [Expandable Segments]; pytorch/pytorch#35901): a job can fail with far less allocated
// than the device holds.
#pragma once

#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace ftplan {

class CachingAllocator {
 public:
  // capacity_bytes: what the process can reserve on the device in all (cudaMalloc fails beyond it).
  explicit CachingAllocator(int64_t capacity_bytes);

  // A handle to the block, or -1 when the request fails after releasing the cache (the out-of-memory error).
  int64_t malloc(int64_t bytes);
  void free(int64_t handle);

  int64_t allocated_bytes() const { return allocated_; }  // torch.cuda.memory_allocated (block sizes)
  int64_t reserved_bytes() const { return reserved_; }    // torch.cuda.memory_reserved (segments)
  int64_t peak_allocated_bytes() const { return peak_allocated_; }
  int64_t peak_reserved_bytes() const { return peak_reserved_; }
  int64_t segments() const { return segments_; }
  void reset_peaks() { peak_allocated_ = allocated_, peak_reserved_ = reserved_; }

  static int64_t round_size(int64_t bytes);       // 512-byte multiples, at least 512
  static int64_t segment_size(int64_t rounded);   // the segment a new request reserves

 private:
  struct Block {
    int64_t size = 0, address = 0;
    int64_t prev = -1, next = -1;  // neighbours in the segment
    bool small = false, allocated = false;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t>;  // size, address, index: best fit, then lowest address
  std::set<Key>& pool(bool small) { return small ? small_pool_ : large_pool_; }
  void insert_free(int64_t i);
  void erase_free(int64_t i);
  void absorb_next(int64_t i);  // block i takes its next neighbour (try_merge_blocks); the neighbour's index is retired
  void release_cached_segments();

  int64_t capacity_ = 0, allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  int64_t segments_ = 0, next_address_ = 0;
  std::vector<Block> blocks_;
  std::set<Key> small_pool_, large_pool_;
};

}  // namespace ftplan
