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
  in.fused_norm_mlp = fw.fused_norm_mlp;
  in.selective = selective;
  in.selective_every_second_matmul = fw.selective_every_second_matmul;
  in.quantized_saves_input = fw.quantized_saves_input;
  in.sp_keeps_gathered_input = fw.sp_keeps_gathered_input;
  // amp under autocast: an fp32 embedding (full fine-tuning) starts an fp32 residual stream;
  // FSDP's mixed precision computes with bf16 parameters instead.
  // (fw.autocast: the caller's judgement that autocast meets fp32 weights for this job and strategy.)
  in.residual_bytes = setup.precision == Precision::fp32 || (setup.precision == Precision::amp && fw.autocast) ? 4 : 2;
  in.imbalance_factor = setup.moe.imbalance_factor;
  in.capacity_factor = setup.moe.capacity_factor.value_or(0.0);
  return in;
}

// Sizes are products of user input: computed in double and saturated at 2^59 bytes, so absurd
// sizes give absurd (never wrapped) answers.
int64_t saturate(double bytes) { return static_cast<int64_t>(std::min(bytes, 576460752303423488.0)); }

namespace {

// One RMSNorm over `width` features per token with `rows` rstd values per token: the fp32 upcast of
// its input (compiled: the input as it arrives, `arrives` bytes), the fp32 rstd, and, when its weight
// trains, the normalised input (fp32 where the family scales by (1 + weight) in fp32: Gemma).
double norm_bytes(const ModelSpec& m, const ActivationInputs& in, double T, double width, double rows, double arrives) {
  const double a = activation_bytes(in.precision);
  if (in.fused_norm_mlp && !in.compile) return arrives * T * width + 4.0 * T * rows;  // Liger: X and RSTD
  return (in.compile ? arrives : 4.0) * T * width + 4.0 * T * rows +
         (base_trains(in) ? (m.norm_scale_fp32 ? 4.0 : a) * T * width : 0.0);
}

// Whether any linear of `role` keeps the input the group shares.
bool keeps_role_input(const ActivationInputs& in, const std::vector<LinearShape>& linears, LinearRole role) {
  for (const auto& lin : linears)
    if (lin.role == role && keeps_input(in, lin.name)) return true;
  return false;
}

}  // namespace

int64_t split_activation_bytes(const ActivationTerms& t, int64_t tp, bool sequence_parallel, int64_t cp) {
  const double seq_div = double(std::max<int64_t>(1, cp)) * double(sequence_parallel ? std::max<int64_t>(1, tp) : 1);
  const double cp_div = double(std::max<int64_t>(1, cp));
  return saturate(t.sequence / seq_div + (t.tensor + t.replicated) / cp_div);
}

double expert_pairs_per_token(const ModelSpec& m, const ActivationInputs& in) {
  if (!m.moe.active()) return 0;
  const double load = in.capacity_factor > 0 ? in.capacity_factor : in.ep > 1 ? in.imbalance_factor : 1.0;
  return double(m.moe.top_k) * load;
}

