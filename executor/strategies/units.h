// Shared by the strategies: the model's units, flat parameter buffers, clipping. Internal to
// executor/strategies/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "executor/comm.h"
#include "executor/llama_model.h"
#include "executor/strategy.h"
#include "executor/trainer.h"

namespace ftexec::strategies {

// One parameter of a unit: its name (Hugging Face / PEFT) and the model field holding it, so a
// strategy can rebind the field to a slice of a flat buffer.
struct UnitTensor {
  std::string name;
  at::Tensor* slot = nullptr;
};

// Units in forward order: 0 the embedding, 1..L the blocks (base weights and LoRA adapters), L+1
// the head (final norm, and lm_head when untied). `with_nf4`: QLoRA's NF4 weights too, as their
// three tensors (codes and absmax_q uint8, absmax_scale fp32; named as bitsandbytes names them:
// .weight, .weight.absmax, .weight.nested_absmax), for the strategies that shard them.
std::vector<std::vector<UnitTensor>> model_units(LlamaModel& model, bool with_nf4 = false);

// A new leaf tensor over `owner`'s storage at element `offset` with `shape` (not an autograd view:
// its own version counter, so refilling the storage never trips autograd's saved-tensor checks).
at::Tensor bind_storage(const at::Tensor& owner, int64_t offset, at::IntArrayRef shape);

// Several parameters packed into one flat buffer padded to a multiple of the world size; the model
// fields are rebound onto it. Rank r owns elements [r·shard, (r+1)·shard).
struct FlatGroup {
  std::vector<UnitTensor> tensors;
  std::vector<int64_t> offsets;  // elements
  int64_t numel = 0;             // without padding
  int64_t padded = 0;            // numel rounded up to a multiple of the world size
  int64_t shard = 0;             // padded / world
  at::Tensor full;               // [padded]

  bool empty() const { return tensors.empty(); }
  int64_t element_bytes() const { return full.defined() ? full.element_size() : 4; }
  double padding_bytes() const { return double(padded - numel) * element_bytes(); }
  at::Tensor chunk(int rank) const { return full.narrow(0, rank * shard, shard); }
};

// Packs `tensors` (all of one dtype) into a FlatGroup and rebinds their fields; requires_grad kept.
FlatGroup flat_group(const std::vector<UnitTensor>& tensors, int world);

// The elements of rank `rank`'s shard that weight decay applies to (HF Trainer's groups: the decayed
// tensors' ranges inside the shard, shard-local).
DecayRanges shard_decay_ranges(const FlatGroup& group, int rank);

// The decay ranges of whole named tensors (HF Trainer's groups).
std::vector<DecayRanges> unit_decay_groups(const std::vector<UnitTensor>& tensors);

// Points every parameter's .grad at the matching slice of `grads` ([padded], zeroed by the caller).
void bind_grads(const FlatGroup& group, const at::Tensor& grads);
// Copies the parameters' gradients into `grads` ([padded]; padding zeroed).
void pack_grads(const FlatGroup& group, const at::Tensor& grads);

// A parameter-shaped leaf over a slice of `owner` with `grad` as its gradient: what AdamW updates
// for a shard.
at::Tensor shard_param(const at::Tensor& owner_slice, const at::Tensor& grad);

// Clips gradients to `max_norm` by the global L2 norm (torch.nn.utils.clip_grad_norm_); with
// `comm` the gradients are shards or stages and the squared norms are summed over ranks. Returns
// the norm before clipping. `replicas`: how many ranks hold each shard (FSDP hybrid: the replica
// groups), so the summed squares count each shard once.
// `tp` (tensor parallelism): the gradients are this tp rank's shards; `replicated[i]` the element
// ranges of grads[i] that every tp rank holds whole (norms, tp_replicated), counted once over tp;
// the squared norms are then summed over the tp group.
struct TpNorm {
  Comm* comm = nullptr;
  int64_t tp = 1;
  std::vector<DecayRanges> replicated;  // one per gradient
};
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Comm* comm, int replicas = 1,
                      const TpNorm* tp = nullptr);
// The TpNorm of whole named tensors (null when the model has no TP).
std::unique_ptr<TpNorm> tp_norm_of(const LlamaModel& model, const std::vector<std::string>& names,
                                   const std::vector<at::Tensor>& tensors);
// The elements of rank `rank`'s shard that belong to tensors whose name satisfies `pred`, shard-local.
DecayRanges shard_ranges_where(const FlatGroup& group, int rank, bool (*pred)(const std::string&));

std::pair<at::Tensor, at::Tensor> micro_batch_tensors(const TokenBatch& b, const at::Device& device);

// The trainable tensors of each unit (requires_grad), by name, in unit order; units without any
// are left out. What --save writes of a model whose parameters are whole on this rank.
std::vector<std::vector<std::pair<std::string, at::Tensor>>> trainable_by_unit(LlamaModel& model);
// gather_trainable for a model whose parameters are whole on every rank (one process, replicas,
// ZeRO-1/2 after their all-gather): rank 0 emits its own, unit by unit; no communication.
void emit_replicated(LlamaModel& model, int rank, const DistStrategy::SaveEmit& emit);

// The strategies, by what the layout shards (common.cpp's factory picks one).
std::unique_ptr<DistStrategy> make_single(LlamaModel& model, Comm& comm, const StrategyOptions& o);
std::unique_ptr<DistStrategy> make_data_parallel(LlamaModel& model, Comm& comm, const StrategyOptions& o);
std::unique_ptr<DistStrategy> make_sharded(LlamaModel& model, Comm& comm, const StrategyOptions& o);
// `dp`: the data-parallel replicas of each stage (pp x dp), averaged once per step; null for none.
std::unique_ptr<DistStrategy> make_pipeline(LlamaModel& model, Comm& comm, const StrategyOptions& o, Comm* dp = nullptr);

}  // namespace ftexec::strategies
