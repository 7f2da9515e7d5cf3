// FLOPs of a training step from the model spec, and the time they take at an assumed efficiency.
// Matmul FLOPs per token: 2 per weight in forward (Kaplan et al. 2020, sec. 2.1); backward is
// 2x forward when weights train (input and weight gradients) and 1x for frozen weights (input
// gradients only), so full fine-tuning costs 6·N·tokens and LoRA about 4·N·tokens. Attention
// scores add 4·S·q_dim per token per layer forward (PaLM, Chowdhery et al. 2022, app. B), and 2x
// that in backward; a sliding-window layer (Mistral, Gemma 2/3, Phi-3) adds 4·min(S, window)·q_dim
// under fused attention (flash-attention's window skips the blocks outside it) and the full 4·S·q_dim
// under eager attention (the window is a mask). Fused projections (Phi-3's qkv_proj, gate_up_proj)
// count the same FLOPs as the separate ones. Full checkpointing recomputes every block's forward once.
// A mixture of experts counts its active parameters: the router, the shared expert and top_k routed
// experts per token (Mixtral: 2 of 8); latent attention (DeepSeek) 2·S·(heads·(nope + rope) + heads·v_head_dim).
#pragma once

#include <cstdint>
#include <vector>

#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

struct FlopsPerToken {
  double forward = 0;        // whole model, one token
  double backward = 0;
  double block_forward = 0;  // what full checkpointing recomputes (all blocks)
  double model = 0;          // forward + backward, no recompute: the MFU numerator
  // The pieces, forward, per token: one block's matmuls, attention scores (the mean over the layers
  // where local and global layers differ) and LoRA adapters, and the lm_head. Backward per block: input gradients matmul + 2·attention + lora, weight gradients
  // matmul (when weights train) + lora.
  double block_matmul = 0, block_attention = 0, block_lora = 0, head = 0;
  double block_expert = 0;   // the routed experts' part of block_matmul (top_k experts per token), e.g. for the
                             // busiest expert-parallel rank's extra load
  bool weights_train = false;
  // What the kernels execute, for time: fused (flash) causal attention skips the key blocks above the
  // diagonal and outside a sliding window, about half of a global layer's QK^T and P·V; eager attention
  // computes them all (compute_model.cpp). Per token, like the figures above; the model FLOPs above stay
  // the MFU numerator.
  double block_attention_executed = 0;
  double forward_executed = 0, backward_executed = 0, block_forward_executed = 0;
};

// The row length a step is timed at: seq_len when rows are packed (or no mean is given), else the dataset's
// mean row length (at most seq_len), padding not counted (issue 11: "memory from the longest batch the data
// can produce; time from the mean"). Both the tokens of a micro-batch (step_time.h micro_batch_tokens) and
// the keys a query attends over (flops_per_token's S) come from it.
double timed_row_tokens(const TrainingSetup& setup);

FlopsPerToken flops_per_token(const ModelSpec& model, const TrainingSetup& setup);
// The same, saying whether a fused kernel may skip the blocks above the causal diagonal: false where the
// framework hands SDPA an explicit mask (padded batches under transformers), which then runs every block;
// the two-argument form assumes it may (is_causal).
FlopsPerToken flops_per_token(const ModelSpec& model, const TrainingSetup& setup, bool causal_blocks_skipped);

// Dense peak FLOP/s used for the job's precision: bf16 tensor cores under mixed/bf16; fp32 under
// fp32 (PyTorch leaves TF32 matmuls off by default since 1.12).
double peak_flops(const HardwareSpec& hw, Precision precision);

// The efficiency used: the user's --efficiency, else the hwdb's matmul_efficiency.
double compute_efficiency(const HardwareSpec& hw, const TrainingSetup& setup);

// The achieved FLOP/s of each piece of the work for a micro-batch of `rows` token rows per rank (after
// context parallelism's split), from the hardware's efficiency model (hardware_spec.h EfficiencyModel):
// each GEMM at the efficiency of its smallest dimension (rows, or its in or out features as one
// tensor-parallel rank holds them; a routed expert sees rows·top_k·ep / num_experts rows; a LoRA
// adapter's smallest dimension is its rank), a piece's rate the FLOP-weighted harmonic mean over its
// GEMMs; attention at its own efficiency. The anchors: a calibration's, else the hwdb's per-shape table
// (hwdb_gemm_anchors). Where there are none, or the user gave --efficiency, every piece runs at `rate` and
// `uniform` is true (the one-rate sums are kept exactly).
struct PieceRates {
  double block_matmul = 0, attention = 0, lora = 0, head = 0;  // FLOP/s
  double rate = 0;        // the uniform rate: peak · compute_efficiency
  bool uniform = true;
};
PieceRates piece_rates(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup, double rows,
                       int64_t tp = 1, int64_t ep = 1);

