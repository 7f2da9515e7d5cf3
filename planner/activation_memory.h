// Activation memory of a Llama block (RMSNorm, RoPE, GQA attention, SwiGLU) and of the loss, as
// the tensors autograd keeps for backward. After Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", sec. 4.1), redone for Llama's block and for frozen
// weights: a frozen linear layer keeps no input, because its weight needs no gradient.
//
// Per block, with T = micro_batch × seq_len tokens and a = activation bytes (2 bf16, 4 fp32), the
// tensors kept are (this is the list ftexec's model keeps too, so a measured run checks it):
//   RMSNorm ×2: its input in fp32 (4·T·h: HF and ftexec upcast first), the fp32 rstd (4·T), and,
//               when the norm weight trains, the normalised input (a·T·h)
//   norm outputs: a·T·h each, kept when a consumer linear trains (q/k/v; gate/up)
//   attention, fused (SDPA/flash): q (a·T·q_dim), k and v (a·T·kv_dim each), the output
//               (a·T·q_dim) and the fp32 log-sum-exp (4·B·heads·S)
//   attention, eager: q, k and v repeated to all heads (a·T·q_dim each), the fp32 softmax
//               (4·B·heads·S²) and, under bf16, its bf16 copy for P·V (2·B·heads·S²)
//   o_proj input: a·T·q_dim when o_proj trains
//   SwiGLU: gate output, SiLU output and up output (a·T·i each), down_proj input (a·T·i) when
//               down_proj trains
//   LoRA per adapted module: A's output (a·T·r); with dropout, the dropped-out input (a·T·in)
//               and its mask (1·T·in) instead of the shared input
// Full checkpointing keeps only each block's input (r·T·h, the residual stream's dtype: fp32 under
// amp) and recomputes one block at a time. Framework and knob variants:
//   k and v repeated to every query head before the attention (repeat_kv: HF, litgpt, torchtune):
//               a·T·q_dim each instead of a·T·kv_dim
//   torch.compile (AOTAutograd's min-cut rematerialisation recomputes cheap pointwise ops rather
//               than saving them): RMSNorm keeps its input as it arrives (r·T·h) and the rstd; SwiGLU
//               keeps the gate and up outputs only (2·a·T·i), recomputing SiLU and the product
//   fused RMSNorm and SwiGLU kernels (Liger-Kernel's LigerRMSNormFunction saves X, W and RSTD;
//               LigerSiLUMulFunction saves a and b and recomputes SiLU in backward): the norm keeps its input
//               as it arrives (r·T·h) and the rstd, no normalised copy even where its weight trains; the MLP
//               keeps gate and up (2·a·T·i) and down_proj's input (a·T·i) where down_proj trains
//   selective checkpointing (Korthikanti et al. 2022, sec. 5: the attention core is recomputed): the
//               eager attention's scores and softmax are not kept (the fused kernel keeps none);
//               torchtitan's op-level policy instead keeps the block input (r·T·h), the outputs of
//               every second matmul (q, v, gate: a·T·(q_dim + kv_dim + i), and down's a·T·h) and the
//               attention kernel's output and log-sum-exp, recomputing everything else
//   QLoRA on bitsandbytes < 0.43.2: each 4-bit matmul keeps its input for backward, so o_proj's,
//               down_proj's and the MLP norm's outputs are kept even where no adapter reads them
// Family differences (the ModelSpec's fields, planner/model_family.h):
//   extra RMSNorms (Gemma's post-attention and post-MLP norms, OLMo 2's post-norms) keep what the two
//               above keep; Gemma's (1 + weight) scale runs in fp32, so a trained norm keeps an fp32 output
//   q/k norms: the fp32 upcast of q (4·T·q_dim) and k (4·T·kv_dim), their rstd (4·T·heads per head, or
//               4·T over the whole projection), and the normalised q and k when the weights train
//   attention soft-capping (Gemma 2), eager: tanh's output (a·B·heads·S²) beside the softmax; fused
//               kernels cap inside and keep nothing more
//   sliding windows: eager attention still computes and keeps B·heads·S² scores on local layers
//               (transformers builds the full score matrix and masks the window: gemma2
//               eager_attention_forward), the fused kernels keep only the log-sum-exp: local and global
//               blocks keep the same bytes (the window changes FLOPs only, compute_model.h)
//   a fused qkv_proj (Phi-3): v is a view into its output, so where v is saved uncopied (no GQA repeat)
//               the q and k parts stay alive: + a·T·(q_dim + kv_dim); a fused gate_up_proj keeps the
//               same bytes as gate and up
//   the final logit soft-cap (Gemma 2) keeps tanh's output, a·T·vocab, through the loss (logit_softcap_bytes)
//   multi-head latent attention (DeepSeek): q and k of heads·(qk_nope + qk_rope), v and the output of
//               heads·v_head_dim; the latent RMSNorms (q_a_layernorm, kv_a_layernorm) keep what a norm keeps, and
//               q_b_proj / kv_b_proj keep their latent input when they train
//   a mixture-of-experts block (transformers' MixtralSparseMoeBlock and its kin; torchtitan's grouped experts
//               keep the same per pair), with P = T·top_k token-expert pairs of the rank's own tokens and P_x
//               the pairs its experts compute (P; under expert parallelism imbalance_factor·P on the busiest
//               rank; capacity-limited routing capacity_factor·P, padded):
//               the MLP norm's output (a·T·h) when the router or the shared expert trains; the router's fp32
//               softmax (4·T·experts), top-k indices and weights (12·T·top_k) and their cast (a·T·top_k); per
//               expert pair the dispatched input (a·h, when the expert's gate/up keeps it), gate, act(gate),
//               up (3·a·I; compiled 2·a·I) and down's input (a·I, when down keeps it); per own pair the expert
//               output kept for the routing-weight product (a·h); the shared expert as a dense MLP of its width,
//               its sigmoid gate (a·T) and the output it scales (a·T·h); LoRA on experts per pair
//   blocks of two kinds (DeepSeek's leading dense blocks): the mean block
#pragma once

