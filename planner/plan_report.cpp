#include "planner/plan_report.h"

#include <iomanip>
#include <sstream>

#include "planner/format.h"

namespace ftplan {
namespace {

nlohmann::json job_value(bool has_job, double value) { return has_job ? nlohmann::json(value) : nlohmann::json(nullptr); }

}  // namespace

nlohmann::json ranked_candidate_json(const RankedCandidate& c) {
  return {{"name", c.candidate.name},
          {"parallel", parallelism_json(c.candidate.parallel)},
          {"micro_batch", c.candidate.micro_batch},
          {"checkpointing", to_string(c.candidate.checkpointing)},
          {"activation_offload", c.candidate.activation_offload},
          {"attention", to_string(c.candidate.attention)},
          {"gpus_used", c.gpus_used},
          {"fits", c.memory.fits},
          {"memory_per_gpu_bytes", memory_breakdown_json(c.memory)},
          {"host_memory_per_node_bytes", c.memory.host_per_node},
          {"host_memory_per_gpu_bytes", c.memory.per_gpu.host},
          {"step_time_s", c.step.step_time_s},
          {"compute_s", c.step.compute_s},
          {"exposed_comm_s", c.step.exposed_comm_s},
          {"comm_s", c.step.comm_s},
          {"bubble_fraction", c.step.bubble_fraction},
          {"optimizer_s", c.step.optimizer_s},
          {"tokens_per_step", c.step.tokens_per_step},
          {"tokens_per_s", c.step.tokens_per_s},
          {"mfu", c.step.mfu},
          {"comm_bytes_per_step", c.step.comm_bytes_per_step},
          {"comm_bytes_per_group",
           {{"tp", c.step.comm_bytes_per_group.tp},
            {"cp", c.step.comm_bytes_per_group.cp},
            {"ep", c.step.comm_bytes_per_group.ep},
            {"pp", c.step.comm_bytes_per_group.pp},
            {"dp", c.step.comm_bytes_per_group.dp}}},
          {"job_time_s", job_value(c.has_job, c.job_time_s)},
          {"gpu_hours", job_value(c.has_job, c.gpu_hours)},
          {"cost_usd", job_value(c.has_job, c.cost_usd)},
          {"cost_usd_per_million_tokens", c.cost_usd_per_million_tokens}};
}

std::vector<std::string> step_assumptions(const PlanContext& ctx, const TrainingSetup& setup) {
  const HardwareSpec& hw = *ctx.memory.hw;
  std::vector<std::string> lines;
  std::ostringstream eff;
  eff << "compute: " << format_fixed(ctx.peak_flops / 1e12, 1) << " TFLOP/s peak ("
      << (setup.precision == Precision::fp32 ? "fp32" : "bf16") << ") x efficiency "
      << format_fixed(ctx.efficiency, 2) << (setup.efficiency ? " (--efficiency)" : " (hwdb matmul_efficiency)");
  if (!setup.efficiency && hw.efficiency.source.empty()) {
    const std::vector<double> a = hwdb_gemm_anchors(hw, setup.precision, ctx.efficiency);
    if (!a.empty())
      eff << ", each GEMM scaled by its shape's measured efficiency relative to the largest (hwdb gemm_efficiency): "
          << format_fixed(a[0], 3) << " / " << format_fixed(a[1], 3) << " / " << format_fixed(a[2], 3) << " / "
          << format_fixed(a[3], 3) << " at smallest dimension 16 / 64 / 512 / 4096";
  }
  eff
      << "; FLOPs: 2/weight/token forward, backward 2x (trained) or 1x (frozen), attention 4*S*q_dim per layer"
      << (ctx.flops.block_attention_executed < ctx.flops.block_attention
              ? " (MFU; timed at the " + format_fixed(100.0 * ctx.flops.block_attention_executed / ctx.flops.block_attention, 0) +
                    "% a fused causal kernel runs)"
              : std::string(""))
      << "; optimizer step " << format_fixed(optimizer_step_bytes_per_param(setup.precision, setup.optimizer,
                                                                             ctx.memory.framework->optimizer_foreach,
                                                                             setup.paged_optimizer), 0)
      << " B per trainable parameter at HBM bandwidth ("
      << (setup.paged_optimizer ? "bitsandbytes' paged kernel" : ctx.memory.framework->optimizer_foreach ? "foreach" : "fused") << ")";
  if (setup.paged_optimizer)
    eff << "; paged optimizer states that do not fit beside the step's peak cross the host link twice per step ("
       << format_fixed(hw.pcie_host_bandwidth_bytes_per_s / 1e9, 1) << " GB/s; the UVM driver evicts first in, first out)";
  if (!hw.efficiency.source.empty()) {
    const EfficiencyModel& e = hw.efficiency;
    if (setup.efficiency) {
      eff << "; calibration " << e.source << " not used for compute (--efficiency given)";
    } else {
      eff << "; calibrated by " << e.source << ": GEMM efficiency";
      if (e.gemm.size() == size_t(kGemmAnchors))
        eff << " " << format_fixed(e.gemm[0], 3) << " / " << format_fixed(e.gemm[1], 3) << " / " << format_fixed(e.gemm[2], 3)
            << " / " << format_fixed(e.gemm[3], 3) << " at smallest dimension 16 / 64 / 512 / 4096";
      else
        eff << " hwdb's";
      eff << ", attention " << (e.attention ? format_fixed(*e.attention, 3) : std::string("hwdb's"))
          << ", optimizer bandwidth x" << format_fixed(e.optimizer_bandwidth_factor, 3);
    }
  }
  lines.push_back(eff.str());
  std::ostringstream net;
  net << "network: " << ctx.net.nodes << " node(s) x " << ctx.net.gpus_per_node << " GPU(s); ring "
      << format_fixed(ctx.net.intra_bandwidth_bytes_per_s / 1e9, 1) << " GB/s per GPU";
  if (!ctx.net.intra_bottleneck.empty()) net << " (bottleneck " << ctx.net.intra_bottleneck << ")";
  if (ctx.net.nodes > 1) net << ", inter-node " << format_fixed(ctx.net.inter_bandwidth_bytes_per_s / 1e9, 1) << " GB/s per GPU";
  net << ", latency " << hw.comm_latency_s * 1e6 << " us per ring step";
  if (hw.pcie_slot_given.stated())
    net << "; PCIe link " << hw.pcie_link.to_string() << " (the card's " << hw.pcie_slot.to_string() << " in "
        << hw.pcie_slot_given.to_string() << " slots, --pcie-slot): hwdb's PCIe figures, written for the card's own link, x"
        << format_fixed(hw.pcie_link.bandwidth_bytes_per_s() / hw.pcie_slot.bandwidth_bytes_per_s(), 3)
        << " (host copies " << format_fixed(hw.pcie_host_bandwidth_bytes_per_s / 1e9, 1) << " GB/s)";
  if (!hw.efficiency.source.empty()) net << " (bandwidths and latency as calibrated by " << hw.efficiency.source << ")";
  lines.push_back(net.str());
  lines.push_back("overlap: DDP and ZeRO-1/2 gradient reduction hides behind backward except the last 25 MiB "
                  "bucket; ZeRO-3/FSDP gathers prefetch behind compute except the first layer's; ZeRO parameter "
                  "all-gather after the optimizer and pipeline sends are exposed");
  lines.push_back("gradient accumulation: DDP and ZeRO-1 reduce once per optimizer step, ZeRO-2/3 and FSDP every micro-batch");
  const ModelSpec& model = *ctx.memory.model;
  if (model.moe.active()) {
    const FrameworkProfile& fw = *ctx.memory.framework;
    std::ostringstream moe;
    moe << "mixture of experts: FLOPs from the active parameters (" << model.moe.top_k << " of " << model.moe.num_experts
        << " experts per token, the router" << (model.moe.shared_intermediate_size ? ", the shared expert" : "") << ")";
    if (setup.moe.capacity_factor)
      moe << "; capacity-limited routing: every expert computes its padded capacity (" << format_fixed(*setup.moe.capacity_factor, 2)
          << " x balanced)";
    else
      moe << "; dropless routing: under expert parallelism the busiest rank computes " << format_fixed(setup.moe.imbalance_factor, 2)
          << " x the balanced tokens" << (setup.given.count("moe.imbalance_factor") ? "" : " (balanced; --moe-imbalance-factor)");
    moe << "; expert parallelism: an all-to-all dispatch and combine per MoE block, forward and backward, "
        << (fw.expert_parallel_overlap ? "overlapped with the experts' compute" : "exposed (not overlapped)") << " under "
        << fw.name << (fw.offers_expert_parallel ? "" : ", which has no expert parallelism");
    lines.push_back(moe.str());
  }
  std::ostringstream price;
  price << "price: " << format_fixed(gpu_hour_price_usd(hw, setup), 2) << " USD per GPU-hour";
  if (setup.price_per_gpu_hour)
    price << " (--price-per-gpu-hour; hwdb " << hw.id << ": " << format_fixed(hw.price_usd_per_gpu_hour, 2) << ")";
  else
    price << " (hwdb " << hw.id << ", indicative on-demand, read " << hw.price_date << "; --price-per-gpu-hour to use yours)";
  lines.push_back(price.str());
  const int64_t tokens = job_tokens(setup);
  if (tokens > 0)
    lines.push_back("job: " + format_count(tokens) + " tokens (" +
                    (setup.dataset.tokens ? std::string("dataset tokens") :
                     format_count(setup.dataset.rows) + " rows x " +
                         format_count(setup.dataset.mean_tokens_per_row ? setup.dataset.mean_tokens_per_row : setup.seq_len) +
                         " tokens") +
                    " x " + std::to_string(setup.epochs) + " epoch(s))");
  else
    lines.push_back("job: no dataset given (--dataset-rows or --dataset-tokens): ranked by tokens/s, no job time or cost");
  return lines;
}

nlohmann::json plan_report_json(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                                const PlanResult& plan) {
  const TrainableParams params = trainable_params(model, setup);
  nlohmann::json j;
  j["model"] = model_json(model, params);
  j["gpu"] = {{"id", hw.id}, {"name", hw.name}, {"memory_bytes", hw.memory_bytes},
              {"price_usd_per_gpu_hour", gpu_hour_price_usd(hw, setup)},
              {"price_source", setup.price_per_gpu_hour ? "--price-per-gpu-hour" : "hwdb"},
              {"hwdb_price_usd_per_gpu_hour", hw.price_usd_per_gpu_hour},
              {"hwdb_price_date", hw.price_date}};
  if (hw.pcie_slot.stated()) {
    j["gpu"]["pcie_slot"] = (hw.pcie_slot_given.stated() ? hw.pcie_slot_given : hw.pcie_slot).key();  // the slot
    j["gpu"]["pcie_link"] = hw.pcie_link.key();          // the link it trains at, which is planned
    j["gpu"]["hwdb_pcie_slot"] = hw.pcie_slot.key();     // the card's own
    j["gpu"]["pcie_host_bandwidth_bytes_per_s"] = hw.pcie_host_bandwidth_bytes_per_s;
  }
  j["gpus"] = setup.num_gpus;
  j["method"] = to_string(setup.method);
  j["objective"] = to_string(plan.objective);
  j["job_tokens"] = job_tokens(setup);
  j["strategies"] = nlohmann::json::array();
  for (const auto& o : plan.strategies) {
    nlohmann::json s = ranked_candidate_json(o.best);
    s["fits"] = o.feasible;
    s["reason"] = o.feasible ? "" : o.best.memory.reason;
    s["verdict"] = o.verdict;
    j["strategies"].push_back(s);
  }
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : plan.candidates) j["candidates"].push_back(ranked_candidate_json(c));
  j["evaluated"] = plan.evaluated;
  if (plan.recommended) {
    // The recommended job as the plan file holds it: what `ftplan export` reads.
    j["job"] = plan_file_json(model, hw, setup, *plan.recommended)["job"];
    j["recommended"] = {{"strategy", plan.recommended->candidate.name},
                        {"parallel", parallelism_json(plan.recommended->candidate.parallel)},
                        {"micro_batch", plan.recommended->candidate.micro_batch},
                        {"checkpointing", to_string(plan.recommended->candidate.checkpointing)},
                        {"activation_offload", plan.recommended->candidate.activation_offload},
                        {"reason", plan.reason},
                        {"knobs", plan.knobs},
                        {"job_time_s", job_value(plan.recommended->has_job, plan.recommended->job_time_s)}};
  } else
    j["recommended"] = {{"strategy", nullptr}, {"reason", plan.reason}};
  j["rule_of_thumb"] = plan.rule_of_thumb;
  auto assumptions = memory_assumptions(model, hw, setup);
  for (auto& line : step_assumptions(prepare_plan(model, hw, setup, setup.num_gpus), setup)) assumptions.push_back(line);
  j["assumptions"] = assumptions;
  return j;
}

