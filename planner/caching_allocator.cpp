#include "planner/caching_allocator.h"

#include <algorithm>
#include <stdexcept>

namespace ftplan {

namespace {
constexpr int64_t kMinBlockSize = 512;          // all sizes are rounded to at least 512 bytes
constexpr int64_t kSmallSize = 1048576;         // largest "small" allocation is 1 MiB
constexpr int64_t kSmallBuffer = 2097152;       // "small" allocations are packed in 2 MiB blocks
constexpr int64_t kLargeBuffer = 20971520;      // allocations between 1 and 10 MiB may use 20 MiB blocks
constexpr int64_t kMinLargeAlloc = 10485760;
constexpr int64_t kRoundLarge = 2097152;        // large allocations are rounded up to 2 MiB
}  // namespace

CachingAllocator::CachingAllocator(int64_t capacity_bytes) : capacity_(capacity_bytes) { blocks_.reserve(4096); }

int64_t CachingAllocator::round_size(int64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

int64_t CachingAllocator::segment_size(int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

void CachingAllocator::insert_free(int64_t i) {
  const Block& b = blocks_[i];
  pool(b.small).insert({b.size, b.address, i});
}

void CachingAllocator::erase_free(int64_t i) {
  const Block& b = blocks_[i];
  pool(b.small).erase({b.size, b.address, i});
}

void CachingAllocator::absorb_next(int64_t i) {
  const int64_t next = blocks_[i].next;
  blocks_[i].size += blocks_[next].size;
  blocks_[i].next = blocks_[next].next;
  if (blocks_[i].next >= 0) blocks_[blocks_[i].next].prev = i;
}

void CachingAllocator::release_cached_segments() {
  for (bool small : {true, false}) {
    auto& p = pool(small);
    for (auto it = p.begin(); it != p.end();) {
      const Block& b = blocks_[std::get<2>(*it)];
      if (b.prev < 0 && b.next < 0) {
        reserved_ -= b.size;
        --segments_;
        it = p.erase(it);
      } else {
        ++it;
      }
    }
  }
}

int64_t CachingAllocator::malloc(int64_t bytes) {
  const int64_t size = round_size(std::max<int64_t>(bytes, 0));
  const bool small = size <= kSmallSize;
  auto& p = pool(small);
  int64_t i = -1;
  auto it = p.lower_bound({size, -1, -1});
  if (it != p.end()) {
    i = std::get<2>(*it);
    p.erase(it);
  } else {
    const int64_t segment = segment_size(size);
    if (reserved_ + segment > capacity_) {
      release_cached_segments();
      if (reserved_ + segment > capacity_) return -1;
    }
    reserved_ += segment;
    ++segments_;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    Block b;
    b.size = segment;
    b.address = next_address_;
    b.small = small;
    next_address_ += segment;
    blocks_.push_back(b);
    i = static_cast<int64_t>(blocks_.size()) - 1;
  }
  const int64_t remaining = blocks_[i].size - size;
  if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    Block rest;
    rest.size = remaining;
    rest.address = blocks_[i].address + size;
    rest.small = small;
    rest.prev = i;
    rest.next = blocks_[i].next;
    blocks_.push_back(rest);
    const int64_t r = static_cast<int64_t>(blocks_.size()) - 1;
    if (blocks_[r].next >= 0) blocks_[blocks_[r].next].prev = r;
    blocks_[i].next = r;
    blocks_[i].size = size;
    insert_free(r);
  }
  blocks_[i].allocated = true;
  allocated_ += blocks_[i].size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return i;
}

void CachingAllocator::free(int64_t handle) {
  if (handle < 0 || handle >= static_cast<int64_t>(blocks_.size()) || !blocks_[handle].allocated)
    throw std::logic_error("CachingAllocator::free: not an allocated block");
  int64_t i = handle;
  blocks_[i].allocated = false;
  allocated_ -= blocks_[i].size;
  const int64_t prev = blocks_[i].prev;
  if (prev >= 0 && !blocks_[prev].allocated) {  // [prev i] -> prev
    erase_free(prev);
    absorb_next(prev);
    i = prev;
  }
  const int64_t next = blocks_[i].next;
  if (next >= 0 && !blocks_[next].allocated) {  // [i next] -> i
    erase_free(next);
    absorb_next(i);
  }
  insert_free(i);
}

}  // namespace ftplan
