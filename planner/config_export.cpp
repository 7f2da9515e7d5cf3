#include "planner/config_export.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "planner/config_import.h"
#include "planner/errors.h"
#include "planner/format.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"

namespace ftplan {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;
using Json = nlohmann::json;

const std::array<std::pair<const char*, ExportTarget>, 7> kTargets{{{"deepspeed", ExportTarget::deepspeed},
                                                                     {"accelerate", ExportTarget::accelerate},
                                                                     {"axolotl", ExportTarget::axolotl},
                                                                     {"torchtune", ExportTarget::torchtune},
                                                                     {"llamafactory", ExportTarget::llamafactory},
                                                                     {"torchrun", ExportTarget::torchrun},
                                                                     {"slurm", ExportTarget::slurm}}};

const std::vector<std::string> kLlamaLinears{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// The context of one export: its target's name for messages.
struct Out {
  const ExportPlan& plan;
  std::string target;
  std::vector<std::string> notes;

  [[noreturn]] void refuse(const std::string& key, const std::string& value, const std::string& why) const {
    fail_input("--to " + target + ": " + key + " " + value + ": " + why);
  }
  const TrainingSetup& job() const { return plan.job; }
  const Parallelism& layout() const { return plan.layout; }
  // How the plan names its layout in messages: "strategy zero3" or "parallel tp=2,dp_shard=4,shard=fsdp".
  std::string layout_key() const { return plan.job.parallel ? "parallel" : "strategy"; }
  void refuse_layout(const std::string& why) const { refuse(layout_key(), plan.layout_name, why); }
  int64_t micro_batch() const {
    if (!plan.job.micro_batch) refuse("micro_batch", "(none)", "the plan has no micro-batch (plan it with ftplan plan)");
    return *plan.job.micro_batch;
  }
};

// ---------------------------------------------------------------------------------------------
// YAML out: the subset these configs use (mappings, lists, scalars), PyYAML-readable.

// The shortest decimal that reads back as the same double.
std::string number_text(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // PyYAML reads a float only with a dot: "2e-05" would be a string; write "2.0e-05".
  const size_t e = s.find_first_of("eE");
  if (e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
  return s;
}

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  const Json typed = yaml_to_json("x: " + s, "export");  // what a YAML reader makes of it
  if (!typed.is_object() || !typed.contains("x") || !typed.at("x").is_string() || typed.at("x") != s) return true;
  return s.find_first_of(":#{}[],&*!|>'\"%@`") != std::string::npos || s.front() == '-' || s.front() == '?' ||
         s.front() == ' ' || s.back() == ' ';
}

std::string yaml_scalar(const OJson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number()) return number_text(v.get<double>());
  const std::string s = v.get<std::string>();
  return needs_quotes(s) ? OJson(s).dump() : s;
}

void emit_yaml(std::ostringstream& out, const OJson& object, int indent) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (auto it = object.begin(); it != object.end(); ++it) {
    const OJson& v = *it;
    if (v.is_object()) {
      if (v.empty()) {
        out << pad << it.key() << ": {}\n";
      } else {
        out << pad << it.key() << ":\n";
        emit_yaml(out, v, indent + 2);
      }
    } else if (v.is_array()) {
      out << pad << it.key() << ": [";
      for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << yaml_scalar(v[i]);
      out << "]\n";
    } else {
      out << pad << it.key() << ": " << yaml_scalar(v) << "\n";
    }
  }
}

std::string yaml_text(const std::vector<std::string>& header, const OJson& body) {
  std::ostringstream out;
  for (const auto& line : header) out << "# " << line << "\n";
  emit_yaml(out, body, 0);
  return out.str();
}

// ---------------------------------------------------------------------------------------------

std::string describe_plan(const ExportPlan& p) {
  const TrainingSetup& s = p.job;
  std::ostringstream d;
  d << s.model << " " << to_string(s.method) << ", " << p.layout_name << " on " << s.num_gpus << "x " << s.gpu;
  if (p.nodes > 1) d << " (" << p.nodes << " nodes x " << p.gpus_per_node << ")";
  if (s.micro_batch) d << ", micro-batch " << *s.micro_batch;
  d << ", grad-accum " << s.grad_accum;
  if (s.checkpointing) d << ", checkpointing " << to_string(*s.checkpointing);
  return d.str();
}

std::vector<std::string> header(const Out& o) {
  std::vector<std::string> h{"ftplan export --to " + o.target + ": " + describe_plan(o.plan)};
  if (o.plan.job_time_s) h.push_back("predicted job time " + format_duration(*o.plan.job_time_s));
  return h;
}

// The framework profile a target runs the plan as (nullopt: the file does not say).
std::optional<std::string> runs_as(ExportTarget t, const Parallelism& l) {
  switch (t) {
    case ExportTarget::deepspeed: return "deepspeed";
    case ExportTarget::torchtune: return "torchtune";
    case ExportTarget::accelerate:
      if (l.sharding == Sharding::zero) return "deepspeed";
      if (l.sharding == Sharding::fsdp) return "fsdp";
      return std::nullopt;
    case ExportTarget::axolotl:
    case ExportTarget::llamafactory:
      if (l.sharding == Sharding::zero) return "deepspeed";
      if (l.sharding == Sharding::fsdp) return "fsdp";
      return "hf";
    default: return std::nullopt;
  }
}