#include <cstdint>

#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

struct ActivationInputs {
  int64_t micro_batch = 1;  // B
  int64_t seq_len = 1;      // S
  Precision precision = Precision::mixed;
  Attention attention = Attention::fused;
  Method method = Method::full;
  LoraSpec lora;
  bool gqa_kv_repeated = false;  // the framework repeats k and v to every query head
  bool compile = false;          // torch.compile's rematerialisation
  bool fused_norm_mlp = false;   // the framework's fused RMSNorm and SwiGLU kernels (Liger-Kernel)
  bool selective = false;        // selective checkpointing
  bool selective_every_second_matmul = false;  // torchtitan's op-level policy instead of the attention core
  bool quantized_saves_input = false;  // QLoRA: each 4-bit matmul keeps its input (bitsandbytes < 0.43.2)
  bool sp_keeps_gathered_input = false;  // sequence parallelism: the column-parallel linears' shared input
                                         // is kept all-gathered (whole on every tp rank), not as a shard
  int residual_bytes = 2;        // the residual stream's element: 4 under fp32, and under amp with autocast
  // One rank's share under tensor (tp, with sequence_parallel) and context (cp) parallelism.
  int64_t tp = 1;
  bool sequence_parallel = false;
  int64_t cp = 1;
  // Mixture of experts (TrainingSetup::moe): expert parallelism and how tokens load the experts.
  int64_t ep = 1;
  double imbalance_factor = 1.0;  // dropless, under expert parallelism: the busiest rank's share of pairs
  double capacity_factor = 0;     // > 0: capacity-limited routing, every expert padded to its capacity
};

