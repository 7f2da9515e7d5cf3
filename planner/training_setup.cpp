#include "planner/training_setup.h"

#include <algorithm>
#include <array>
#include <sstream>

#include <nlohmann/json.hpp>

#include "planner/errors.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"

namespace ftplan {
namespace {

template <typename Enum, size_t N>
Enum parse_enum(const std::string& s, const std::string& field,
                const std::array<std::pair<const char*, Enum>, N>& table) {
  std::string accepted;
  for (const auto& [name, value] : table) {
    if (s == name) return value;
    accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  }
  fail_input(field + ": '" + s + "' is not one of " + accepted);
}

template <typename Enum, size_t N>
std::string enum_name(Enum v, const std::array<std::pair<const char*, Enum>, N>& table) {
  for (const auto& [name, value] : table)
    if (value == v) return name;
  return "?";
}

const std::array<std::pair<const char*, Method>, 3> kMethods{{
    {"full", Method::full}, {"lora", Method::lora}, {"qlora", Method::qlora}}};
const std::array<std::pair<const char*, Precision>, 5> kPrecisions{{
    {"mixed", Precision::mixed}, {"mixed-fp32-grads", Precision::mixed_fp32_grads}, {"amp", Precision::amp},
    {"bf16", Precision::bf16}, {"fp32", Precision::fp32}}};
const std::array<std::pair<const char*, Optimizer>, 3> kOptimizers{{
    {"adamw", Optimizer::adamw}, {"adamw8bit", Optimizer::adamw8bit}, {"sgd", Optimizer::sgd}}};
const std::array<std::pair<const char*, Checkpointing>, 3> kCheckpointing{{
    {"none", Checkpointing::none}, {"full", Checkpointing::full}, {"selective", Checkpointing::selective}}};
const std::array<std::pair<const char*, Loss>, 3> kLosses{{
    {"full", Loss::full}, {"chunked", Loss::chunked}, {"fused-linear", Loss::fused_linear}}};
const std::array<std::pair<const char*, StateDict>, 3> kStateDicts{{
    {"full", StateDict::full}, {"sharded", StateDict::sharded}, {"local", StateDict::local}}};
const std::array<std::pair<const char*, Attention>, 2> kAttention{{
    {"fused", Attention::fused}, {"eager", Attention::eager}}};
const std::array<std::pair<const char*, Strategy>, 13> kStrategies{{
    {"single", Strategy::single}, {"mp", Strategy::mp}, {"pipeline", Strategy::pipeline_gpipe},
    {"pipeline_1f1b", Strategy::pipeline_1f1b}, {"ddp", Strategy::ddp}, {"zero1", Strategy::zero1},
    {"zero2", Strategy::zero2}, {"zero3", Strategy::zero3}, {"fsdp", Strategy::fsdp},
    {"fsdp_shard_grad_op", Strategy::fsdp_shard_grad_op}, {"fsdp_hybrid", Strategy::fsdp_hybrid},
    {"zero2_offload", Strategy::zero2_offload}, {"zero3_offload", Strategy::zero3_offload}}};

// The block linears of every family (model_family.h): Llama's seven first (all-linear), then Phi-3's fused ones,
// the mixtures of experts' (Mixtral's experts w1, w3, w2; the routers gate, router; Qwen2-MoE's shared_expert_gate)
// and DeepSeek's latent attention projections.
const std::array<const char*, 19> kLinearNames{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj", "qkv_proj", "gate_up_proj", "w1", "w2", "w3", "gate",
                                               "router", "shared_expert_gate", "q_a_proj", "q_b_proj",
                                               "kv_a_proj_with_mqa", "kv_b_proj"};

}  // namespace

const std::vector<Strategy>& all_strategies() {
  static const std::vector<Strategy> all = [] {
    std::vector<Strategy> v;
    for (const auto& entry : kStrategies) v.push_back(entry.second);
    return v;
  }();
  return all;
}

std::string to_string(Method v) { return enum_name(v, kMethods); }
std::string to_string(Precision v) { return enum_name(v, kPrecisions); }
std::string to_string(Optimizer v) { return enum_name(v, kOptimizers); }
std::string to_string(Checkpointing v) { return enum_name(v, kCheckpointing); }
std::string to_string(Attention v) { return enum_name(v, kAttention); }
std::string to_string(Loss v) { return enum_name(v, kLosses); }
std::string to_string(StateDict v) { return enum_name(v, kStateDicts); }
std::string to_string(Strategy v) { return enum_name(v, kStrategies); }
Method parse_method(const std::string& s, const std::string& f) { return parse_enum(s, f, kMethods); }
Precision parse_precision(const std::string& s, const std::string& f) { return parse_enum(s, f, kPrecisions); }
Optimizer parse_optimizer(const std::string& s, const std::string& f) { return parse_enum(s, f, kOptimizers); }
Checkpointing parse_checkpointing(const std::string& s, const std::string& f) {
  return parse_enum(s, f, kCheckpointing);
}
Attention parse_attention(const std::string& s, const std::string& f) { return parse_enum(s, f, kAttention); }
Loss parse_loss(const std::string& s, const std::string& f) { return parse_enum(s, f, kLosses); }
StateDict parse_state_dict(const std::string& s, const std::string& f) { return parse_enum(s, f, kStateDicts); }
Strategy parse_strategy(const std::string& s, const std::string& f) { return parse_enum(s, f, kStrategies); }

std::vector<std::string> parse_lora_targets(const std::string& list, const std::string& field) {
  if (list == "all-linear" || list == "all") return {kLinearNames.begin(), kLinearNames.begin() + 7};
  std::vector<std::string> targets;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (std::find(kLinearNames.begin(), kLinearNames.end(), name) == kLinearNames.end())
      fail_input(field + ": '" + name +
                 "' is not a block linear (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                 "down_proj; Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj; Mixtral's experts w1, w3, w2; the "
                 "routers gate, router; DeepSeek: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj; or all-linear)");
    if (std::find(targets.begin(), targets.end(), name) == targets.end()) targets.push_back(name);
  }
  if (targets.empty()) fail_input(field + ": empty list");
  return targets;
}

