// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") as PEFT implements it:
// y = W x (+ b) + lora_B(lora_A(dropout(x))) · alpha / r, W frozen; lora_A kaiming-uniform(a=√5),
// i.e. U(−1/√in, 1/√in), lora_B zeros. The adapter is saved the way PEFT saves it, so
// `PeftModel.from_pretrained(base, dir)` reads it: adapter_config.json and adapter_model.safetensors
// with names base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight ([r, in]) and
// ...lora_B.weight ([out, r]).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "executor/llama_model.h"
#include "planner/training_setup.h"

namespace ftexec {

// Adds an adapter to every targeted linear of every block, in the model's dtype and device, drawn
// from `seed` on the CPU in fp32. InputError for an unknown target or a rank < 1.
void lora_attach(LlamaModel& model, const ftplan::LoraSpec& lora, uint64_t seed);

// The adapters' tensors by PEFT name, in a fixed order.
std::vector<std::pair<std::string, at::Tensor>> lora_named_parameters(const LlamaModel& model);

// B A dropout(x) · scaling.
at::Tensor lora_forward(const LoraAdapter& adapter, const at::Tensor& x, bool training);

// PEFT's adapter_config.json for this spec (a JSON text).
std::string peft_adapter_config(const ftplan::LoraSpec& lora, const std::string& base_model);

// Writes <dir>/adapter_config.json and <dir>/adapter_model.safetensors, each atomically.
void lora_save_peft(const LlamaModel& model, const ftplan::LoraSpec& lora, const std::string& dir,
                    const std::string& base_model);

}  // namespace ftexec
