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
#include <vector>

#include <ATen/ATen.h>

#include "executor/data.h"
#include "executor/llama_model.h"
#include "planner/training_setup.h"

namespace ftexec {

struct AdamWOptions {
  double lr = 1e-4;           // e.g. 2e-4 for LoRA
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled (Loshchilov & Hutter 2019)
};

// AdamW (Loshchilov & Hutter 2019, Algorithm 2) over a list of parameters, with optional fp32
// master copies for bf16 parameters (mixed precision).
class AdamW {
 public:
  AdamW(std::vector<at::Tensor> params, AdamWOptions options, bool fp32_master);
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
  };
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t t_ = 0;
};

// Which tensors train: all base parameters (full) or only the adapters (LoRA); the others get
// requires_grad false.
std::vector<at::Tensor> set_trainable(LlamaModel& model, ftplan::Method method);

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

 private:
  LlamaModel& model_;
  std::vector<at::Tensor> trainable_;
  AdamW optimizer_;
  int64_t grad_accum_;
  double max_grad_norm_;
  double last_grad_norm_ = 0.0;
};

}  // namespace ftexec