// One block's saved bytes by how tensor and context parallelism split them (Korthikanti et al. 2022,
// sec. 4.2): `sequence` are per-token tensors outside the tensor-parallel region (norm inputs, the
// residual stream, the inputs the column-parallel linears share): whole on every TP rank, split by
// tp only under sequence parallelism; `tensor` are inside it (q, k, v, scores, attention output, MLP
// intermediates), already one TP rank's share; `replicated` are per-token but whole on every TP rank
// even under sequence parallelism (LoRA's rank-r A outputs). Context parallelism splits them all by cp.
struct ActivationTerms {
  double sequence = 0;
  double tensor = 0;
  double replicated = 0;
};
// The bytes one rank keeps: sequence / (cp · (sp ? tp : 1)) + tensor / cp + replicated / cp.
int64_t split_activation_bytes(const ActivationTerms& terms, int64_t tp, bool sequence_parallel, int64_t cp);

// The terms of one decoder block (tp = cp = 1 in `in`: the whole block).
ActivationTerms block_activation_terms(const ModelSpec& model, const ActivationInputs& in);

// How the framework shapes a block's saved tensors (from its profile).
struct ActivationFramework {
  bool gqa_kv_repeated = false;
  bool autocast = false;
  bool selective_every_second_matmul = false;
  bool quantized_saves_input = false;
  bool sp_keeps_gathered_input = false;
  bool fused_norm_mlp = false;  // FrameworkProfile::fused_norm_mlp_kernels
};

// The job's inputs; seq_len is the padded length memory is planned for (TrainingSetup::memory_seq_len).
ActivationInputs activation_inputs(const TrainingSetup& setup, int64_t micro_batch, Attention attention,
                                   const ActivationFramework& framework = {}, bool selective = false);

// Bytes one decoder block keeps for backward, no checkpointing, on one rank of in.tp x in.cp.
int64_t block_activation_bytes(const ModelSpec& model, const ActivationInputs& in);

// Bytes kept by the final RMSNorm and lm_head input (the loss itself is separate).
int64_t head_activation_bytes(const ModelSpec& model, const ActivationInputs& in);

// Bytes of activations for `num_layers` blocks (+ the head when `with_head`), under checkpointing:
// none keeps every block's tensors; full keeps each block input and one block's tensors again
// while it is recomputed.
int64_t activation_bytes_for_layers(const ModelSpec& model, const ActivationInputs& in,
                                    int64_t num_layers, bool with_head, Checkpointing checkpointing);

// The loss's peak: the fp32 log-softmax kept for backward (4·T·V), its gradient (4·T·V) and the
// gradient of the fp32 logits (4·T·V) are alive together inside log_softmax's backward = 12·T·V.
// The logits themselves are not kept (the cast and the linear need no output for backward).
int64_t logits_loss_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len);

// Token-expert pairs the rank's experts compute per token of its own, e.g. top_k, or top_k x
// imbalance_factor under expert parallelism, or top_k x capacity_factor; 0 for dense models.
double expert_pairs_per_token(const ModelSpec& model, const ActivationInputs& in);

// The load-balancing loss (transformers' load_balancing_loss_func): every MoE layer's router logits kept
// (a·L·T·experts) and the fp32 softmax of their concatenation (4·L·T·experts), from the model's forward to
// the loss's backward; `peak`: plus its one-hot expert mask (int64) and the mask's fp32 copy,
// 12·L·T·top_k·experts, alive while it is computed.
int64_t aux_loss_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, Precision precision, bool peak);

// The final logit soft-cap (logits = cap·tanh(logits/cap), Gemma2ForCausalLM.forward): tanh's output in
// the logits' dtype (a·B·S·vocab) is kept for backward from forward through the loss. 0 without a cap.
// Counted where the loss takes whole logits (the full loss); chunked and fused-linear losses cap chunk
// by chunk inside their kernels.
int64_t logit_softcap_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, Precision precision);

}  // namespace ftplan
