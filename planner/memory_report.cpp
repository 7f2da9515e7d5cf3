#include "planner/memory_report.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "planner/format.h"

namespace ftplan {

Candidate candidate_from_setup(const TrainingSetup& s, const HardwareSpec& hw, std::optional<Strategy> strategy) {
  const int64_t b = s.micro_batch.value_or(1);
  const Checkpointing ck = s.checkpointing.value_or(Checkpointing::none);
  const Attention at = s.attention.value_or(Attention::fused);
  if (!strategy && s.parallel) return layout_candidate(*s.parallel, b, ck, at, s.activation_offload);
  return preset_candidate(strategy.value_or(s.strategy.value_or(Strategy::single)), s.num_gpus, hw, b, ck, at,
                          s.activation_offload);
}

MemoryReport build_memory_report(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup) {
  MemoryReport r{model, hw, setup, trainable_params(model, setup), candidate_from_setup(setup, hw, Strategy::single),
                 {}, memory_assumptions(model, hw, setup)};
  std::vector<Candidate> layouts;
  if (setup.parallel) {
    layouts = {candidate_from_setup(setup, hw)};
  } else {
    std::vector<Strategy> strategies = applicable_strategies(model, hw, setup);
    if (setup.strategy) strategies = {*setup.strategy};
    for (Strategy s : strategies) layouts.push_back(candidate_from_setup(setup, hw, s));
  }
  for (const Candidate& c : layouts) {
    MemoryReportRow row{estimate_memory(model, hw, setup, c), max_micro_batch(model, hw, setup, c),
                        min_gpus(model, hw, setup, c, 1024)};
    r.rows.push_back(row);
  }
  return r;
}

// The step replayed through the caching allocator (allocator_replay.h), or null where the layout is not replayed.
nlohmann::json allocator_replay_json(const MemoryEstimate& e) {
  if (!e.replay) return nullptr;
  const ReplayResult& r = *e.replay;
  nlohmann::json j{{"steps", r.steps},
                   {"oom", r.oom},
                   {"peak_allocated_bytes", r.peak_allocated_bytes},
                   {"peak_reserved_bytes", r.peak_reserved_bytes}};
  if (r.oom) {
    j["failed_step"] = r.failed_step;
    j["failed_tensor"] = r.failed_tensor;
    j["request_bytes"] = r.request_bytes;
    j["allocated_bytes_at_failure"] = r.allocated_bytes;
    j["reserved_bytes_at_failure"] = r.reserved_bytes;
  }
  return j;
}

nlohmann::json memory_breakdown_json(const MemoryEstimate& e) {
  const MemoryBreakdown& m = e.per_gpu;
  auto phase = [](const PhaseMemory& p) {
    return nlohmann::json{{"device", p.device_bytes}, {"reserved", p.reserved_bytes}, {"host_per_node", p.host_bytes_per_node}};
  };
  return {{"weights", m.weights},         {"gradients", m.gradients}, {"optimizer", m.optimizer},
          {"activations", m.activations}, {"logits_loss", m.logits_loss}, {"temporary", m.temporary},
          {"overhead", m.overhead},       {"total", m.total},
          {"allocated_peak", e.allocated_peak}, {"reserved_peak", e.reserved_peak}, {"device_peak", e.device_peak},
          {"peak_phase", e.peak_phase},   {"peak_moment", e.peak_moment},
          {"phases", {{"load", phase(e.load)}, {"step", phase(e.step)}, {"save", phase(e.save)}}},
          {"allocator_replay", allocator_replay_json(e)}};
}

nlohmann::json model_json(const ModelSpec& model, const TrainableParams& p) {
  const ParamCounts counts = count_params(model);
  return {{"name", model.name},
          {"model_type", model.model_type},
          {"params_total", p.total},
          {"params_active", counts.active},  // dense: every parameter runs for every token (= params_total)
          {"params_vision", counts.vision},
          {"params_trainable", p.trainable},
          {"params_frozen", p.frozen},
          {"params_quantized", p.quantized},
          {"params_per_layer", counts.per_layer},
          {"params_embedding", counts.embedding},
          {"params_lm_head", counts.lm_head},
          {"num_layers", model.num_layers},
          {"hidden_size", model.hidden_size},
          {"vocab_size", model.vocab_size},
          {"sliding_window", model.sliding_window},
          {"sliding_layers", model.num_sliding_layers()},
          {"quantization", model.quantized.active() ? nlohmann::json{{"method", model.quantized.method},
                                                                       {"bits", model.quantized.bits},
                                                                       {"group_size", model.quantized.group_size},
                                                                       {"bytes_per_weight", model.quantized.bytes_per_weight}}
                                                    : nlohmann::json(nullptr)},
          {"moe", model.moe.active() ? nlohmann::json{{"num_experts", model.moe.num_experts},
                                                       {"top_k", model.moe.top_k},
                                                       {"expert_intermediate_size", model.moe.expert_intermediate_size},
                                                       {"shared_intermediate_size", model.moe.shared_intermediate_size},
                                                       {"moe_layers", counts.moe_layers},
                                                       {"params_per_expert", counts.one_expert},
                                                       {"params_routed_experts", counts.moe_layers * counts.experts},
                                                       {"router_aux_loss_coef", model.moe.aux_loss_coef}}
                                     : nlohmann::json(nullptr)},
          {"notes", model.notes}};
}

nlohmann::json memory_report_json(const MemoryReport& r) {
  nlohmann::json j;
  j["model"] = model_json(r.model, r.params);
  j["gpu"] = {{"id", r.hardware.id}, {"name", r.hardware.name}, {"memory_bytes", r.hardware.memory_bytes}};
  j["gpus"] = r.setup.num_gpus;
  j["method"] = to_string(r.setup.method);
  j["precision"] = to_string(r.setup.precision);
  j["optimizer"] = to_string(r.setup.optimizer);
  j["seq_len"] = r.setup.seq_len;
  j["micro_batch"] = r.candidate.micro_batch;
  j["checkpointing"] = to_string(r.candidate.checkpointing);
  j["attention"] = to_string(r.candidate.attention);
  j["strategies"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    const auto& e = row.estimate;
    j["strategies"].push_back({{"name", e.candidate.name},
                               {"parallel", parallelism_json(e.candidate.parallel)},
                               {"gpus_used", e.gpus_used},
                               {"memory_per_gpu_bytes", memory_breakdown_json(e)},
                               {"host_memory_per_node_bytes", e.host_per_node},
                               {"host_usable_bytes", e.host_usable_bytes},
                               {"host_memory_per_gpu_bytes", e.per_gpu.host},
                               {"usable_bytes", e.usable_bytes},
                               {"fits", e.fits},
                               {"reason", e.reason},
                               {"max_micro_batch", row.max_micro_batch},
                               {"min_gpus", row.min_gpus}});
  }
  j["assumptions"] = r.assumptions;
  return j;
}

std::string memory_report_table(const MemoryReport& r) {
  std::ostringstream out;
  out << r.model.name << " (" << format_count(r.params.total) << " params, "
      << (r.model.moe.active() ? format_count(count_params(r.model).active) + " active, " : std::string())
      << format_count(r.params.trainable) << " trainable), " << to_string(r.setup.method) << ", " << r.setup.num_gpus << "x " << r.hardware.name
      << ", seq " << r.setup.seq_len << ", micro-batch " << r.candidate.micro_batch << ", checkpointing "
      << to_string(r.candidate.checkpointing) << ", " << to_string(r.candidate.attention) << " attention\n";
  out << "memory per GPU, GiB (2^30 bytes)\n\n";
  const int label_w = 17;
  std::vector<int> widths;  // each column as wide as its strategy's name
  for (const auto& row : r.rows) widths.push_back(std::max<int>(8, row.estimate.candidate.name.size()) + 2);
  size_t column = 0;
  auto cell = [&](const std::string& s) { out << std::setw(widths[column++ % widths.size()]) << s; };
  out << std::left << std::setw(label_w) << "" << std::right;
  for (const auto& row : r.rows) cell(row.estimate.candidate.name);
  out << "\n";
  auto gib = [](int64_t b) { return format_fixed(b / double(1LL << 30), 2); };
  using Field = int64_t MemoryBreakdown::*;
  const std::pair<const char*, Field> lines[] = {
      {"weights", &MemoryBreakdown::weights},         {"gradients", &MemoryBreakdown::gradients},
      {"optimizer", &MemoryBreakdown::optimizer},     {"activations", &MemoryBreakdown::activations},
      {"logits+loss", &MemoryBreakdown::logits_loss}, {"temporary", &MemoryBreakdown::temporary},
      {"overhead", &MemoryBreakdown::overhead},       {"total", &MemoryBreakdown::total},
      {"host (offload)", &MemoryBreakdown::host}};
  for (const auto& [label, field] : lines) {
    out << std::left << std::setw(label_w) << label << std::right;
    for (const auto& row : r.rows) cell(gib(row.estimate.per_gpu.*field));
    out << "\n";
  }
  // The step's peak as each metric reports it, the load's and save's, when the peak happens, and the node's
  // host memory.
  using EField = int64_t MemoryEstimate::*;
  const std::pair<const char*, EField> figures[] = {{"  allocated (torch)", &MemoryEstimate::allocated_peak},
                                                    {"  reserved (torch)", &MemoryEstimate::reserved_peak},
                                                    {"  device (smi)", &MemoryEstimate::device_peak},
                                                    {"host per node", &MemoryEstimate::host_per_node}};
  for (const auto& [label, field] : figures) {
    out << std::left << std::setw(label_w) << label << std::right;
    for (const auto& row : r.rows) cell(gib(row.estimate.*field));
    out << "\n";
    if (field != &MemoryEstimate::device_peak) continue;
    // The other phases' nvidia-smi figures: loading, and saving a checkpoint.
    for (const auto& [phase_label, phase] : {std::pair{"  device at load", &MemoryEstimate::load},
                                             std::pair{"  device at save", &MemoryEstimate::save}}) {
      out << std::left << std::setw(label_w) << phase_label << std::right;
      for (const auto& row : r.rows) cell(gib((row.estimate.*phase).device_bytes));
      out << "\n";
    }
  }
  out << std::left << std::setw(label_w) << "peak" << std::right;
  for (const auto& row : r.rows)
    cell(row.estimate.peak_phase == "step" ? (row.estimate.peak_moment == "optimizer step" ? "optim" : "step")
                                            : std::string(row.estimate.peak_phase));
  // The caching allocator's replay of the step, where the layout is replayed: its reserved peak, or the
  // step it fails at.
  bool replayed = false;
  for (const auto& row : r.rows) replayed = replayed || row.estimate.replay.has_value();
  if (replayed) {
    out << "\n" << std::left << std::setw(label_w) << "  replay reserved" << std::right;
    for (const auto& row : r.rows) {
      const auto& p = row.estimate.replay;
      cell(!p ? std::string("-") : p->oom ? "OOM@" + std::to_string(p->failed_step) : gib(p->peak_reserved_bytes));
    }
  }
  out << "\n" << std::left << std::setw(label_w) << "fits" << std::right;
  for (const auto& row : r.rows) cell(row.estimate.fits ? "yes" : "NO");
  out << "\n" << std::left << std::setw(label_w) << "max micro-batch" << std::right;
  for (const auto& row : r.rows) cell(std::to_string(row.max_micro_batch));
  out << "\n" << std::left << std::setw(label_w) << "min GPUs" << std::right;
  for (const auto& row : r.rows) cell(row.min_gpus ? std::to_string(row.min_gpus) : "-");
  out << "\n\n";
  for (const auto& row : r.rows)
    if (!row.estimate.fits) out << row.estimate.candidate.name << ": " << row.estimate.reason << "\n";
  out << "assumptions:\n";
  for (const auto& line : r.assumptions) out << "  - " << line << "\n";
  return out.str();
}

}  // namespace ftplan
