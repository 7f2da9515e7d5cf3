// The caching allocator's rules against hand-worked sequences (c10/cuda/CUDACachingAllocator.cpp), and the
// step replay against a published log and the failure it exists to predict.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "planner/allocator_replay.h"
#include "planner/caching_allocator.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

using ftplan::CachingAllocator;

namespace {
constexpr int64_t MiB = 1 << 20;
constexpr int64_t GiB = int64_t(1) << 30;
}  // namespace

TEST_CASE("caching allocator: sizes, best fit, split, merge", "[allocator]") {
  SECTION("requests round to 512 B; segments are 2 MiB (small), 20 MiB (under 10 MiB) or the request in 2 MiB steps") {
    CHECK(CachingAllocator::round_size(1) == 512);
    CHECK(CachingAllocator::round_size(513) == 1024);
    CHECK(CachingAllocator::segment_size(CachingAllocator::round_size(1000)) == 2 * MiB);
    CHECK(CachingAllocator::segment_size(5 * MiB) == 20 * MiB);
    CHECK(CachingAllocator::segment_size(11 * MiB + 512) == 12 * MiB);
  }
  CachingAllocator a(10 * GiB);
  const int64_t s100 = a.malloc(100 * MiB), s200 = a.malloc(200 * MiB), s300 = a.malloc(300 * MiB);
  REQUIRE(a.reserved_bytes() == 600 * MiB);
  a.free(s100), a.free(s200), a.free(s300);
  REQUIRE(a.allocated_bytes() == 0);
  REQUIRE(a.reserved_bytes() == 600 * MiB);  // cached, not returned
  SECTION("the smallest cached block that fits, split when more than 1 MiB remains") {
    const int64_t b = a.malloc(150 * MiB);  // the 200 MiB segment: 150 used, 50 MiB left free
    CHECK(a.reserved_bytes() == 600 * MiB);
    CHECK(a.allocated_bytes() == 150 * MiB);
    const int64_t c = a.malloc(50 * MiB);  // exactly the split-off rest: still no new segment
    CHECK(a.reserved_bytes() == 600 * MiB);
    CHECK(a.segments() == 3);
    SECTION("a freed block merges with its free neighbours: the whole 200 MiB serves a 200 MiB request") {
      a.free(b), a.free(c);
      a.malloc(200 * MiB);
      CHECK(a.reserved_bytes() == 600 * MiB);
    }
  }
  SECTION("no split when 1 MiB or less would remain: the request holds the whole block") {
    a.malloc(99 * MiB + 512);
    CHECK(a.allocated_bytes() == 100 * MiB);
  }
  SECTION("no cached block large enough: a new segment") {
    a.malloc(400 * MiB);
    CHECK(a.reserved_bytes() == 1000 * MiB);
    CHECK(a.segments() == 4);
  }
}

TEST_CASE("caching allocator: release before failing, and the fragmentation it cannot undo", "[allocator]") {
  CachingAllocator a(1024 * MiB);
  a.free(a.malloc(600 * MiB));  // a cached, whole segment
  SECTION("a whole cached segment is released when the device has no room, and the request succeeds") {
    CHECK(a.malloc(700 * MiB) >= 0);  // 600 + 700 > 1024: release the 600, then 700 fits
    CHECK(a.reserved_bytes() == 700 * MiB);
  }
  SECTION("a segment split by a live tensor cannot be released (pytorch/pytorch#35901)") {
    // A 10 MiB tensor takes the cached 600 MiB segment (best fit: the only free block), leaving 590 MiB free
    // inside it. A new 600 MiB tensor fits neither that slice nor beside the pinned segment: 10 MiB allocated,
    // 600 requested, 1024 the device, and still out of memory.
    REQUIRE(a.malloc(10 * MiB) >= 0);
    CHECK(a.reserved_bytes() == 600 * MiB);
    CHECK(a.malloc(600 * MiB) == -1);
    CHECK(a.allocated_bytes() == 10 * MiB);
    CHECK(a.reserved_bytes() == 600 * MiB);
  }
}

