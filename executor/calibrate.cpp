#include "executor/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include "executor/comm.h"
#include "executor/torch_compat.h"
#include "executor/trainer.h"
#include "planner/calibration.h"
#include "planner/collectives.h"
#include "planner/compute_model.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"

namespace ftexec {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds of `fn`: the fastest of the repeats (one warm-up call, then repeats until `budget_s` has
// passed, at least 3, at most 50): on a machine shared with other work the minimum is the estimate
// least disturbed by it.
double time_best_s(const std::function<void()>& fn, bool cuda, double budget_s = 0.3) {
  fn();
  if (cuda) compat::cuda_synchronize();
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 3 || (times.size() < 50 && std::chrono::duration<double>(Clock::now() - start).count() < budget_s)) {
    const auto t0 = Clock::now();
    fn();
    if (cuda) compat::cuda_synchronize();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return *std::min_element(times.begin(), times.end());
}

}  // namespace

double timed_attention_flops(const ftplan::ModelSpec& m, int64_t batch, int64_t seq_len, bool causal_blocks_skipped) {
  // Forward 4·keys·q_dim per query (QK^T and P·V), backward twice that; the keys a query runs: all S where
  // the kernel computes the whole masked S x S, the causal mean S / 2 where it skips the blocks above the
  // diagonal (planner/compute_model.cpp flops_per_token's causal_keys at an unbounded window: S - S^2 / (2 S)).
  const double S = double(seq_len);
  const double keys = causal_blocks_skipped ? S - S * S / (2.0 * S) : S;
  return 3.0 * 4.0 * keys * double(m.q_dim()) * double(batch) * S;
}

AttentionTiming time_attention(const ExecJob& job, double peak_flops) {
  const ftplan::TrainingSetup& s = job.setup;
  const ftplan::ModelSpec& m = job.model;
  const bool cuda = job.device.rfind("cuda", 0) == 0;
  const at::ScalarType dtype = s.precision == ftplan::Precision::fp32 ? at::kFloat : at::kBFloat16;
  const auto opts = at::TensorOptions().dtype(dtype).device(at::Device(job.device));
  at::AutoGradMode grad(true);
  AttentionTiming a;
  a.batch = std::max<int64_t>(1, s.micro_batch.value_or(1));
  const int64_t B = a.batch, S = s.seq_len, H = m.num_heads, d = m.head_dim;
  at::Tensor q = at::randn({B, H, S, d}, opts).requires_grad_(true);
  at::Tensor k = at::randn({B, H, S, d}, opts).requires_grad_(true);
  at::Tensor v = at::randn({B, H, S, d}, opts).requires_grad_(true);
  const double scale = 1.0 / std::sqrt(double(d));
  // ftexec runs SDPA where the job asks for fused attention and the libtorch has it, eager otherwise
  // (dist_run.cpp: use_sdpa).
  a.fused = s.attention.value_or(ftplan::Attention::eager) == ftplan::Attention::fused && compat::kHasSdpa;
  a.causal_blocks_skipped = a.fused && compat::sdpa_causal_skips_blocks(cuda);
  at::Tensor mask = at::ones({S, S}, at::TensorOptions().dtype(at::kBool)).triu(1).to(at::Device(job.device));
  a.time_s = time_best_s(
      [&] {
        at::Tensor out;
        if (a.fused) {
          out = compat::sdpa_causal(q, k, v, scale);
        } else {
          at::Tensor scores = at::matmul(q, k.transpose(2, 3));
          scores = scores.mul(scale).masked_fill(mask, -std::numeric_limits<double>::infinity());
          out = at::matmul(at::softmax(scores, -1, at::kFloat).to(dtype), v);
        }
        torch::autograd::backward({out}, {at::ones_like(out)});
        q.mutable_grad().reset(), k.mutable_grad().reset(), v.mutable_grad().reset();
      },
      cuda, 0.5);
  // Against the FLOPs the planner times this kernel at, so that its attention term reproduces the time:
  // the executed ones where the kernel skips the causal blocks, the whole S x S where it does not.
  a.executed_flops = timed_attention_flops(m, B, S, a.causal_blocks_skipped);
  a.efficiency = std::clamp(a.executed_flops / a.time_s / peak_flops, 1e-4, 1.0);
  return a;
}

OptimizerTiming time_optimizer(const ExecJob& job, const ftplan::HardwareSpec& hw) {
  const ftplan::TrainingSetup& s = job.setup;
  const bool cuda = job.device.rfind("cuda", 0) == 0;
  const at::ScalarType dtype = s.precision == ftplan::Precision::fp32 ? at::kFloat : at::kBFloat16;
  const auto opts = at::TensorOptions().dtype(dtype).device(at::Device(job.device));
  at::NoGradGuard no_grad;
  OptimizerTiming o;
  // 8M parameters whatever the model: p, g, m and v alone are 128 MB in fp32, beyond a CPU's last-level cache
  // and a GPU's L2, so the pass streams memory as a model's step does (a small model's 1M parameters stayed
  // in a CPU's cache and ran faster than its DRAM: 130 GB/s against 84 B per parameter here).
  o.params = INT64_C(8) << 20;
  at::Tensor p = at::randn({o.params}, opts);
  p.mutable_grad() = at::randn({o.params}, opts);
  AdamW adam({p}, AdamWOptions{}, s.precision == ftplan::Precision::mixed);
  o.time_s = time_best_s([&] { adam.step(); }, cuda, 0.5);
  // The bytes the planner moves per parameter for this step (planner/compute_model.h
  // optimizer_step_bytes_per_param, at ftexec's profile's optimizer.implementation), so that its optimizer
  // term at the fitted bandwidth factor reproduces the time.
  o.foreach = ftplan::framework_profile("ftexec").optimizer_foreach;
  o.bytes_per_param = ftplan::optimizer_step_bytes_per_param(s.precision, ftplan::Optimizer::adamw, o.foreach);
  o.factor = std::clamp(o.bytes_per_param * double(o.params) / o.time_s / hw.hbm_bandwidth_bytes_per_s, 1e-3, 4.0);
  return o;
}

nlohmann::json calibrate_device(const ExecJob& job, const std::string& hw_id, Comm& comm) {
  const ftplan::HardwareSpec hw = ftplan::load_hardware(hw_id);
  const ftplan::TrainingSetup& s = job.setup;
  const ftplan::ModelSpec& m = job.model;
  const double peak = ftplan::peak_flops(hw, s.precision);
  if (!(peak > 0)) ftplan::fail_input("--gpu: hwdb entry " + hw_id + " has no peak FLOP/s for precision " + ftplan::to_string(s.precision));
  const bool cuda = job.device.rfind("cuda", 0) == 0;
  const at::ScalarType dtype = s.precision == ftplan::Precision::fp32 ? at::kFloat : at::kBFloat16;
  const auto opts = at::TensorOptions().dtype(dtype).device(at::Device(job.device));
  nlohmann::json details = nlohmann::json::object();
  ftplan::Calibration c;
  c.device = hw_id;
  c.precision = ftplan::to_string(s.precision);
  c.method = "measured";

  // Collectives per group size (2, 4, ... and the world): ranks 0..g-1 all-reduce (reduce-scatter then
  // all-gather rings, as FSDP's and the planner's), the others wait; t = latency · ring steps + wire
  // bytes / bandwidth (collectives.h) fitted by least squares per size. The calibration takes the
  // largest group's (the one the hwdb's intra-node figure is for).
  if (comm.world() > 1) {
    std::vector<int> sizes;
    for (int g = 2; g < comm.world(); g *= 2) sizes.push_back(g);
    sizes.push_back(comm.world());
    nlohmann::json per_size = nlohmann::json::array();
    for (int n : sizes) {
      RankGroup group;
      for (int r = 0; r < n; ++r) group.push_back(r);
      const bool member = comm.rank() < n;
      std::vector<double> xs_steps, xs_wire, ys;
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t bytes = 4096; bytes <= (INT64_C(16) << 20); bytes *= 4) {
        at::Tensor t = at::ones({bytes / 4}, at::TensorOptions().dtype(at::kFloat).device(at::Device(job.device)));
        comm.barrier();
        // A fixed number of repeats: every member must run the same collectives (a time budget would
        // let the ranks' counts differ and leave one waiting).
        double sec = 0;
        if (member) {
          comm.all_reduce_ring(t, 0, group);  // warm-up
          if (cuda) compat::cuda_synchronize();
          sec = std::numeric_limits<double>::infinity();
          for (int rep = 0; rep < 5; ++rep) {
            const auto t0 = Clock::now();
            comm.all_reduce_ring(t, 0, group);
            if (cuda) compat::cuda_synchronize();
            sec = std::min(sec, std::chrono::duration<double>(Clock::now() - t0).count());
          }
        }
        const double secs = comm.all_reduce_scalar(sec, true);  // the slowest member's
        const double wire = ftplan::wire_bytes(ftplan::Collective::all_reduce, double(bytes), n);
        xs_steps.push_back(2.0 * (n - 1));
        xs_wire.push_back(wire);
        ys.push_back(secs);
        rows.push_back({{"bytes", bytes}, {"time_s", secs}, {"wire_bytes", wire}});
      }
      // Least squares of y = a·steps + b·wire (a = latency, b = 1 / bandwidth); steps are equal within a
      // size, so a is the intercept of y against wire bytes.
      const double k = double(ys.size());
      double sx = 0, sy = 0, sxx = 0, sxy = 0;
      for (size_t i = 0; i < ys.size(); ++i) sx += xs_wire[i], sy += ys[i], sxx += xs_wire[i] * xs_wire[i], sxy += xs_wire[i] * ys[i];
      double inv_bw = (k * sxy - sx * sy) / (k * sxx - sx * sx);
      if (!(inv_bw > 0)) inv_bw = ys.back() / xs_wire.back();
      const double latency = std::clamp((sy - inv_bw * sx) / k / xs_steps[0], 1e-8, 0.1);
      const double bw = 1.0 / inv_bw;
      const ftplan::Interconnect net = ftplan::group_interconnect(hw, n, 1, n);
      per_size.push_back({{"ranks", n}, {"rows", rows}, {"bandwidth_bytes_per_s", bw},
                          {"hwdb_bandwidth_bytes_per_s", net.intra_bandwidth_bytes_per_s}, {"latency_s", latency}});
      if (n == comm.world()) {
        c.intra_node_bandwidth_factor = std::clamp(bw / net.intra_bandwidth_bytes_per_s, 1e-3, 4.0);
        c.comm_latency_s = latency;
      }
    }
    c.determined.push_back("link_bandwidth_factor.intra_node");
    c.determined.push_back("comm_latency_s");
    details["all_reduce"] = {{"per_group_size", per_size}, {"backend", cuda ? "nccl" : "gloo"}};
  } else {
    details["all_reduce"] = "not measured: one process (give --nproc N for collectives)";
  }
  // The compute alone on rank 0, after the collectives: the other ranks are done (none waits in a
  // collective that could time out while rank 0 measures).
  if (comm.rank() != 0) return nullptr;
  {
    at::NoGradGuard no_grad;
    // GEMMs: (smallest dimension, efficiency) points.
    std::vector<std::pair<double, double>> points;
    nlohmann::json gemms = nlohmann::json::array();
    auto time_gemm = [&](int64_t rows, int64_t k, int64_t n, const std::string& what) {
      at::Tensor a = at::randn({rows, k}, opts), b = at::randn({k, n}, opts);
      const double t = time_best_s([&] { (void)at::mm(a, b); }, cuda);
      const double e = 2.0 * double(rows) * double(k) * double(n) / t / peak;
      const double dim = double(std::min({rows, k, n}));
      points.emplace_back(dim, e);
      gemms.push_back({{"what", what}, {"m", rows}, {"k", k}, {"n", n}, {"time_s", t}, {"efficiency", e}});
      return t;
    };
    const int64_t rows = std::max<int64_t>(1, s.micro_batch.value_or(1)) * s.seq_len;
    for (const auto& lin : ftplan::block_linears(m)) {
      time_gemm(rows, lin.in_features, lin.out_features, lin.name + " forward");
      time_gemm(rows, lin.out_features, lin.in_features, lin.name + " input gradient");
      time_gemm(lin.out_features, rows, lin.in_features, lin.name + " weight gradient");
      if (s.method != ftplan::Method::full &&
          std::find(s.lora.targets.begin(), s.lora.targets.end(), lin.name) != s.lora.targets.end()) {
        time_gemm(rows, lin.in_features, s.lora.rank, lin.name + " lora_A");
        time_gemm(rows, s.lora.rank, lin.out_features, lin.name + " lora_B");
      }
    }
    time_gemm(rows, m.hidden_size, m.vocab_size, "lm_head forward");
    // Thin GEMMs (a LoRA rank's), and squares.
    for (int64_t r : {8, 16, 32}) time_gemm(rows, m.hidden_size, r, "thin " + std::to_string(r));
    for (int64_t d : {64, 128, 256, 512, 1024, 2048}) {
      const double t = time_gemm(d, d, d, "square " + std::to_string(d));
      if (d == 2048 && t < 0.2) time_gemm(4096, 4096, 4096, "square 4096");
    }
    c.gemm_efficiency = ftplan::fit_gemm_anchors(points);
    details["gemm"] = gemms;

    // Attention core, forward + backward, as the model runs it.
    {
      const AttentionTiming a = time_attention(job, peak);
      c.attention_efficiency = a.efficiency;
      details["attention"] = {{"batch", a.batch}, {"heads", m.num_heads}, {"seq_len", s.seq_len}, {"head_dim", m.head_dim},
                              {"fused", a.fused}, {"causal_blocks_skipped", a.causal_blocks_skipped},
                              {"executed_flops", a.executed_flops}, {"time_s", a.time_s}, {"efficiency", a.efficiency}};
    }

    // ftexec's AdamW step.
    {
      const OptimizerTiming o = time_optimizer(job, hw);
      c.optimizer_bandwidth_factor = o.factor;
      details["optimizer"] = {{"params", o.params}, {"time_s", o.time_s}, {"bytes_per_param", o.bytes_per_param},
                              {"implementation", o.foreach ? "foreach" : "fused"},
                              {"bytes_per_s", o.bytes_per_param * double(o.params) / o.time_s}, {"factor", o.factor}};
    }
    c.determined.insert(c.determined.begin(), {"gemm_efficiency.16", "gemm_efficiency.64", "gemm_efficiency.512",
                                               "gemm_efficiency.4096", "attention_efficiency", "optimizer_bandwidth_factor"});
  }
  details["device"] = job.device;
  details["threads"] = at::get_num_threads();
  details["torch_version"] = compat::torch_version();
  details["model"] = job.setup.model;
  details["peak_flops"] = peak;
  c.details = details;
  return ftplan::calibration_to_json(c);
}

nlohmann::json calibrate_rank(const ExecJob& job, const std::string& hw_id, const DistEnv& env, double timeout_s,
                              const std::string& backend) {
  set_rank_threads(job.threads, env);
  const bool cuda = job.device.rfind("cuda", 0) == 0;
  std::unique_ptr<Comm> comm = Comm::connect(comm_options(env, timeout_s, resolve_backend(backend, cuda)));
  return calibrate_device(job, hw_id, *comm);
}

}  // namespace ftexec