namespace {

// Applies every key of a job object (or of its nested "lora" / "dataset" object) through the field
// table; `prefix` is "" or "lora" / "dataset", `name` how errors name the object.
void apply_job_object(TrainingSetup& s, const nlohmann::json& j, const std::string& prefix, const std::string& name) {
  if (!j.is_object()) fail_input(name + ": expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    const std::string field = name + ": " + it.key();
    if (it->is_null()) continue;  // null: the default
    if (prefix.empty() && (key == "lora" || key == "dataset" || key == "quantization" || key == "moe")) {
      apply_job_object(s, *it, key, field);
      continue;
    }
    const FieldSpec* spec = nullptr;
    for (const FieldSpec& f : field_table())
      if (key == f.key && (f.places & kInJobFile)) spec = &f;
    if (!spec) fail_input(field + ": unknown key");
    apply_job_field(s, *spec, *it, field);
  }
}

}  // namespace

TrainingSetup training_setup_from_json(const nlohmann::json& j, const std::string& where) {
  TrainingSetup s;
  apply_job_object(s, j, "", where);
  if (!has_field(j, "model")) fail_input(where + ": model: missing");
  if (has_field(j, "dataset") && s.dataset.rows == 0 && s.dataset.tokens == 0)
    fail_input(where + ": dataset: give rows or tokens");
  return s;
}