namespace {

// Liger-Kernel's Hugging Face example: FSDP-1 full_shard on 4 A100 80 GB, bf16 load with --bf16 (accelerate
// upcasts the trainable FlatParameters: amp), every decoder layer checkpointed, transformers 4.43.3 (hf-2024).
ftplan::TrainingSetup liger_setup(const std::string& model_name, int64_t seq_len) {
  ftplan::TrainingSetup s;
  s.framework = "hf-2024";
  s.model = model_name;
  s.method = ftplan::Method::full;
  s.precision = ftplan::Precision::amp;
  s.fsdp_version = 1;
  s.num_gpus = 4;
  s.seq_len = seq_len;
  s.headroom_fraction = 0;
  return s;
}

ftplan::Candidate fsdp_on_4(int64_t micro_batch, ftplan::Checkpointing ckpt = ftplan::Checkpointing::full,
                            ftplan::Strategy strategy = ftplan::Strategy::fsdp) {
  return ftplan::preset_candidate(strategy, 4, ftplan::load_hardware("a100-80gb-sxm"), micro_batch, ckpt,
                                  ftplan::Attention::fused);
}

ftplan::MemoryEstimate liger_example(const std::string& model_name, int64_t micro_batch, int64_t seq_len) {
  return ftplan::estimate_memory(ftplan::load_model(model_name), ftplan::load_hardware("a100-80gb-sxm"),
                                 liger_setup(model_name, seq_len), fsdp_on_4(micro_batch));
}

}  // namespace

