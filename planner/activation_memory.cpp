#include "planner/activation_memory.h"

#include <algorithm>

#include "planner/precision.h"

namespace ftplan {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool base_trains(const ActivationInputs& in) { return in.method == Method::full; }

// A linear layer's input is kept when its own weight trains, a LoRA adapter (without dropout) reads
// it, or its 4-bit matmul keeps it (bitsandbytes < 0.43.2).
bool keeps_input(const ActivationInputs& in, const std::string& module) {
  if (base_trains(in)) return true;
  if (in.method == Method::qlora && in.quantized_saves_input) return true;
  return contains(in.lora.targets, module) && in.lora.dropout == 0.0;
}

}  // namespace

ActivationInputs activation_inputs(const TrainingSetup& setup, int64_t micro_batch, Attention attention,
                                   const ActivationFramework& fw, bool selective) {
  ActivationInputs in;
  in.micro_batch = micro_batch;
  in.seq_len = setup.memory_seq_len();
  in.precision = setup.precision;
  in.attention = attention;
  in.method = setup.method;
  in.lora = setup.lora;
  in.gqa_kv_repeated = fw.gqa_kv_repeated;
  in.compile = setup.compile;
  in.selective = selective;
  in.selective_every_second_matmul = fw.selective_every_second_matmul;
  in.quantized_saves_input = fw.quantized_saves_input;
  // amp under autocast: an fp32 embedding (full fine-tuning) starts an fp32 residual stream;
  // FSDP's mixed precision computes with bf16 parameters instead.
  // (fw.autocast: the caller's judgement that autocast meets fp32 weights for this job and strategy.)
  in.residual_bytes = setup.precision == Precision::fp32 || (setup.precision == Precision::amp && fw.autocast) ? 4 : 2;
  return in;
}

// Sizes are products of user input: computed in double and saturated at 2^59 bytes, so absurd
// sizes give absurd (never wrapped) answers.
int64_t saturate(double bytes) { return static_cast<int64_t>(std::min(bytes, 576460752303423488.0)); }

int64_t block_activation_bytes(const ModelSpec& m, const ActivationInputs& in) {
  const double a = activation_bytes(in.precision);
  const double r = in.residual_bytes;
  const double T = static_cast<double>(in.micro_batch) * in.seq_len;
  const double h = m.hidden_size, q = m.q_dim(), i = m.intermediate_size;
  const double kv = in.gqa_kv_repeated ? q : m.kv_dim();
  const double scores = static_cast<double>(in.micro_batch) * m.num_heads * in.seq_len * in.seq_len;
  const double lse = 4.0 * in.micro_batch * m.num_heads * in.seq_len;
  // torchtitan's op-level selective checkpointing: the block input, every second matmul's output
  // (q_proj, v_proj, gate_proj, down_proj in forward order), the attention kernel's output and
  // log-sum-exp; everything else is recomputed from them (LoRA adapters included).
  if (in.selective && in.selective_every_second_matmul)
    return saturate(r * T * h + a * T * (q + m.kv_dim() + i + h) + a * T * q + lse);

  // Two RMSNorms: the fp32 upcast of the input (compiled: the input as it arrives), the fp32 rstd,
  // and the normalised input when the norm weight trains.
  double bytes = 2 * ((in.compile ? r : 4) * T * h + 4 * T + (base_trains(in) ? a * T * h : 0));
  // Norm outputs, shared by the linears that read them.
  if (keeps_input(in, "q_proj") || keeps_input(in, "k_proj") || keeps_input(in, "v_proj")) bytes += a * T * h;
  if (keeps_input(in, "gate_proj") || keeps_input(in, "up_proj")) bytes += a * T * h;
  // Attention.
  if (in.attention == Attention::fused) {
    bytes += a * T * (q + 2 * kv) + a * T * q + (in.selective ? 0 : 4 * in.micro_batch * m.num_heads * in.seq_len);
  } else {
    bytes += 3 * a * T * q + (in.selective ? 0 : 4 * scores + (a == 2 ? 2 * scores : 0));
  }
  if (keeps_input(in, "o_proj")) bytes += a * T * q;
  // SwiGLU: gate, SiLU(gate), up; the product feeds down_proj. Compiled: gate and up only.
  if (in.compile) {
    bytes += 2 * a * T * i;
  } else {
    bytes += 3 * a * T * i;
    if (keeps_input(in, "down_proj")) bytes += a * T * i;
  }
  // LoRA adapters.
  if (in.method != Method::full) {
    for (const auto& lin : block_linears(m)) {
      if (!contains(in.lora.targets, lin.name)) continue;
      bytes += a * T * in.lora.rank;
      if (in.lora.dropout > 0.0) bytes += (a + 1) * T * lin.in_features;
    }
  }
  return saturate(bytes);
}

int64_t head_activation_bytes(const ModelSpec& m, const ActivationInputs& in) {
  const double a = activation_bytes(in.precision);
  const double T = static_cast<double>(in.micro_batch) * in.seq_len;
  const double h = m.hidden_size;
  double bytes = (in.compile ? in.residual_bytes : 4) * T * h + 4 * T;  // final RMSNorm
  if (base_trains(in)) bytes += a * T * h + a * T * h;  // normalised input; lm_head input
  return saturate(bytes);
}

int64_t activation_bytes_for_layers(const ModelSpec& m, const ActivationInputs& in, int64_t num_layers,
                                    bool with_head, Checkpointing checkpointing) {
  if (num_layers <= 0 && !with_head) return 0;
  const double block = block_activation_bytes(m, in);
  const double head = with_head ? head_activation_bytes(m, in) : 0;
  if (checkpointing == Checkpointing::none) return saturate(num_layers * block + head);
  // Full checkpointing: each block's input stays; one block is recomputed at a time in backward.
  const double block_input = static_cast<double>(in.residual_bytes) * in.micro_batch * in.seq_len * m.hidden_size;
  return saturate(num_layers * block_input + (num_layers > 0 ? block : 0) + head);
}

int64_t logits_loss_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len) {
  return saturate(12.0 * micro_batch * seq_len * m.vocab_size);
}

}  // namespace ftplan
