// Training on one device: AdamW over the trainable tensors, gradient accumulation, gradient
// clipping, and the precision conventions of planner/precision.h:
//   fp32   fp32 weights, gradients and moments (4 + 4 + 8 B per trainable parameter)
//   bf16   everything bf16 (2 + 2 + 4 B), torchtune's "pure bf16"
//   mixed  bf16 weights and gradients, fp32 master weights and moments in the optimizer (2 + 2 + 12 B)
// The step reads as: for each micro-batch { loss = model(batch) / grad_accum; backward } →
// clip → AdamW → zero the gradients in place (they stay allocated, as the planner counts them).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "executor/data.h"
#include "executor/llama_model.h"
#include "planner/training_setup.h"

namespace ftexec {

struct AdamWOptions {
  double lr = 1e-4;           // e.g. 2e-4 for LoRA
  double beta1 = 0.9;         // --adam-beta1, HF TrainingArguments' default 0.9
  double beta2 = 0.999;       // --adam-beta2, 0.999
  double eps = 1e-8;          // --adam-eps, 1e-8
  double weight_decay = 0.0;  // decoupled (Loshchilov & Hutter 2019), on the parameters hf_decays names
};

// Hugging Face Trainer's parameter groups: weight decay applies to every parameter except biases
// and normalisation weights (Trainer.get_decay_parameter_names: get_parameter_names(model,
// ALL_LAYERNORM_LAYERS, ["bias", "layernorm", "rmsnorm"]); LlamaRMSNorm is in ALL_LAYERNORM_LAYERS).
// Names as ftexec (and Hugging Face / PEFT) name them: "model.layers.3.input_layernorm.weight",
// "model.norm.weight", "...q_proj.bias", "...lora_A.weight".
bool hf_decays(const std::string& name);

// The elements of one (flattened) parameter that weight decay applies to: [offset, offset + count)
// ranges. A tensor of one name is all or nothing; a shard of a flat buffer holding several tensors
// gets the decayed tensors' ranges inside it.
using DecayRanges = std::vector<std::pair<int64_t, int64_t>>;
// All of `numel` when hf_decays(name), else none.
DecayRanges decay_ranges_of(const std::string& name, int64_t numel);

// AdamW (Loshchilov & Hutter 2019, Algorithm 2) over a list of parameters, with optional fp32
// master copies for bf16 parameters (mixed precision).
class AdamW {
 public:
  // `decay`: per parameter, the elements weight decay applies to; empty: all of every parameter.
  AdamW(std::vector<at::Tensor> params, AdamWOptions options, bool fp32_master, std::vector<DecayRanges> decay = {});
  void step();
  int64_t state_bytes() const;  // moments + master copies
  AdamWOptions& options() { return options_; }
  // For checkpoints: the update count and the state tensors ("exp_avg.<i>", "exp_avg_sq.<i>",
  // "master.<i>" for parameter i), live (load copies into them).
  int64_t step_count() const { return t_; }
  void set_step_count(int64_t t) { t_ = t; }
  std::vector<std::pair<std::string, at::Tensor>> named_state() const;

 private:
  struct Slot {
    at::Tensor param, master, m, v;  // master undefined without fp32 masters
    bool decay_all = true;
    DecayRanges decay;               // when !decay_all: the element ranges decayed
  };
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t t_ = 0;
};

// Which tensors train: all base parameters (full) or only the adapters (LoRA); the others get
// requires_grad false.
std::vector<at::Tensor> set_trainable(LlamaModel& model, ftplan::Method method);
// Their names, in the same order.
std::vector<std::string> trainable_names(LlamaModel& model, ftplan::Method method);
// HF Trainer's groups for these named tensors (decay_ranges_of each).
std::vector<DecayRanges> hf_decay_groups(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors);

// Turns a token batch into int64 tensors on the device.
std::pair<at::Tensor, at::Tensor> batch_tensors(const TokenBatch& batch, const at::Device& device);

class Trainer {
 public:
  Trainer(LlamaModel& model, ftplan::Method method, ftplan::Precision precision, AdamWOptions adamw,
          int64_t grad_accum, double max_grad_norm);

  // One optimizer step over grad_accum micro-batches from `next`; returns the mean loss.
  double step(const std::function<TokenBatch()>& next);
  // Forward + backward only (gradients accumulate; no optimizer step): for tests.
  double forward_backward(const TokenBatch& batch, double loss_scale = 1.0);
  void zero_grad();

  const std::vector<at::Tensor>& trainable() const { return trainable_; }
  double last_grad_norm() const { return last_grad_norm_; }
  int64_t weight_bytes() const;     // every parameter (frozen ones too)
  int64_t gradient_bytes() const;   // allocated gradients
  int64_t optimizer_bytes() const { return optimizer_.state_bytes(); }
  AdamW& optimizer() { return optimizer_; }  // (checkpoints: its state and step count)
  const AdamW& optimizer() const { return optimizer_; }

 private:
  LlamaModel& model_;
  std::vector<at::Tensor> trainable_;
  AdamW optimizer_;
  int64_t grad_accum_;
  double max_grad_norm_;
  double last_grad_norm_ = 0.0;
};

}  // namespace ftexec