// The GEMM anchors the hwdb implies for a step (none where the file has no measured per-shape GEMM table
// or the step runs fp32): the measured bf16 GEMM efficiency at each anchor (hardware_spec.h
// gemm_efficiency_bf16) relative to the largest anchor's, times `efficiency` (the training-level
// matmul_efficiency). The measured table holds one GEMM in isolation, back to back at full clocks; a training
// step's GEMMs reach about half of that at their largest shapes (torchtitan's Llama 3.1 8B rows on H100:
// matmul_efficiency 0.40 predicts them within 7%, the table's 0.83 at 4096 predicts them 77-94% too fast,
// README "How accurate is it"), so the table gives how much slower a smaller shape runs, and matmul_efficiency
// the level of the largest.
std::vector<double> hwdb_gemm_anchors(const HardwareSpec& hw, Precision precision, double efficiency);

// GEMM efficiency at a smallest dimension, from the model's three anchors (log2-interpolated, held
// beyond the ends); `fallback` where the model has none.
double gemm_efficiency(const EfficiencyModel& eff, double fallback, double smallest_dim);

// Seconds per token of the whole model's forward and backward (weights' gradients where they train)
// at these rates; the one-rate sums forward / rate and backward / rate when uniform.
double forward_s_per_token(const ModelSpec& model, const FlopsPerToken& f, const PieceRates& r);
double backward_s_per_token(const ModelSpec& model, const FlopsPerToken& f, const PieceRates& r);
// One block's forward at these rates (what full checkpointing recomputes, per block), per token.
double block_forward_s_per_token(const FlopsPerToken& f, const PieceRates& r);

// The element-wise work of one block that eager modules move beyond what fused kernels move, bytes per
// token, forward (the framework's per-element counts, framework.h eager_*): RMSNorm (two per block) over
// hidden_size, rotary embedding over q_dim + kv_dim, the gated MLP's activation over intermediate_size, each
// less what one fused kernel moves (read the inputs once, write the output once: 4 B per hidden element for
// a norm, 4 per q/k element for RoPE, 6 per intermediate element for silu(gate) x up; what torch.compile's
// generated kernels do, and what fused training stacks run). The hwdb's efficiencies come from fused stacks
// (Megatron-LM's A100 runs and the fractions derived from them; torchtitan's and Megatron-LM's H100 runs), so
// they hold the fused element-wise time already: the eager surplus is time on top, at HBM bandwidth; 0 under
// --compile (the framework compiles each block). Residual adds, transposes and the loss are not counted
// (fused or not, they move about the same bytes per block). Backward is counted at twice the forward (each
// op's backward reads its saved inputs and the output gradient and writes the input gradient), full
// checkpointing's recompute at once more (step_time.cpp, simulator/plan_inputs.cpp).
double eager_elementwise_bytes_per_token(const ModelSpec& model, const FrameworkProfile& fw, const TrainingSetup& setup);

// QLoRA dequantises every NF4 weight before each use: a memory-bound pass reading 0.516 B and
// writing 2 B per parameter at HBM bandwidth.
double nf4_dequant_time_s(int64_t nf4_params, const HardwareSpec& hw);

// Bytes the optimizer step reads and writes per trainable parameter, from the widths it touches
// (precision.h: P the weight the optimizer updates, the fp32 master where there is one; G the gradient;
// S one moment) and the implementation (configs/frameworks: optimizer.implementation):
//   fused AdamW (torch's _fused_adamw_, DeepSpeed's FusedAdam, and bitsandbytes' 8-bit AdamW, one
//     kernel per group): reads p, g, m, v, writes p, m, v: 2P + G + 4S;
//   foreach AdamW (torch.optim.AdamW's default, _multi_tensor_adamw in torch/optim/adamw.py): one pass
//     per _foreach op: p *= 1 - lr*wd (2P), lerp_(m, g) (2S + G), mul_(v) (2S), addcmul_(v, g, g)
//     (2S + 2G), denom = sqrt(v) (2S), div_ (2S), add_(eps) (2S), addcdiv_(p, m, denom) (2P + 2S):
//     4P + 3G + 14S;
//   SGD with momentum: fused 2P + G + 2S; foreach mul_(buf), add_(buf, g), add_(p, buf): 2P + G + 5S.
// A separate working copy (mixed precision's bf16 weights beside the fp32 master) is refreshed after the
// step: + P read + W written. E.g. pure bf16 AdamW: 14 B fused, 42 B foreach; fp32 (amp) AdamW foreach 84 B.
// paged: bitsandbytes' Paged* optimizers run their own fused kernel (optimizer_update_32bit /
// _8bit_blockwise) whatever the framework's foreach default, with fp32 moments under 32-bit.
double optimizer_step_bytes_per_param(Precision precision, Optimizer optimizer, bool foreach, bool paged = false);

// The optimizer step: a memory-bound pass over `bytes_per_param` per trainable parameter at HBM
// bandwidth. A calibration scales the bandwidth (EfficiencyModel::optimizer_bandwidth_factor).
double optimizer_step_time_s(double trainable_params, const HardwareSpec& hw, double bytes_per_param);

// DeepSpeed's CPU-Adam on the host for offload: ~1e9 parameters per second per GPU's process
// (estimate from the ZeRO-Offload paper's Table 3 order of magnitude).
constexpr double kCpuAdamParamsPerS = 1e9;

}  // namespace ftplan