std::string plan_report_table(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                              const PlanResult& plan) {
  const TrainableParams params = trainable_params(model, setup);
  std::ostringstream out;
  out << model.name << " (" << format_count(params.total) << " params, "
      << (model.moe.active() ? format_count(count_params(model).active) + " active, " : std::string())
      << format_count(params.trainable) << " trainable), " << to_string(setup.method) << ", " << setup.num_gpus << "x " << hw.name << ", seq "
      << setup.seq_len << ", grad-accum " << setup.grad_accum << ", objective " << to_string(plan.objective) << "\n\n";
  // The strategy column fits the longest name (a composition's, e.g. "tp=2,sp=1,cp=2,dp_shard=8,shard=fsdp").
  int name_w = 20;
  for (const auto& o : plan.strategies) name_w = std::max<int>(name_w, static_cast<int>(o.name.size()) + 2);
  out << std::left << std::setw(name_w) << "strategy" << std::right << std::setw(4) << "mb" << std::setw(10) << "ckpt"
      << std::setw(11) << "mem GiB" << std::setw(10) << "step s" << std::setw(11) << "tokens/s" << std::setw(7)
      << "MFU" << std::setw(11) << "comm GB" << std::setw(18) << "job time" << std::setw(11) << "cost $" << "\n";
  for (const auto& o : plan.strategies) {
    const RankedCandidate& c = o.best;
    out << std::left << std::setw(name_w) << o.name << std::right << std::setw(4) << c.candidate.micro_batch
        << std::setw(10) << to_string(c.candidate.checkpointing) << std::setw(11)
        << format_fixed(c.memory.per_gpu.total / double(1LL << 30), 2);
    if (o.feasible) {
      out << std::setw(10) << format_fixed(c.step.step_time_s, 3) << std::setw(11) << format_fixed(c.step.tokens_per_s, 0)
          << std::setw(7) << format_fixed(c.step.mfu * 100, 1) + "%" << std::setw(11)
          << format_fixed(c.step.comm_bytes_per_step / 1e9, 3) << std::setw(18)
          << (c.has_job ? format_duration(c.job_time_s) : "-") << std::setw(11)
          << (c.has_job ? format_fixed(c.cost_usd, 2) : "-");
    } else {
      out << std::setw(10) << "OOM";
    }
    out << "\n";
  }
  out << "\n";
  if (plan.recommended) {
    const RankedCandidate& w = *plan.recommended;
    out << "recommended: " << w.candidate.name << " on " << w.gpus_used << " GPU(s), micro-batch "
        << w.candidate.micro_batch << ", checkpointing " << to_string(w.candidate.checkpointing)
        << (w.candidate.activation_offload ? ", activation offload" : "") << ": "
        << format_fixed(w.step.step_time_s, 3) << " s/step, " << format_fixed(w.step.tokens_per_s, 0) << " tokens/s";
    if (w.has_job) out << ", job " << format_duration(w.job_time_s) << ", " << format_fixed(w.cost_usd, 2) << " USD";
    out << "\n";
  }
  out << "why: " << plan.reason << "\n";
  if (plan.recommended) out << "knobs: " << plan.knobs << "\n";
  for (const auto& o : plan.strategies)
    if (o.verdict != "recommended") out << "  " << o.name << ": " << o.verdict << "\n";
  out << plan.rule_of_thumb << "\n\nassumptions:\n";
  for (const auto& line : memory_assumptions(model, hw, setup)) out << "  - " << line << "\n";
  for (const auto& line : step_assumptions(prepare_plan(model, hw, setup, setup.num_gpus), setup))
    out << "  - " << line << "\n";
  return out.str();
}