nlohmann::json training_setup_to_json(const TrainingSetup& s) {
  nlohmann::json j;
  j["model"] = s.model;
  j["framework"] = s.framework;
  j["gpu"] = s.gpu;
  j["gpus"] = s.num_gpus;
  j["method"] = to_string(s.method);
  if (s.method != Method::full)
    j["lora"] = {{"rank", s.lora.rank}, {"alpha", s.lora.alpha}, {"dropout", s.lora.dropout},
                 {"targets", s.lora.targets}};
  j["precision"] = to_string(s.precision);
  j["optimizer"] = to_string(s.optimizer);
  j["paged_optimizer"] = s.paged_optimizer;
  j["seq_len"] = s.seq_len;
  j["grad_accum"] = s.grad_accum;
  j["epochs"] = s.epochs;
  j["headroom_fraction"] = s.headroom_fraction;
  j["fsdp_version"] = s.fsdp_version;
  j["loss"] = to_string(s.loss);
  if (s.method == Method::qlora) j["quantization"] = {{"double_quant", s.quantization.double_quant}};
  if (s.given.count("moe.imbalance_factor") || s.moe.capacity_factor || s.moe.aux_loss) {
    nlohmann::json m;
    m["imbalance_factor"] = s.moe.imbalance_factor;
    if (s.moe.capacity_factor) m["capacity_factor"] = *s.moe.capacity_factor;
    if (s.moe.aux_loss) m["aux_loss"] = *s.moe.aux_loss;
    j["moe"] = m;
  }
  j["activation_offload"] = s.activation_offload;
  j["optimizer_in_backward"] = s.optimizer_in_backward;
  j["compile"] = s.compile;
  j["packing"] = s.packing;
  if (s.host_memory_gib) j["host_memory_gib"] = *s.host_memory_gib;
  if (s.pcie_slot) j["pcie_slot"] = *s.pcie_slot;
  if (s.price_per_gpu_hour) j["price_per_gpu_hour"] = *s.price_per_gpu_hour;
  if (s.state_dict) j["state_dict"] = to_string(*s.state_dict);
  if (s.micro_batch) j["micro_batch"] = *s.micro_batch;
  if (s.checkpointing) j["checkpointing"] = to_string(*s.checkpointing);
  if (s.attention) j["attention"] = to_string(*s.attention);
  if (s.strategy) j["strategy"] = to_string(*s.strategy);
  if (s.parallel) j["parallel"] = to_string(*s.parallel);
  if (s.nodes) j["nodes"] = *s.nodes;
  if (s.gpus_per_node) j["gpus_per_node"] = *s.gpus_per_node;
  if (s.efficiency) j["efficiency"] = *s.efficiency;
  if (s.dataset.rows || s.dataset.tokens) {
    nlohmann::json d;
    if (s.dataset.rows) d["rows"] = s.dataset.rows;
    if (s.dataset.mean_tokens_per_row) d["mean_tokens_per_row"] = s.dataset.mean_tokens_per_row;
    if (s.dataset.max_tokens_per_row) d["max_tokens_per_row"] = s.dataset.max_tokens_per_row;
    if (s.dataset.tokens) d["tokens"] = s.dataset.tokens;
    j["dataset"] = d;
  }
  j["steps"] = s.steps;
  j["learning_rate"] = s.learning_rate;
  j["seed"] = s.seed;
  j["data"] = s.data;
  j["device"] = s.device;
  return j;
}

int64_t TrainingSetup::memory_seq_len() const {
  // Packed rows fill seq_len; padded batches are as long as their longest row (at most seq_len,
  // where the data pipeline truncates).
  if (packing || dataset.max_tokens_per_row == 0) return seq_len;
  return std::min(seq_len, dataset.max_tokens_per_row);
}

int64_t job_tokens(const TrainingSetup& s) {
  int64_t per_epoch = s.dataset.tokens;
  if (per_epoch == 0 && s.dataset.rows > 0)
    per_epoch = s.dataset.rows * (s.dataset.mean_tokens_per_row ? s.dataset.mean_tokens_per_row : s.seq_len);
  return per_epoch * s.epochs;
}

}  // namespace ftplan