void note_framework(Out& o, ExportTarget t) {
  const auto as = runs_as(t, o.layout());
  if (as && *as != o.job().framework)
    o.notes.push_back("the plan was made for the " + o.job().framework + " profile; this " + o.target + " config runs as " + *as +
                      " (ftplan check --from it predicts with that profile)");
}

// The Hugging Face id (or local folder) a training YAML names the model by.
std::string model_id(const Out& o) {
  const std::string& m = o.job().model;
  if (const auto id = hf_id_for_model(m)) return *id;
  if (fs::path(m).filename() == "config.json") return fs::path(m).parent_path().string();
  o.refuse("model", m, "no Hugging Face id for it in configs/import/model_names.json (a model given as a folder's "
                       "config.json is written as that folder)");
}

// bf16 / fp32 as a training YAML's bf16 flag says it: where the layout is not DeepSpeed's, only fp32 and
// the framework's own bf16 convention can be written.
bool bf16_flag(const Out& o, const std::string& framework) {
  const Precision p = o.job().precision;
  if (p == Precision::fp32) return false;
  if (o.layout().sharding == Sharding::zero) return true;  // the DeepSpeed config carries the rest
  const Precision expected = framework_profile(framework).precision;
  if (p != expected)
    o.refuse("precision", to_string(p), "a " + o.target + " config says bf16 true/false; with " + framework +
                                            " that is " + to_string(expected) + " or fp32");
  return true;
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed (https://www.deepspeed.ai/docs/config-json/).

OJson deepspeed_json(const Out& o, bool batch_auto) {
  const Parallelism& l = o.layout();
  if (l.sharding == Sharding::fsdp) o.refuse_layout("DeepSpeed shards with ZeRO stages, not PyTorch FSDP");
  if (l.tp > 1 || l.cp > 1 || l.pp > 1)
    o.refuse_layout("a DeepSpeed config under the Hugging Face Trainer runs ZeRO data parallelism only (no tensor, context "
                    "or pipeline parallelism)");
  if (l.offload_params && l.zero_stage < 3)
    o.refuse("zero_optimization.offload_param", "(" + o.layout_key() + " " + o.plan.layout_name + ")",
             "parameter offload needs ZeRO stage 3 (stage " + std::to_string(l.zero_stage) + ")");
  if (l.offload_params && !l.offload_optimizer)
    o.refuse("zero_optimization.offload_param", "(" + o.layout_key() + " " + o.plan.layout_name + ")",
             "parameters offloaded without the optimizer states");
  OJson j;
  const int64_t mb = o.micro_batch(), ga = o.job().grad_accum;
  if (batch_auto) {  // the training YAML's micro-batch and accumulation fill them (Hugging Face's "auto")
    j["train_batch_size"] = "auto";
    j["train_micro_batch_size_per_gpu"] = "auto";
    j["gradient_accumulation_steps"] = "auto";
  } else {
    // DeepSpeed's rule: train_batch_size = micro-batch x accumulation x data-parallel GPUs.
    j["train_batch_size"] = mb * ga * l.dp();
    j["train_micro_batch_size_per_gpu"] = mb;
    j["gradient_accumulation_steps"] = ga;
  }
  switch (o.job().precision) {
    case Precision::mixed: j["bf16"] = {{"enabled", true}}; break;
    case Precision::mixed_fp32_grads:
      j["bf16"] = {{"enabled", true}};
      j["data_types"] = {{"grad_accum_dtype", "fp32"}};
      break;
    case Precision::bf16:
      j["bf16"] = {{"enabled", true}, {"bf16_master_weights_and_grads", true}, {"bf16_optimizer_states", true}};
      break;
    case Precision::amp: j["torch_autocast"] = {{"enabled", true}, {"dtype", "bfloat16"}}; break;
    case Precision::fp32: j["bf16"] = {{"enabled", false}}; break;
  }
  OJson zero;
  zero["stage"] = l.sharding == Sharding::zero ? l.zero_stage : 0;
  if (l.offload_optimizer) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (l.offload_params) zero["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (l.sharding == Sharding::zero) {
    zero["overlap_comm"] = true;
    zero["contiguous_gradients"] = true;
  }
  j["zero_optimization"] = zero;
  j["gradient_clipping"] = "auto";
  return j;
}

ExportResult export_deepspeed(Out& o) {
  note_framework(o, ExportTarget::deepspeed);
  o.notes.push_back("the optimizer (" + to_string(o.job().optimizer) + ") and the model come from the training script");
  return {deepspeed_json(o, false).dump(2) + "\n", o.notes};
}

// torch's StateDictType name for the job's state_dict (--state-dict); without one, the full state dict the
// plan's save phase assumed.
std::string state_dict_type(const TrainingSetup& s) {
  switch (s.state_dict.value_or(StateDict::full)) {
    case StateDict::sharded: return "SHARDED_STATE_DICT";
    case StateDict::local: return "LOCAL_STATE_DICT";
    case StateDict::full: break;
  }
  return "FULL_STATE_DICT";
}

// ---------------------------------------------------------------------------------------------
// accelerate config YAML (accelerate/commands/config/cluster.py's keys).

ExportResult export_accelerate(Out& o) {
  const Parallelism& l = o.layout();
  const TrainingSetup& s = o.job();
  if (l.pp > 1) o.refuse_layout("accelerate has no pipeline parallelism");
  note_framework(o, ExportTarget::accelerate);
  OJson j;
  j["compute_environment"] = "LOCAL_MACHINE";
  const bool single = l.gpus() == 1 && l.sharding == Sharding::none;
  j["distributed_type"] = l.sharding == Sharding::zero ? "DEEPSPEED" : l.sharding == Sharding::fsdp ? "FSDP" : single ? "NO" : "MULTI_GPU";
  const std::string framework = runs_as(ExportTarget::accelerate, l).value_or(s.framework);
  if (s.precision == Precision::fp32) {
    j["mixed_precision"] = "no";
  } else {
    const Precision expected = framework_profile(framework).precision;
    if (s.precision != expected)
      o.refuse("precision", to_string(s.precision), "accelerate's mixed_precision bf16 is the " + framework + " profile's " +
                                                        to_string(expected) + " (or no: fp32)");
    j["mixed_precision"] = "bf16";
  }
  j["num_machines"] = o.plan.nodes;
  j["num_processes"] = single ? int64_t(1) : s.num_gpus;
  j["machine_rank"] = 0;
  j["main_training_function"] = "main";
  j["rdzv_backend"] = o.plan.nodes > 1 ? "c10d" : "static";
  j["same_network"] = true;
  j["use_cpu"] = false;
  if (l.sharding == Sharding::zero) {
    if (l.offload_params && l.zero_stage < 3)
      o.refuse("deepspeed_config.offload_param_device", "cpu", "parameter offload needs ZeRO stage 3 (stage " + std::to_string(l.zero_stage) + ")");
    if (l.tp > 1 || l.cp > 1) o.refuse_layout("DeepSpeed under accelerate runs ZeRO data parallelism only");
    j["deepspeed_config"] = {{"zero_stage", l.zero_stage},
                             {"offload_optimizer_device", l.offload_optimizer ? "cpu" : "none"},
                             {"offload_param_device", l.offload_params ? "cpu" : "none"},
                             {"gradient_accumulation_steps", s.grad_accum},
                             {"zero3_init_flag", l.zero_stage == 3}};
  } else if (l.sharding == Sharding::fsdp) {
    OJson f;
    f["fsdp_version"] = s.fsdp_version;
    const bool composed = l.tp > 1 || l.cp > 1 || l.dp_replicate > 1;
    if (s.fsdp_version == 1) {
      if (composed && !(l.dp_replicate > 1 && l.tp == 1 && l.cp == 1))
        o.refuse_layout("accelerate composes tensor and context parallelism with FSDP-2 only (fsdp_version 1)");
      f["fsdp_reshard_after_forward"] = l.dp_replicate > 1 ? "HYBRID_SHARD" : l.reshard_after_forward ? "FULL_SHARD" : "SHARD_GRAD_OP";
    } else {
      f["fsdp_reshard_after_forward"] = l.reshard_after_forward;
    }
    f["fsdp_offload_params"] = l.offload_params;
    if (s.checkpointing == Checkpointing::selective)
      o.refuse("checkpointing", "selective", "accelerate's fsdp_activation_checkpointing checkpoints whole blocks");
    f["fsdp_activation_checkpointing"] = s.checkpointing == Checkpointing::full;
    f["fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP";
    f["fsdp_cpu_ram_efficient_loading"] = true;
    f["fsdp_state_dict_type"] = state_dict_type(s);
    j["fsdp_config"] = f;
    if (s.fsdp_version == 2 && composed)
      j["parallelism_config"] = {{"parallelism_config_dp_replicate_size", l.dp_replicate},
                                 {"parallelism_config_dp_shard_size", l.dp_shard},
                                 {"parallelism_config_tp_size", l.tp},
                                 {"parallelism_config_cp_size", l.cp}};
    if (l.cp > 1 && l.cp_mode != ContextParallel::all_gather)
      o.refuse("parallel", "cp_mode=" + to_string(l.cp_mode), "accelerate's context parallelism exchanges K and V by all-gather");
  } else if (l.tp > 1 || l.cp > 1) {
    o.refuse_layout("accelerate composes tensor and context parallelism with FSDP (distributed_type FSDP)");
  }
  if (l.sharding != Sharding::fsdp) o.notes.push_back("checkpointing and the micro-batch are the training script's (not accelerate keys)");
  return {yaml_text(header(o), j), o.notes};
}

// ---------------------------------------------------------------------------------------------
// axolotl YAML (src/axolotl/utils/schemas/config.py).

std::string optimizer_name_hf(const Out& o) {
  const TrainingSetup& s = o.job();
  switch (s.optimizer) {
    case Optimizer::adamw: return s.paged_optimizer ? "paged_adamw_32bit" : "adamw_torch_fused";
    case Optimizer::adamw8bit: return s.paged_optimizer ? "paged_adamw_8bit" : "adamw_bnb_8bit";
    case Optimizer::sgd:
      if (s.paged_optimizer) o.refuse("paged_optimizer", "true", "no paged SGD");
      return "sgd";
  }
  return "adamw_torch";
}

void check_common_hf(const Out& o) {
  const TrainingSetup& s = o.job();
  const Parallelism& l = o.layout();
  if (l.pp > 1) o.refuse_layout(o.target + " has no pipeline parallelism");
  if (s.optimizer_in_backward) o.refuse("optimizer_in_backward", "true", o.target + " steps the optimizer after backward");
  if (s.checkpointing == Checkpointing::selective)
    o.refuse("checkpointing", "selective", o.target + "'s gradient checkpointing recomputes whole blocks");
}

// The FSDP keys of an HF-Trainer-style YAML (axolotl, LLaMA-Factory): the fsdp option words and an fsdp_config.
void hf_fsdp(const Out& o, OJson& j, bool axolotl) {
  const Parallelism& l = o.layout();
  const TrainingSetup& s = o.job();
  if (l.tp > 1) o.refuse_layout(o.target + " does not run tensor parallelism with FSDP");
  std::string shard = l.dp_replicate > 1 ? "hybrid_shard" : l.reshard_after_forward ? "full_shard" : "shard_grad_op";
  if (axolotl && s.fsdp_version == 2 && (l.dp_replicate > 1 || l.cp > 1)) {
    // FSDP-2 with N-D degrees (axolotl's dp_shard_size / dp_replicate_size / context_parallel_size).
    j["fsdp_version"] = 2;
    j["fsdp_config"] = {{"offload_params", l.offload_params},
                        {"reshard_after_forward", l.reshard_after_forward},
                        {"auto_wrap_policy", "TRANSFORMER_BASED_WRAP"},
                        {"state_dict_type", state_dict_type(s)}};
    j["dp_shard_size"] = l.dp_shard;
    if (l.dp_replicate > 1) j["dp_replicate_size"] = l.dp_replicate;
    if (l.cp > 1) {
      if (l.cp_mode != ContextParallel::ring) o.refuse("parallel", "cp_mode=all_gather", "axolotl's context parallelism is ring attention");
      j["context_parallel_size"] = l.cp;
    }
    return;
  }
  if (l.cp > 1) o.refuse_layout(o.target + " composes context parallelism only with FSDP-2 (axolotl) ");
  if (l.dp_replicate > 1 && l.dp_shard > 1 && s.fsdp_version == 2 && !axolotl)
    o.refuse_layout("hybrid sharding through the Trainer's fsdp option is FSDP-1's HYBRID_SHARD (fsdp_version 1)");
  std::string words = shard + " auto_wrap" + (l.offload_params ? " offload" : "");
  if (axolotl) {
    OJson list = OJson::array();
    std::istringstream in(words);
    for (std::string w; in >> w;) list.push_back(w);
    j["fsdp"] = list;
    j["fsdp_version"] = s.fsdp_version;
  } else {
    j["fsdp"] = words;
  }
  OJson cfg;
  if (!axolotl) cfg["fsdp_version"] = s.fsdp_version;
  cfg[axolotl ? "auto_wrap_policy" : "fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP";
  cfg[axolotl ? "state_dict_type" : "fsdp_state_dict_type"] = state_dict_type(s);
  j["fsdp_config"] = cfg;
}

std::string attention_name(const TrainingSetup& s) {
  return s.attention && *s.attention == Attention::eager ? "eager" : "sdpa";
}

ExportResult export_axolotl(Out& o) {
  const TrainingSetup& s = o.job();
  const Parallelism& l = o.layout();
  check_common_hf(o);
  if (l.tp > 1) o.refuse_layout("axolotl runs tensor parallelism only through DeepSpeed AutoTP, which ftplan does not model");
  note_framework(o, ExportTarget::axolotl);
  const std::string framework = *runs_as(ExportTarget::axolotl, l);
  OJson j;
  j["base_model"] = model_id(o);
  if (s.method != Method::full) {
    j["adapter"] = to_string(s.method);
    if (s.method == Method::qlora) j["load_in_4bit"] = true;
    j["lora_r"] = s.lora.rank;
    j["lora_alpha"] = s.lora.alpha;
    j["lora_dropout"] = s.lora.dropout;
    if (s.lora.targets == kLlamaLinears) j["lora_target_linear"] = true;
    else j["lora_target_modules"] = s.lora.targets;
  }
  j["sequence_len"] = s.seq_len;
  j["sample_packing"] = s.packing;
  j["micro_batch_size"] = o.micro_batch();
  j["gradient_accumulation_steps"] = s.grad_accum;
  j["num_epochs"] = s.epochs;
  j["optimizer"] = optimizer_name_hf(o);
  j["learning_rate"] = s.learning_rate;
  j["seed"] = s.seed;
  j["bf16"] = bf16_flag(o, framework);
  j["gradient_checkpointing"] = s.checkpointing == Checkpointing::full;
  if (s.activation_offload) j["activation_offloading"] = true;
  j["attn_implementation"] = attention_name(s);
  if (s.compile) j["torch_compile"] = true;
  if (s.loss == Loss::fused_linear) {
    j["plugins"] = OJson::array({"axolotl.integrations.liger.LigerPlugin"});
    j["liger_fused_linear_cross_entropy"] = true;
  } else if (s.loss == Loss::chunked) {
    j["chunked_cross_entropy"] = true;
  }
  if (l.sharding == Sharding::zero) j["deepspeed"] = deepspeed_json(o, true);
  else if (l.sharding == Sharding::fsdp) hf_fsdp(o, j, true);
  else if (l.cp > 1) {
    if (l.cp_mode != ContextParallel::ring) o.refuse("parallel", "cp_mode=all_gather", "axolotl's context parallelism is ring attention");
    j["context_parallel_size"] = l.cp;
  }
  j["output_dir"] = "./outputs/ftplan";
  std::vector<std::string> h = header(o);
  h.push_back("datasets: add yours (ftplan plans the job's length from --dataset-rows/--dataset-tokens)");
  h.push_back("launch: accelerate launch -m axolotl.cli.train this.yml (or axolotl train this.yml)");
  return {yaml_text(h, j), o.notes};
}

// ---------------------------------------------------------------------------------------------
// LLaMA-Factory YAML (examples/train_lora/*.yaml; hparams/*.py; TrainingArguments).

ExportResult export_llamafactory(Out& o) {
  const TrainingSetup& s = o.job();
  const Parallelism& l = o.layout();
  check_common_hf(o);
  if (l.tp > 1 || l.cp > 1) o.refuse_layout("LLaMA-Factory's Trainer path runs data parallelism (DDP, DeepSpeed, FSDP) only");
  if (s.activation_offload) o.refuse("activation_offload", "true", "LLaMA-Factory has no activation offloading");
  if (s.loss == Loss::chunked) o.refuse("loss", "chunked", "LLaMA-Factory computes the full loss or Liger's fused linear loss");
  note_framework(o, ExportTarget::llamafactory);
  const std::string framework = *runs_as(ExportTarget::llamafactory, l);
  OJson j;
  j["model_name_or_path"] = model_id(o);
  if (s.method == Method::qlora) {
    j["quantization_bit"] = 4;
    j["quantization_method"] = "bnb";
  }
  j["stage"] = "sft";
  j["do_train"] = true;
  j["finetuning_type"] = s.method == Method::full ? "full" : "lora";
  if (s.method != Method::full) {
    j["lora_rank"] = s.lora.rank;
    j["lora_alpha"] = s.lora.alpha;
    j["lora_dropout"] = s.lora.dropout;
    if (s.lora.targets == kLlamaLinears) {
      j["lora_target"] = "all";
    } else {
      std::string list;
      for (const auto& t : s.lora.targets) list += (list.empty() ? "" : ",") + t;
      j["lora_target"] = list;
    }
  }
  if (l.sharding == Sharding::zero) j["deepspeed"] = deepspeed_json(o, true);
  j["cutoff_len"] = s.seq_len;
  j["packing"] = s.packing;
  j["per_device_train_batch_size"] = o.micro_batch();
  j["gradient_accumulation_steps"] = s.grad_accum;
  j["learning_rate"] = s.learning_rate;
  j["num_train_epochs"] = static_cast<double>(s.epochs);
  if (s.precision == Precision::bf16 && l.sharding != Sharding::zero) {
    j["pure_bf16"] = true;
  } else {
    j["bf16"] = bf16_flag(o, framework);
  }
  j["optim"] = optimizer_name_hf(o);
  j["disable_gradient_checkpointing"] = s.checkpointing != Checkpointing::full;
  j["flash_attn"] = s.attention && *s.attention == Attention::eager ? "disabled" : "sdpa";
  if (s.loss == Loss::fused_linear) j["enable_liger_kernel"] = true;
  if (s.compile) j["torch_compile"] = true;
  if (l.sharding == Sharding::fsdp) hf_fsdp(o, j, false);
  j["seed"] = s.seed;
  j["output_dir"] = "saves/ftplan";
  std::vector<std::string> h = header(o);
  h.push_back("dataset and template: add yours (ftplan plans the job's length from --dataset-rows/--dataset-tokens)");
  h.push_back("launch: llamafactory-cli train this.yaml (FORCE_TORCHRUN=1 on several GPUs)");
  return {yaml_text(h, j), o.notes};
}

// ---------------------------------------------------------------------------------------------
// torchtune recipe YAML (recipes/configs/**, recipes/*_distributed.py).

ExportResult export_torchtune(Out& o) {
  const TrainingSetup& s = o.job();
  const Parallelism& l = o.layout();
  note_framework(o, ExportTarget::torchtune);
  const auto builder = torchtune_builder_for_model(s.model);
  if (!builder) o.refuse("model", s.model, "no torchtune model builder for it in configs/import/model_names.json");
  if (l.sharding == Sharding::zero) o.refuse_layout("torchtune shards with FSDP-2 (fully_shard), not DeepSpeed ZeRO");
  if (l.pp > 1) o.refuse_layout("torchtune's recipes have no pipeline parallelism");
  const bool distributed = l.gpus() > 1;
  if (distributed && l.sharding == Sharding::none) o.refuse_layout("torchtune's distributed recipes shard with FSDP-2 (no DDP)");
  if (s.fsdp_version != 2 && distributed) o.refuse("fsdp_version", std::to_string(s.fsdp_version), "torchtune shards with fully_shard (FSDP-2)");
  if (s.precision != Precision::bf16 && s.precision != Precision::fp32)
    o.refuse("precision", to_string(s.precision), "torchtune's dtype is bf16 (everything bf16) or fp32");
  if (s.checkpointing == Checkpointing::selective) o.refuse("checkpointing", "selective", "torchtune's configs checkpoint whole layers");
  if (s.attention && *s.attention == Attention::eager) o.refuse("attention", "eager", "torchtune runs scaled_dot_product_attention");
  if (s.loss == Loss::fused_linear) o.refuse("loss", "fused-linear", "the torchtune profile offers chunked and full");
  if (l.cp > 1 && l.cp_mode != ContextParallel::all_gather)
    o.refuse("parallel", "cp_mode=ring", "torchtune's context parallelism (the torchtune profile) exchanges K and V by all-gather");
  OJson j;
  j["output_dir"] = "/tmp/torchtune/ftplan";
  const std::string id = hf_id_for_model(s.model).value_or(s.model);
  const std::string local = "/tmp/" + id.substr(id.rfind('/') + 1);
  j["tokenizer"] = {{"_component_", builder->tokenizer}, {"path", local + "/original/tokenizer.model"}, {"max_seq_len", s.seq_len}};
  const std::string plain = builder->builder.substr(builder->builder.rfind('.') + 1);
  const std::string module = builder->builder.substr(0, builder->builder.rfind('.') + 1);
  OJson model;
  model["_component_"] = module + (s.method == Method::lora ? "lora_" : s.method == Method::qlora ? "qlora_" : "") + plain;
  if (s.method != Method::full) {
    OJson attn = OJson::array();
    std::set<std::string> mlp;
    for (const auto& t : s.lora.targets) {
      if (t == "q_proj" || t == "k_proj" || t == "v_proj") attn.push_back(t);
      else if (t == "o_proj") attn.push_back("output_proj");
      else if (t == "gate_proj" || t == "up_proj" || t == "down_proj") mlp.insert(t);
      else o.refuse("lora.targets", t, "not a module torchtune's LoRA builders adapt (q_proj, k_proj, v_proj, output_proj, the MLP)");
    }
    if (!mlp.empty() && mlp.size() != 3)
      o.refuse("lora.targets", *mlp.begin(), "torchtune adapts the MLP as a whole (apply_lora_to_mlp): gate_proj, up_proj and down_proj together");
    model["lora_attn_modules"] = attn;
    model["apply_lora_to_mlp"] = mlp.size() == 3;
    model["apply_lora_to_output"] = false;
    model["lora_rank"] = s.lora.rank;
    model["lora_alpha"] = s.lora.alpha;
    model["lora_dropout"] = s.lora.dropout;
  }
  j["model"] = model;
  j["checkpointer"] = {{"_component_", "torchtune.training.FullModelHFCheckpointer"},
                       {"checkpoint_dir", local},
                       {"checkpoint_files", OJson::array()},
                       {"recipe_checkpoint", nullptr},
                       {"output_dir", "${output_dir}"},
                       {"model_type", builder->checkpoint_model_type}};
  j["resume_from_checkpoint"] = false;
  j["dataset"] = {{"_component_", "torchtune.datasets.alpaca_cleaned_dataset"}, {"packed", s.packing}};
  j["seed"] = s.seed;
  j["shuffle"] = true;
  OJson opt;
  switch (s.optimizer) {
    case Optimizer::adamw: opt["_component_"] = s.paged_optimizer ? "bitsandbytes.optim.PagedAdamW" : "torch.optim.AdamW"; break;
    case Optimizer::adamw8bit: opt["_component_"] = s.paged_optimizer ? "bitsandbytes.optim.PagedAdamW8bit" : "torchao.optim.AdamW8bit"; break;
    case Optimizer::sgd:
      if (s.paged_optimizer) o.refuse("paged_optimizer", "true", "no paged SGD");
      opt["_component_"] = "torch.optim.SGD";
      break;
  }
  opt["lr"] = s.learning_rate;
  j["optimizer"] = opt;
  j["loss"] = {{"_component_", s.loss == Loss::chunked ? "torchtune.modules.loss.CEWithChunkedOutputLoss" : "torch.nn.CrossEntropyLoss"}};
  j["epochs"] = s.epochs;
  j["batch_size"] = o.micro_batch();
  j["max_steps_per_epoch"] = nullptr;
  j["gradient_accumulation_steps"] = s.grad_accum;
  j["compile"] = s.compile;
  j["optimizer_in_bwd"] = s.optimizer_in_backward;
  j["device"] = "cuda";
  j["dtype"] = s.precision == Precision::bf16 ? "bf16" : "fp32";
  j["enable_activation_checkpointing"] = s.checkpointing == Checkpointing::full;
  j["enable_activation_offloading"] = s.activation_offload;
  if (distributed) {
    j["fsdp_cpu_offload"] = l.offload_params;
    j["fsdp_reshard_after_forward"] = l.reshard_after_forward;
    if (l.tp > 1 || l.cp > 1 || l.dp_replicate > 1) {
      j["tensor_parallel_dim"] = l.tp;
      if (l.tp > 1) {
        if (builder->builder.find(".llama") == std::string::npos)
          o.refuse_layout("ftplan knows torchtune's tensor-parallel plan for its Llama builders only (base_llama_tp_plan)");
        j["tensor_parallel_plan"] = {{"_component_", "torchtune.models.llama3.base_llama_tp_plan"}};
      }
      if (l.cp > 1) j["context_parallel_dim"] = l.cp;
      j["data_parallel_replicate_dim"] = l.dp_replicate;
      j["data_parallel_shard_dim"] = -1;
    }
  }
  j["metric_logger"] = {{"_component_", "torchtune.training.metric_logging.DiskLogger"}, {"log_dir", "${output_dir}/logs"}};
  j["log_every_n_steps"] = 1;
  j["log_peak_memory_stats"] = true;
  const std::string recipe = std::string(s.method == Method::full ? "full_finetune" : "lora_finetune") +
                             (distributed ? "_distributed" : "_single_device");
  std::vector<std::string> h = header(o);
  h.push_back("launch: tune run " + (distributed ? "--nnodes " + std::to_string(o.plan.nodes) + " --nproc_per_node " +
                                                       std::to_string(o.plan.gpus_per_node) + " "
                                                 : std::string()) +
              recipe + " --config this.yaml");
  h.push_back("checkpointer.checkpoint_files: the model's safetensors files (tune download " + id + "); dataset: yours");
  if (!distributed && s.num_gpus > 1)
    o.notes.push_back("the plan uses one of its " + std::to_string(s.num_gpus) + " GPUs: read it back with --gpus 1");
  return {yaml_text(h, j), o.notes};
}

// ---------------------------------------------------------------------------------------------
// Launch scripts.

std::string torchrun_line(const ExportPlan& p, const std::string& rdzv) {
  return "torchrun --nnodes=" + std::to_string(p.nodes) + " --nproc_per_node=" + std::to_string(p.gpus_per_node) + " " + rdzv +
         " \"$@\"";
}

ExportResult export_torchrun(Out& o) {
  std::ostringstream out;
  out << "#!/usr/bin/env bash\n";
  for (const auto& line : header(o)) out << "# " << line << "\n";
  out << "# Usage: run on each of the " << o.plan.nodes << " node(s) with the training command and its arguments, e.g.\n"
      << "#   NODE_RANK=0 MASTER_ADDR=host0 ./launch.sh train.py --config config.yaml\n"
      << "set -euo pipefail\n"
      << torchrun_line(o.plan, "--node_rank=\"${NODE_RANK:-0}\" --master_addr=\"${MASTER_ADDR:-127.0.0.1}\" "
                               "--master_port=\"${MASTER_PORT:-29500}\"")
      << "\n";
  return {out.str(), o.notes};
}

ExportResult export_slurm(Out& o, const ExportOptions& options) {
  if (!o.plan.job_time_s)
    o.refuse("dataset", "(none)", "the plan has no job time for the time limit (plan it with --dataset-rows or --dataset-tokens)");
  const double limit_s = *o.plan.job_time_s * (1 + options.time_margin);
  std::ostringstream out;
  out << "#!/bin/bash\n";
  for (const auto& line : header(o)) out << "# " << line << "\n";
  out << "# Time limit: the plan's job time + " << format_fixed(options.time_margin * 100, 0) << "% ("
      << format_duration(limit_s) << ").\n"
      << "# Usage: sbatch this.sbatch train.py --config config.yaml (the training command and its arguments)\n"
      << "#SBATCH --job-name=ftplan-" << (o.job().model.find('/') == std::string::npos ? o.job().model : fs::path(o.job().model).parent_path().filename().string()) << "\n"
      << "#SBATCH --nodes=" << o.plan.nodes << "\n"
      << "#SBATCH --ntasks-per-node=1\n"
      << "#SBATCH --gpus-per-node=" << o.plan.gpus_per_node << "\n"
      << "#SBATCH --time=" << slurm_time(limit_s) << "\n"
      << "set -euo pipefail\n"
      << "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
      << "srun " << torchrun_line(o.plan, "--rdzv_id=\"$SLURM_JOB_ID\" --rdzv_backend=c10d --rdzv_endpoint=\"$MASTER_ADDR:29500\"")
      << "\n";
  return {out.str(), o.notes};
}

}  // namespace

std::string to_string(ExportTarget target) {
  for (const auto& [name, t] : kTargets)
    if (t == target) return name;
  return "?";
}

ExportTarget parse_export_target(const std::string& text, const std::string& field) {
  std::string names;
  for (const auto& [name, t] : kTargets) {
    if (text == name) return t;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  fail_input(field + ": '" + text + "' is not one of " + names);
}

const std::vector<ExportTarget>& all_export_targets() {
  static const std::vector<ExportTarget> all = [] {
    std::vector<ExportTarget> v;
    for (const auto& [name, t] : kTargets) v.push_back(t);
    return v;
  }();
  return all;
}

std::string slurm_time(double seconds) {
  int64_t minutes = static_cast<int64_t>(std::ceil(seconds / 60.0 - 1e-9));
  if (minutes < 1) minutes = 1;
  const int64_t days = minutes / 1440, hours = (minutes % 1440) / 60, mins = minutes % 60;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld-%02lld:%02lld:00", static_cast<long long>(days), static_cast<long long>(hours),
                static_cast<long long>(mins));
  return buf;
}

ExportPlan export_plan_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("job") || !j.at("job").is_object())
    fail_input(where + ": not a plan (the file ftplan plan -o writes, or ftplan plan --json's output with a recommended plan)");
  if (j.contains("format") && j.at("format") != "ftplan-plan/1")
    fail_input(where + ": format: expected ftplan-plan/1, got " + j.at("format").dump());
  ExportPlan p;
  p.job = training_setup_from_json(j.at("job"), where + ": job");
  HardwareSpec hw = load_hardware(p.job.gpu);
  apply_topology(p.job, hw);
  const int64_t n = p.job.num_gpus;
  if (p.job.parallel) {
    p.layout = *p.job.parallel;
    p.layout_name = name(p.layout);
  } else if (p.job.strategy) {
    p.layout = preset(*p.job.strategy, n, hw.gpus_per_node);
    p.layout_name = to_string(*p.job.strategy);
  } else {
    fail_input(where + ": job: no strategy or parallel (write the plan with ftplan plan -o)");
  }
  const int64_t used = p.layout.gpus();
  p.gpus_per_node = std::min(used, hw.gpus_per_node);
  p.nodes = p.job.nodes ? *p.job.nodes : (used + hw.gpus_per_node - 1) / hw.gpus_per_node;
  if (p.nodes > 1) p.gpus_per_node = hw.gpus_per_node;
  if (p.nodes * p.gpus_per_node != used)
    fail_input(where + ": job: " + std::to_string(used) + " GPUs do not fill " + std::to_string(p.nodes) + " nodes of " +
               std::to_string(p.gpus_per_node) + " (give --gpus-per-node when planning)");
  const nlohmann::json* t = nullptr;
  if (j.contains("predicted") && j.at("predicted").is_object()) t = &j.at("predicted");
  else if (j.contains("recommended") && j.at("recommended").is_object()) t = &j.at("recommended");
  if (t && t->contains("job_time_s") && t->at("job_time_s").is_number()) {
    const double s = t->at("job_time_s").get<double>();
    if (!std::isfinite(s) || s < 0) fail_input(where + ": job_time_s: " + t->at("job_time_s").dump() + " is not a duration");
    p.job_time_s = s;
  }
  return p;
}

ExportResult export_plan(const ExportPlan& plan, ExportTarget target, const ExportOptions& options) {
  Out o{plan, to_string(target), {}};
  switch (target) {
    case ExportTarget::deepspeed: return export_deepspeed(o);
    case ExportTarget::accelerate: return export_accelerate(o);
    case ExportTarget::axolotl: return export_axolotl(o);
    case ExportTarget::torchtune: return export_torchtune(o);
    case ExportTarget::llamafactory: return export_llamafactory(o);
    case ExportTarget::torchrun: return export_torchrun(o);
    case ExportTarget::slurm: return export_slurm(o, options);
  }
  fail_input("--to: unknown target");
}

std::vector<std::string> export_carried_keys(const ExportPlan& plan, ExportTarget target) {
  const Sharding sharding = plan.layout.sharding;
  std::vector<std::string> keys{"strategy", "parallel"};
  const auto add = [&](std::initializer_list<const char*> more) { keys.insert(keys.end(), more.begin(), more.end()); };
  switch (target) {
    case ExportTarget::deepspeed: add({"framework", "micro_batch", "grad_accum", "precision"}); break;
    case ExportTarget::accelerate:
      add({"gpus", "nodes", "gpus_per_node", "precision"});
      if (sharding == Sharding::zero) add({"framework", "grad_accum"});
      if (sharding == Sharding::fsdp) add({"framework", "fsdp_version", "checkpointing", "state_dict"});
      break;
    case ExportTarget::axolotl:
    case ExportTarget::llamafactory:
      add({"framework", "model", "method", "lora.rank", "lora.alpha", "lora.dropout", "lora.targets", "seq_len", "packing",
           "micro_batch", "grad_accum", "epochs", "optimizer", "paged_optimizer", "learning_rate", "seed", "precision",
           "checkpointing", "activation_offload", "attention", "compile", "loss"});
      if (sharding == Sharding::fsdp) add({"fsdp_version", "state_dict"});
      break;
    case ExportTarget::torchtune:
      add({"framework", "model", "method", "lora.rank", "lora.alpha", "lora.dropout", "lora.targets", "seq_len", "packing",
           "micro_batch", "grad_accum", "epochs", "optimizer", "paged_optimizer", "learning_rate", "seed", "precision",
           "checkpointing", "activation_offload", "compile", "loss", "optimizer_in_backward"});
      break;
    case ExportTarget::torchrun:
    case ExportTarget::slurm:
      keys = {"gpus", "nodes", "gpus_per_node"};
      break;
  }
  return keys;
}

}  // namespace ftplan
