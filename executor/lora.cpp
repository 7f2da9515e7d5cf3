#include "executor/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftexec {
namespace fs = std::filesystem;

void lora_attach(LlamaModel& m, const ftplan::LoraSpec& lora, uint64_t seed) {
  if (lora.rank < 1) ftplan::fail_input("--lora-rank: must be at least 1, got " + std::to_string(lora.rank));
  if (lora.targets.empty()) ftplan::fail_input("--lora-targets: no target modules");
  for (const auto& t : lora.targets) {
    // A MoE layer's router and experts are no Linear here: one adapter per expert is not implemented.
    for (const auto& lin : ftplan::model_linears(m.spec))
      if (lin.name == t && (lin.role == ftplan::LinearRole::router || ftplan::is_expert_role(lin.role)))
        ftplan::fail_input("--lora-targets (lora.targets) " + t + ": LoRA on a mixture of experts' router or routed "
                           "experts is not implemented by ftexec (target the attention linears, e.g. q_proj,k_proj,v_proj,o_proj)");
    (void)block_linear(m.layers.at(0), t);  // InputError naming an unknown one
    // A Llama name on a fused model (q_proj on Phi-3) or the reverse would adapt nothing: refused by name.
    std::string names;
    bool present = false;
    for (const auto& lin : ftplan::model_linears(m.spec)) {
      present |= lin.name == t;
      names += (names.empty() ? "" : ", ") + lin.name;
    }
    if (!present)
      ftplan::fail_input("--lora-targets (lora.targets) " + t + ": not a linear of a " + m.spec.model_type + " block (" +
                         names + ")");
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x4c6f5241u);  // "LoRA": apart from the base init
  const auto target = at::TensorOptions().dtype(m.options.dtype).device(m.options.device);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    auto& block = m.layers[l];
    for (const auto& shape : layer_dense_linears(m.spec, static_cast<int64_t>(l))) {
      bool targeted = false;
      for (const auto& t : lora.targets) targeted |= (t == shape.name);
      if (!targeted) continue;
      LoraAdapter a;
      // PEFT: nn.init.kaiming_uniform_(lora_A.weight, a=math.sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)).
      const double bound = 1.0 / std::sqrt(static_cast<double>(shape.in_features));
      a.a = at::empty({lora.rank, shape.in_features}, at::kFloat).uniform_(-bound, bound, gen).to(target);
      a.b = at::zeros({shape.out_features, lora.rank}, target);
      a.scaling = lora.alpha / static_cast<double>(lora.rank);
      a.dropout = lora.dropout;
      block_linear(block, shape.name).lora = std::move(a);
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> lora_named_parameters(const LlamaModel& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    for (const auto& shape : layer_dense_linears(m.spec, static_cast<int64_t>(l))) {
      const Linear& lin = block_linear(m.layers[l], shape.name);
      if (!lin.lora) continue;
      const std::string p = "base_model.model." + checkpoint_name(m.spec, "model.layers.") + std::to_string(l) + "." +
                            block_linear_prefix(m.spec, static_cast<int64_t>(l), shape.name) + shape.name;
      out.emplace_back(p + ".lora_A.weight", lin.lora->a);
      out.emplace_back(p + ".lora_B.weight", lin.lora->b);
    }
  }
  return out;
}

at::Tensor lora_forward(const LoraAdapter& a, const at::Tensor& x, bool training) {
  // native_dropout keeps a bool mask (1 byte per element), as the planner counts it.
  const at::Tensor in = (training && a.dropout > 0.0) ? std::get<0>(at::native_dropout(x, a.dropout, true)) : x;
  return at::linear(at::linear(in, a.a), a.b) * a.scaling;
}

std::string peft_adapter_config(const ftplan::LoraSpec& lora, const std::string& base_model) {
  // The keys PEFT 0.x writes for a LoraConfig (peft/tuners/lora/config.py), defaults where unused.
  nlohmann::ordered_json j;
  j["alpha_pattern"] = nlohmann::json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = base_model;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = lora.rank;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  j["target_modules"] = lora.targets;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = false;
  return j.dump(2) + "\n";
}

void lora_save_peft(const LlamaModel& m, const ftplan::LoraSpec& lora, const std::string& dir,
                    const std::string& base_model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("--save " + dir + ": cannot create the folder (" + ec.message() + ")");
  std::vector<at::Tensor> keep;
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : lora_named_parameters(m)) {
    keep.push_back(t.detach().to(at::kCPU).contiguous());
    entries.push_back(safetensors_entry(name, keep.back()));
  }
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), entries, {{"format", "pt"}});
  ftplan::write_file_atomically((fs::path(dir) / "adapter_config.json").string(), peft_adapter_config(lora, base_model));
}

}  // namespace ftexec
