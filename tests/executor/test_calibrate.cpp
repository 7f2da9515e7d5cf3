// ftexec calibrate against the planner's time model: the attention efficiency and the optimizer
// bandwidth factor it measures must make the planner's attention and optimizer terms reproduce the
// times it measured (same FLOPs, same bytes), or `--calibration` would predict another time than it saw.
#include <ATen/ATen.h>

#include "executor/calibrate.h"
#include "executor/exec_job.h"
#include "executor/torch_compat.h"
#include "executor_test_util.h"
#include "planner/calibration.h"
#include "planner/compute_model.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"

// glog (through LibTorch) defines CHECK too: Catch2 must come last and win.
#undef CHECK
#include <catch2/catch.hpp>

using namespace ftexec;
using Catch::Matchers::WithinRel;
using ftexec_test::tiny_spec;

namespace {

ftplan::TrainingSetup calibrate_setup(ftplan::Attention attention) {
  ftplan::TrainingSetup setup = ftexec_test::activation_memory_setup("tiny-test");
  setup.seq_len = 64;
  setup.micro_batch = 2;
  setup.attention = attention;
  return setup;
}

// The planner's seconds for one layer's attention core (forward + backward) over batch x seq_len tokens
// on `hw`: flops_per_token's executed attention at piece_rates' attention rate.
double planned_attention_s(const ftplan::ModelSpec& m, const ftplan::HardwareSpec& hw, const ftplan::TrainingSetup& setup) {
  const double tokens = double(*setup.micro_batch * setup.seq_len);
  const ftplan::FlopsPerToken f = ftplan::flops_per_token(m, setup);
  const ftplan::PieceRates r = ftplan::piece_rates(m, hw, setup, tokens);
  REQUIRE_FALSE(r.uniform);  // the calibrated attention rate is in use
  return 3.0 * f.block_attention_executed * tokens / r.attention;
}

}  // namespace

TEST_CASE("the timed attention's FLOPs are the planner's: S/2 keys where the causal blocks are skipped, S where not", "[calibrate]") {
  const ftplan::ModelSpec m = tiny_spec();
  REQUIRE(m.num_sliding_layers() == 0);
  REQUIRE(m.q_dim() == 64);
  // By hand: forward 4 · keys · q_dim per query, backward twice that; 2 rows of 64 tokens, q_dim 64.
  CHECK(timed_attention_flops(m, 2, 64, false) == 3.0 * 4 * 64 * 64 * 2 * 64);  // 3,145,728
  CHECK(timed_attention_flops(m, 2, 64, true) == 3.0 * 4 * 32 * 64 * 2 * 64);   // 1,572,864
  // And the planner's own count: fused causal (executed), eager (every block).
  for (const auto attention : {ftplan::Attention::fused, ftplan::Attention::eager}) {
    const ftplan::TrainingSetup setup = calibrate_setup(attention);
    const ftplan::FlopsPerToken f = ftplan::flops_per_token(m, setup);
    CAPTURE(ftplan::to_string(attention));
    CHECK(timed_attention_flops(m, 2, 64, attention == ftplan::Attention::fused) == 3.0 * f.block_attention_executed * 2 * 64);
  }
}

TEST_CASE("the calibrated attention efficiency makes the planner's attention term reproduce the measured time", "[calibrate]") {
  const ftplan::HardwareSpec hw = ftplan::load_hardware("cpu");
  for (const auto attention : {ftplan::Attention::eager, ftplan::Attention::fused}) {
    const ftplan::TrainingSetup setup = calibrate_setup(attention);
    ExecJob job = make_exec_job(setup, "cpu");
    const AttentionTiming a = time_attention(job, ftplan::peak_flops(hw, setup.precision));
    CAPTURE(ftplan::to_string(attention), a.fused, a.causal_blocks_skipped, a.time_s, a.efficiency, compat::torch_version());
    CHECK(a.fused == (attention == ftplan::Attention::fused && compat::kHasSdpa));
    CHECK(a.causal_blocks_skipped == (a.fused && compat::sdpa_causal_skips_blocks(false)));
    CHECK(a.executed_flops == timed_attention_flops(job.model, 2, 64, a.causal_blocks_skipped));
    REQUIRE(a.efficiency > 1e-4);
    REQUIRE(a.efficiency < 1.0);
    ftplan::Calibration c = ftplan::default_calibration(hw, "fp32");
    c.attention_efficiency = a.efficiency;
    const ftplan::HardwareSpec calibrated = ftplan::apply_calibration(hw, c, "test");
    // The kernel ftexec ran is the one the planner times for this job where they agree on it: eager, or
    // fused with the causal skip. (libtorch 1.13 has no SDPA: ftexec runs eager for a fused job, and the
    // planner, which times the fused kernel at S/2 keys, then predicts half the eager time.)
    if (attention == ftplan::Attention::eager || a.causal_blocks_skipped) {
      CHECK_THAT(planned_attention_s(job.model, calibrated, setup), WithinRel(a.time_s, 1e-9));
    } else {
      ftplan::TrainingSetup eager = setup;
      eager.attention = ftplan::Attention::eager;
      CHECK_THAT(planned_attention_s(job.model, calibrated, eager), WithinRel(a.time_s, 1e-9));
    }
  }
}

TEST_CASE("the calibrated optimizer factor makes the planner's optimizer term reproduce ftexec's AdamW step", "[calibrate]") {
  const ftplan::HardwareSpec hw = ftplan::load_hardware("cpu");
  const ftplan::TrainingSetup setup = calibrate_setup(ftplan::Attention::eager);  // fp32
  ExecJob job = make_exec_job(setup, "cpu");
  const OptimizerTiming o = time_optimizer(job, hw);
  CAPTURE(o.params, o.time_s, o.bytes_per_param, o.factor);
  // ftexec's profile says foreach; fp32 foreach AdamW by hand (compute_model.h): 4P + 3G + 14S at 4 B each.
  CHECK(o.foreach);
  CHECK(o.bytes_per_param == 4 * 4 + 3 * 4 + 14 * 4);  // 84 B, not the 28 B of before
  CHECK(o.params == (INT64_C(8) << 20));                // beyond the caches, whatever the model
  REQUIRE(o.factor > 1e-3);
  REQUIRE(o.factor < 4.0);
  ftplan::Calibration c = ftplan::default_calibration(hw, "fp32");
  c.optimizer_bandwidth_factor = o.factor;
  const ftplan::HardwareSpec calibrated = ftplan::apply_calibration(hw, c, "test");
  const double bytes = ftplan::optimizer_step_bytes_per_param(
      setup.precision, setup.optimizer, ftplan::framework_profile(setup.framework).optimizer_foreach);
  CHECK_THAT(ftplan::optimizer_step_time_s(double(o.params), calibrated, bytes), WithinRel(o.time_s, 1e-9));
}