TEST_CASE("replay: the step's allocations agree with the memory model and with a published log", "[allocator]") {
  // Liger-Kernel's llama_B_48_no_patching.log (linkedin/Liger-Kernel@4d4d9c6d): Llama-3-8B, batch 48, its top
  // step at 68,349.51 MiB allocated; the memory model's figure matches it at 480 padded tokens (test_memory_model).
  const auto e = liger_example("llama-3-8b", 48, 480);
  REQUIRE(e.replay);
  CHECK_FALSE(e.replay->oom);
  CHECK(e.replay->steps == 3);
  const double published = 68'349.51 * MiB;
  CHECK_THAT(double(e.replay->peak_allocated_bytes), Catch::Matchers::WithinRel(published, 0.05));
  // The same tensors as the memory model's, one at a time: the replay's peak within 5% of its allocated figure.
  CHECK_THAT(double(e.replay->peak_allocated_bytes), Catch::Matchers::WithinRel(double(e.allocated_peak), 0.05));
  // Reserved above allocated: the cache the allocator keeps (the log: 78,662 MiB at that step).
  CHECK(e.replay->peak_reserved_bytes > e.replay->peak_allocated_bytes);
  CHECK(e.replay->peak_reserved_bytes < int64_t(78'662 * MiB));
}

TEST_CASE("replay: fragmentation fails Qwen2-7B at batch 48 where the figures fit", "[allocator]") {
  // Liger-Kernel's examples/huggingface chart (03fd6032): Qwen2-7B fits at batch 32 and runs out of memory at
  // 48 without Liger. The memory model's figure at 48 fits the 79.14 GiB a process can allocate; the replay
  // fails at the second step, once the first step's AdamW states and gradient shards have split the segments
  // the loss's [tokens, vocab] buffers left cached.
  const auto at48 = liger_example("qwen2-7b", 48, 512);
  REQUIRE(at48.replay);
  CHECK(at48.fit_bytes <= at48.usable_bytes);
  CHECK(at48.replay->oom);
  CHECK(at48.replay->failed_step == 2);
  CHECK(at48.replay->allocated_bytes + at48.replay->request_bytes < at48.usable_bytes);
  CHECK_FALSE(at48.fits);
  CHECK_THAT(at48.reason, Catch::Matchers::Contains("fragmentation"));
  const auto at32 = liger_example("qwen2-7b", 32, 512);
  REQUIRE(at32.replay);
  CHECK_FALSE(at32.replay->oom);
  CHECK(at32.fits);
}

TEST_CASE("replay: only the layout it plays", "[allocator]") {
  const auto model = ftplan::load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = liger_setup("llama-3-8b", 512);
  s.framework = "hf";
  auto with = [&](ftplan::Strategy st, ftplan::Checkpointing ck) {
    return ftplan::estimate_memory(model, hw, s, fsdp_on_4(8, ck, st));
  };
  CHECK(with(ftplan::Strategy::fsdp, ftplan::Checkpointing::full).replay);
  CHECK_FALSE(with(ftplan::Strategy::fsdp, ftplan::Checkpointing::none).replay);
  CHECK_FALSE(with(ftplan::Strategy::zero3, ftplan::Checkpointing::full).replay);
  s.fsdp_version = 2;
  CHECK_FALSE(with(ftplan::Strategy::fsdp, ftplan::Checkpointing::full).replay);
  s.framework = "torchtune";  // its own loop: not replayed (runtime.allocator_replay false)
  CHECK_FALSE(with(ftplan::Strategy::fsdp, ftplan::Checkpointing::full).replay);
  // The loss copies the shifted logits before transformers 4.49 only.
  CHECK(ftplan::framework_profile("hf-2024").losses.at(ftplan::Loss::full).shifted_copy);
  CHECK_FALSE(ftplan::framework_profile("hf").losses.at(ftplan::Loss::full).shifted_copy);
}

TEST_CASE("replay: Liger's 20-step Llama-3-8B log, batch lengths as it ran them", "[allocator]") {
  // llama_B_48_no_patching.log (linkedin/Liger-Kernel@4d4d9c6d, FSDP-1 on 4 A100 80 GB, batch 48, Alpaca padded
  // per batch): rank 0's step peaks lie on a lattice of 1,344.29 MiB per 16 padded tokens whose top, 68,349.51 MiB,
  // is 480 tokens (test_framework.cpp), so steps 2-20 ran 336, 288, 480, 336, 192, 224, 160, 208, 208, 224, 144,
  // 160, 320, 176, 256, 256, 384, 160 and 272 tokens; step 1 is not logged (its 4-rank mean is 284). The run
  // finished its 20 steps, its reserved peak stayed 15% above its allocated one (78,662 MiB at step 4), and the
  // allocator had to release its cache at step 19 (reserved fell to 65,804 MiB).
  const auto model = ftplan::load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto s = liger_setup("llama-3-8b", 480);
  const auto c = fsdp_on_4(48);
  const ftplan::PreparedJob job = ftplan::prepare_job(model, hw, s, ftplan::shard_shape(c.parallel));
  auto step = ftplan::replay_step_for(job, c);
  REQUIRE(step);
  const std::vector<int64_t> logged{336, 288, 480, 336, 192, 224, 160, 208, 208, 224, 144, 160, 320, 176, 256, 256, 384, 160, 272};
  const auto& fw = ftplan::framework_profile("hf-2024");
  const int64_t capacity = hw.usable_memory_bytes - fw.cuda_context_bytes - fw.nccl_bytes_per_gpu;
  for (int64_t first : {144, 288, 336, 480}) {  // step 1's length, unknown: any the data reaches
    CAPTURE(first);
    step->step_tokens = {48.0 * double(first)};
    for (int64_t t : logged) step->step_tokens.push_back(48.0 * double(t));
    std::vector<ftplan::ReplayStepPeaks> peaks;
    const auto r = ftplan::replay_steps(*step, capacity, 20, &peaks);
    CHECK_FALSE(r.oom);
    REQUIRE(peaks.size() == 20);
    // Each logged step's allocated peak moves with its length as the log's lattice does, within 5%.
    const double per16 = double(peaks[3].allocated_bytes - peaks[11].allocated_bytes) / MiB / ((480 - 144) / 16);  // steps 4, 12
    CHECK_THAT(per16, Catch::Matchers::WithinRel(1344.29, 0.05));
    // The cache the allocator keeps: reserved above allocated over the run, as logged (15%; replayed 7-21% by
    // step 1's length), and below what the card holds, where the run got by.
    CHECK(double(r.peak_reserved_bytes) >= 1.05 * double(r.peak_allocated_bytes));
    CHECK(r.peak_reserved_bytes <= capacity);
  }
}

TEST_CASE("replay: a tied head's weight gradient has the embedding's shape", "[allocator]") {
  // Llama-3.2-1B ties lm_head to the embedding: the head unit's backward makes the final norm's gradient
  // (2,048 x 2 B) and a 128,256 x 2,048 bf16 one, 4,096 + 525,336,576 B (the memory model's head gradients in
  // test_memory_model.cpp), not the norm's alone.
  const auto model = ftplan::load_model("llama-3.2-1b");
  REQUIRE(model.tie_word_embeddings);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto c = fsdp_on_4(8);
  const auto setup = liger_setup("llama-3.2-1b", 512);
  const ftplan::PreparedJob job = ftplan::prepare_job(model, hw, setup, ftplan::shard_shape(c.parallel));
  const auto step = ftplan::replay_step_for(job, c);
  REQUIRE(step);
  CHECK(step->head_compute_bytes == 4'096.0 + 525'336'576.0);
  CHECK(step->embedding_compute_bytes == 525'336'576.0);
}