nlohmann::json plan_file_json(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                              const RankedCandidate& chosen) {
  TrainingSetup job = setup;
  // A preset stays a preset (by its name); a composition is written as its --parallel string.
  job.strategy.reset();
  job.parallel.reset();
  job.parallel_text.clear();
  if (const auto preset = preset_of(chosen.candidate.parallel)) {
    job.strategy = *preset;
    for (Strategy s : all_strategies())
      if (to_string(s) == chosen.candidate.name) job.strategy = s;  // fsdp_hybrid on one node stays fsdp_hybrid
  } else {
    job.parallel = chosen.candidate.parallel;
  }
  job.micro_batch = chosen.candidate.micro_batch;
  job.checkpointing = chosen.candidate.checkpointing;
  job.attention = chosen.candidate.attention;
  job.activation_offload = chosen.candidate.activation_offload;
  nlohmann::json predicted = ranked_candidate_json(chosen);
  nlohmann::json j;
  j["format"] = "ftplan-plan/1";
  j["job"] = training_setup_to_json(job);
  j["candidate"] = {{"strategy", chosen.candidate.name},
                    {"parallel", parallelism_json(chosen.candidate.parallel)},
                    {"micro_batch", chosen.candidate.micro_batch},
                    {"checkpointing", to_string(chosen.candidate.checkpointing)},
                    {"attention", to_string(chosen.candidate.attention)},
                    {"activation_offload", chosen.candidate.activation_offload},
                    {"gpus", chosen.gpus_used}};
  j["predicted"] = predicted;
  j["model"] = model_json(model, trainable_params(model, setup));
  j["gpu"] = {{"id", hw.id}, {"memory_bytes", hw.memory_bytes}};
  return j;
}

}  // namespace ftplan