namespace {

// One block of one kind: a MoE model's MoE block (moe_layer) or a dense block.
ActivationTerms layer_activation_terms(const ModelSpec& m, const ActivationInputs& in, bool moe_layer) {
  const double a = activation_bytes(in.precision);
  const double r = in.residual_bytes;
  const double T = static_cast<double>(in.micro_batch) * in.seq_len;
  const int64_t tp = std::max<int64_t>(1, in.tp);
  const double h = m.hidden_size;
  // One tensor-parallel rank's heads and MLP columns; KV heads fewer than tp are replicated.
  const double heads = double(m.num_heads) / tp, q = double(m.q_dim()) / tp, i = double(m.intermediate_size) / tp;
  const double kv_heads = m.num_kv_heads >= tp ? double(m.num_kv_heads) / tp : 1.0;
  const double kv_dim = kv_heads * m.head_dim;
  const double kv = in.gqa_kv_repeated ? q : kv_dim;
  const double scores = static_cast<double>(in.micro_batch) * heads * in.seq_len * in.seq_len;
  const double lse = 4.0 * in.micro_batch * heads * in.seq_len;
  // A mixture of experts is never split by tensor parallelism (parallelism_problems): its linears are whole.
  const std::vector<LinearShape> linears = m.moe.active() ? layer_linears(m, moe_layer) : block_linears(m);
  const std::vector<LinearShape> rank_linears = m.moe.active() ? linears : block_linears(m, tp);
  auto column = [](const LinearShape& l) { return l.role == LinearRole::attention_in || l.role == LinearRole::mlp_in; };
  // Mixture of experts: token-expert pairs the rank's experts compute, and those of its own tokens.
  const double pairs_x = T * expert_pairs_per_token(m, in);
  const double pairs_own = T * double(m.moe.top_k);
  ActivationTerms t;
  // torchtitan's op-level selective checkpointing: the block input, every second matmul's output
  // (q_proj, v_proj, gate_proj, down_proj in forward order), the attention kernel's output and
  // log-sum-exp; everything else is recomputed from them (LoRA adapters included). A MoE block keeps every
  // second attention matmul, the router's logits, each pair's first expert projection and the combined output.
  if (in.selective && in.selective_every_second_matmul) {
    t.sequence = r * T * h;
    if (moe_layer) {
      std::vector<LinearShape> attention;
      for (const auto& lin : linears)
        if (!is_mlp_role(lin.role)) attention.push_back(lin);
      for (size_t k = 0; k < attention.size(); k += 2) t.tensor += a * T * attention[k].out_features;
      for (const auto& lin : linears)
        if (lin.role == LinearRole::expert_in) {
          t.tensor += a * pairs_x * lin.out_features;
          break;
        }
      t.tensor += a * T * m.moe.num_experts + a * pairs_own * h + a * T * q + lse;
      return t;
    }
    for (size_t k = 0; k < linears.size(); k += 2)
      (column(linears[k]) ? t.tensor : t.sequence) += a * T * (column(linears[k]) ? rank_linears[k].out_features : linears[k].out_features);
    t.tensor += a * T * q + lse;
    return t;
  }

  // The block's RMSNorms of hidden_size (Llama: two; Gemma: four; OLMo 2: two, after each sublayer).
  t.sequence += m.block_norms() * norm_bytes(m, in, T, h, 1, r);
  // q/k RMSNorms on the projections' outputs: per head (Qwen3, Gemma 3: an rstd per head) or over the
  // whole projection (OLMo 2: one rstd per token).
  if (m.qk_norm == QkNorm::per_head)
    t.tensor += norm_bytes(m, in, T, q, heads, a) + norm_bytes(m, in, T, kv_dim, kv_heads, a);
  if (m.qk_norm == QkNorm::whole_projection)
    t.tensor += norm_bytes(m, in, T, q, 1, a) + norm_bytes(m, in, T, kv_dim, 1, a);
  // The input each group of linears shares (the norm's output; OLMo 2: the residual stream), kept when
  // one of them trains: a sequence shard under sequence parallelism (Korthikanti et al. 2022, sec.
  // 4.2.2: Megatron keeps the shard and all-gathers it again in backward), or the all-gathered input
  // whole on every tp rank where the framework's matmul keeps what it was given.
  double& shared_input = in.sp_keeps_gathered_input ? t.replicated : t.sequence;
  if (keeps_role_input(in, linears, LinearRole::attention_in)) shared_input += a * T * h;
  if (keeps_role_input(in, linears, LinearRole::mlp_in)) shared_input += a * T * h;
  // Attention. Soft-capped scores (Gemma 2) keep tanh's output under eager attention; the fused
  // kernels cap inside. A sliding window does not shrink eager attention: transformers computes the
  // full S x S scores and masks the window (gemma2 eager_attention_forward), so local layers keep the
  // same tensors as global ones.
  if (m.mla.active()) {
    // Latent attention: q and k of heads·(nope + rope), v and the output of heads·v_head_dim (one KV head per
    // query head); the latent norms and, when q_b_proj / kv_b_proj train, their inputs.
    const double v = double(m.v_dim()), o = double(m.attn_out_dim());
    const double qr = double(m.mla.q_lora_rank), kvr = double(m.mla.kv_lora_rank);
    t.tensor += norm_bytes(m, in, T, kvr, 1, a) + (qr > 0 ? norm_bytes(m, in, T, qr, 1, a) : 0.0);
    for (const auto& lin : linears)
      if (lin.role == LinearRole::attention_latent && keeps_input(in, lin.name)) t.tensor += a * T * lin.in_features;
    if (in.attention == Attention::fused)
      t.tensor += a * T * (q + q + v) + a * T * o + (in.selective ? 0 : lse);
    else
      t.tensor += a * T * (q + q + v) + (in.selective ? 0 : 4 * scores + (a == 2 ? 2 * scores : 0));
    if (keeps_role_input(in, linears, LinearRole::attention_out)) t.tensor += a * T * o;
  } else if (in.attention == Attention::fused) {
    t.tensor += a * T * (q + 2 * kv) + a * T * q + (in.selective ? 0 : lse);
  } else {
    const double capped = m.attn_logit_softcapping > 0 ? a * scores : 0;
    t.tensor += 3 * a * T * q + (in.selective ? 0 : 4 * scores + (a == 2 ? 2 * scores : 0) + capped);
  }
  // A fused qkv_proj (Phi-3): v is a view into the projection's output, so where attention saves v as
  // it comes (not copied by repeat_kv: one kv head per query head, or a fused kernel given the kv heads)
  // the q and k parts of that output stay alive too.
  if (m.fused_qkv) {
    const bool copied = m.num_kv_heads < m.num_heads && (in.attention == Attention::eager || in.gqa_kv_repeated);
    if (!copied) t.tensor += a * T * (q + kv_dim);
  }
  if (!m.mla.active() && keeps_role_input(in, linears, LinearRole::attention_out)) t.tensor += a * T * q;
  if (moe_layer) {
    // The MoE block: the MLP norm's output when the router or the shared expert reads it to train; the
    // router's softmax and top-k; per pair the experts' tensors; per own pair the expert output the routing
    // weight multiplies; the shared expert as a dense MLP of its width, scaled by its sigmoid gate.
    const MoeSpec& e = m.moe;
    const double I = double(e.expert_intermediate_size), sw = double(e.shared_intermediate_size);
    // (Once: a trained shared expert's gate/up already keep it, as the MLP's shared input above.)
    if (keeps_role_input(in, linears, LinearRole::router) && !keeps_role_input(in, linears, LinearRole::mlp_in))
      t.sequence += a * T * h;
    t.tensor += 4.0 * T * e.num_experts + 12.0 * T * e.top_k + a * T * e.top_k;
    if (keeps_role_input(in, linears, LinearRole::expert_in)) t.tensor += a * pairs_x * h;
    if (in.compile) {
      t.tensor += 2 * a * pairs_x * I + 2 * a * T * sw;
    } else {
      // Per pair SwiGLU keeps gate, up and silu(gate) (3·I); gpt-oss's clamped GLU (MoeSpec::swiglu_limit,
      // GptOssExperts.forward) keeps 6·I: gate_up (2·I, alive as the input of the clamps on its two strided
      // views), the clamped gate, sigmoid(1.702·gate), glu and up + 1 (the product's two inputs). Measured by
      // ftexec on tests/data/models/tiny-gpt-oss.json: activations within 1% with it, 10.5% under without.
      t.tensor += (e.swiglu_limit > 0 ? 6 : 3) * a * pairs_x * I + 3 * a * T * sw;
      if (keeps_role_input(in, linears, LinearRole::expert_out)) t.tensor += a * pairs_x * I;
      if (sw > 0 && keeps_role_input(in, linears, LinearRole::mlp_out)) t.tensor += a * T * sw;
    }
    t.tensor += a * pairs_own * h;
    if (e.shared_expert_gate) t.tensor += a * T + a * T * h;
  } else if (in.fused_norm_mlp && !in.compile) {
    // Liger's SiLU-mul keeps gate and up; its output is down_proj's input, kept where down_proj trains.
    t.tensor += 2 * a * T * i;
    if (keeps_role_input(in, linears, LinearRole::mlp_out)) t.tensor += a * T * i;
  } else if (in.compile) {
    // Gated MLP (SwiGLU or GeGLU): gate, act(gate), up; the product feeds down_proj. A fused gate_up_proj
    // keeps the same bytes: its output (2·i, held by the gate and up views) and act(gate). Compiled:
    // gate and up only.
    t.tensor += 2 * a * T * i;
  } else {
    t.tensor += 3 * a * T * i;
    if (keeps_role_input(in, linears, LinearRole::mlp_out)) t.tensor += a * T * i;
  }
  // LoRA adapters: A's rank-r output is whole on every tensor-parallel rank (A is replicated on a
  // column-parallel linear; on a row-parallel one its partial outputs are all-reduced); with dropout,
  // the dropped-out input (the shared input of a column-parallel linear, one rank's columns of a
  // row-parallel one) and its mask.
  // An expert's adapter runs on each pair dispatched to it.
  if (in.method != Method::full) {
    for (size_t k = 0; k < linears.size(); ++k) {
      const auto& lin = linears[k];
      if (!contains(in.lora.targets, lin.name)) continue;
      const double rows = is_expert_role(lin.role) ? pairs_x : T;
      t.replicated += a * rows * in.lora.rank;
      if (in.lora.dropout > 0.0)
        (column(lin) ? t.sequence : t.tensor) += (a + 1) * rows * (column(lin) ? lin.in_features : rank_linears[k].in_features);
    }
  }
  return t;
}

}  // namespace

ActivationTerms block_activation_terms(const ModelSpec& m, const ActivationInputs& in) {
  if (!m.moe.active()) return layer_activation_terms(m, in, false);
  const ActivationTerms moe = layer_activation_terms(m, in, true);
  if (m.moe.uniform()) return moe;
  // Blocks of two kinds: the mean block.
  const ActivationTerms dense = layer_activation_terms(m, in, false);
  const double n = double(m.moe.num_moe_layers()), L = double(m.num_layers);
  auto mean = [&](double x, double y) { return (n * x + (L - n) * y) / L; };
  return {mean(moe.sequence, dense.sequence), mean(moe.tensor, dense.tensor), mean(moe.replicated, dense.replicated)};
}

int64_t block_activation_bytes(const ModelSpec& m, const ActivationInputs& in) {
  return split_activation_bytes(block_activation_terms(m, in), in.tp, in.sequence_parallel, in.cp);
}

int64_t head_activation_bytes(const ModelSpec& m, const ActivationInputs& in) {
  const double a = activation_bytes(in.precision);
  const double T = static_cast<double>(in.micro_batch) * in.seq_len;
  const double h = m.hidden_size;
  ActivationTerms t;
  t.sequence = norm_bytes(m, in, T, h, 1, in.residual_bytes);  // final RMSNorm
  if (base_trains(in)) (in.sp_keeps_gathered_input ? t.replicated : t.sequence) += a * T * h;  // lm_head input
  return split_activation_bytes(t, in.tp, in.sequence_parallel, in.cp);
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

int64_t aux_loss_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, Precision precision, bool peak) {
  if (!m.moe.active()) return 0;
  const double T = static_cast<double>(micro_batch) * seq_len;
  const double LTE = double(m.moe.num_moe_layers()) * T * double(m.moe.num_experts);
  const double kept = (activation_bytes(precision) + 4.0) * LTE;
  return saturate(kept + (peak ? 12.0 * LTE * double(m.moe.top_k) : 0.0));
}

int64_t logit_softcap_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, Precision precision) {
  if (m.final_logit_softcapping <= 0) return 0;
  return saturate(double(activation_bytes(precision)) * micro_batch * seq_len * m.vocab_size);
}

}  // namespace ftplan
