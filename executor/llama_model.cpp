#include "executor/llama_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "executor/context_parallel.h"
#include "executor/lora.h"
#include "executor/mxfp4.h"
#include "executor/tensor_parallel.h"
#include "executor/torch_compat.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/model_family.h"

namespace ftexec {
namespace fs = std::filesystem;
namespace {

constexpr double kInitStd = 0.02;  // HF LlamaConfig.initializer_range

// Every Linear a block can hold (an unused one has no weight): Llama's seven, Phi-3's fused two and
// DeepSeek's latent-attention four.
const char* const kLinearNames[] = {"q_proj",    "k_proj",   "v_proj",             "o_proj",   "qkv_proj",
                                    "gate_proj", "up_proj",  "down_proj",          "gate_up_proj",
                                    "q_a_proj",  "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_string(const std::vector<int64_t>& shape) { return shape_to_string(shape); }

// ---- building blocks ---------------------------------------------------------------------------

// HF LlamaRMSNorm: the input upcast to fp32 (kept for backward), rstd in fp32 (kept), the normalised
// input cast back (kept when the weight trains), times the weight. The mean of squares is written
// as sum / h: in libtorch 1.13 `mean`'s backward keeps its whole input, so HF's x.pow(2).mean()
// would keep x² (another 4·T·h bytes per norm) alive until backward; sum keeps only sizes, and
// the result is the same (checked bit for bit on the tiny config).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const double inv_h = 1.0 / static_cast<double>(x.size(-1));
  const at::Tensor rstd = at::rsqrt(xf.pow(2).sum({-1}, /*keepdim=*/true).mul(inv_h).add(eps));
  return weight * (xf * rstd).to(x.scalar_type());
}

// An RMSNorm as the spec's family computes it. Llama (rms_norm above); Gemma2RMSNorm / Gemma3RMSNorm
// (norm_scale_fp32): (x_fp32 · rstd) · (1 + w) in fp32, cast back (transformers
// models/gemma2/modeling_gemma2.py @ 006e86931247d7bacf94ad00ada1fb6baf11e94b); Olmo2RMSNorm
// (norm_cast_after_scale): (w · x_fp32 · rstd), cast back (models/olmo2/modeling_olmo2.py @
// 000c33fdfde12e1ffafbfcdb3c926df5727a00b6). All three agree in fp32 but for Gemma's 1 + w.
at::Tensor spec_norm(const ftplan::ModelSpec& s, const at::Tensor& x, const at::Tensor& weight) {
  if (!s.norm_scale_fp32 && !s.norm_cast_after_scale) return rms_norm(x, weight, s.rms_norm_eps);
  const at::Tensor xf = x.to(at::kFloat);
  const double inv_h = 1.0 / static_cast<double>(x.size(-1));
  const at::Tensor rstd = at::rsqrt(xf.pow(2).sum({-1}, /*keepdim=*/true).mul(inv_h).add(s.rms_norm_eps));
  const at::Tensor scale = s.norm_scale_fp32 ? weight.to(at::kFloat) + 1.0 : weight.to(at::kFloat);
  return (xf * rstd * scale).to(x.scalar_type());
}

// The norm where the block has one (its weight defined), else x itself.
at::Tensor optional_norm(const ftplan::ModelSpec& s, const at::Tensor& x, const at::Tensor& weight) {
  return weight.defined() ? spec_norm(s, x, weight) : x;
}

// The gated MLP's activation: SwiGLU's silu, GeGLU's gelu with the tanh approximation (transformers
// ACT2FN["gelu_pytorch_tanh"] = nn.functional.gelu(approximate="tanh")); llama_create refuses others.
at::Tensor activation(const ftplan::ModelSpec& s, const at::Tensor& x) {
  return s.hidden_act == "gelu_pytorch_tanh" ? at::gelu(x, "tanh") : at::silu(x);
}

// cap · tanh(x / cap): Gemma 2's attention scores and final logits (eager_attention_forward,
// Gemma2ForCausalLM.forward).
at::Tensor soft_cap(const at::Tensor& x, double cap) { return at::tanh(x / cap) * cap; }

at::Tensor linear(const Linear& l, const at::Tensor& x, bool training) {
  at::Tensor y;
  if (l.nf4) {  // QLoRA: dequantized just for this matmul (and again for its backward)
    y = nf4_linear(x, *l.nf4);
    if (l.bias.defined()) y = y + l.bias;
  } else {
    y = at::linear(x, l.weight, l.bias);
  }
  if (l.lora) y = y + lora_forward(*l.lora, x, training);
  return y;
}

// HF rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

// HF repeat_kv: [B, kv, S, d] -> [B, kv * n_rep, S, d] (a copy, kept by the attention matmuls).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto B = x.size(0), kv = x.size(1), S = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n_rep, S, d}).reshape({B, kv * n_rep, S, d});
}

// cos and sin [S, head_dim] of positions 0..S-1 in the compute dtype (HF's rotary embedding: fp32 angles).
std::pair<at::Tensor, at::Tensor> rope_tables(const ftplan::ModelSpec& spec, int64_t seq_len, const at::TensorOptions& opts) {
  const auto inv = rope_inv_freq(spec, seq_len);
  at::Tensor inv_freq = at::empty({static_cast<int64_t>(inv.size())}, at::kFloat);
  for (size_t i = 0; i < inv.size(); ++i) inv_freq[i] = static_cast<float>(inv[i]);
  at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kFloat));
  at::Tensor freqs = at::outer(pos, inv_freq);    // [S, d/2], fp32 as HF computes it
  at::Tensor emb = at::cat({freqs, freqs}, -1);  // [S, d]
  const double scaling = rope_attention_scaling(spec);  // YaRN: cos and sin scaled in fp32, then cast
  if (scaling != 1.0) return {(emb.cos() * scaling).to(opts), (emb.sin() * scaling).to(opts)};
  return {emb.cos().to(opts), emb.sin().to(opts)};
}

void ensure_caches(LlamaModel& m, int64_t seq_len) {
  if (m.cached_seq_len == seq_len) return;
  at::NoGradGuard no_grad;
  auto opts = at::TensorOptions().dtype(m.options.dtype).device(m.options.device);
  std::tie(m.rope_cos, m.rope_sin) = rope_tables(m.spec, seq_len, opts);
  if (m.spec.rope_local_base_freq > 0) {
    // Gemma3TextModel: the sliding layers' rotary embedding has base rope_local_base_freq and default RoPE
    // (models/gemma3/modeling_gemma3.py @ 0018aa647bb13801f061e2d1027c326f531b59fb), the others rope_theta
    // and rope_scaling.
    ftplan::ModelSpec local = m.spec;
    local.rope_theta = m.spec.rope_local_base_freq;
    local.rope_scaling = ftplan::RopeScaling{};
    std::tie(m.rope_cos_local, m.rope_sin_local) = rope_tables(local, seq_len, opts);
  }
  const auto bools = at::TensorOptions().dtype(at::kBool);
  m.causal_mask = at::ones({seq_len, seq_len}, bools).triu(1).to(m.options.device);
  if (m.spec.sliding_window > 0) {
    // A sliding layer's query i sees keys i - W < j <= i: transformers masks tril(ones, -W) besides the causal
    // part (Gemma2DecoderLayer.forward, sliding_window_mask = torch.tril(..., diagonal=-self.sliding_window));
    // masking_utils' sliding_window_overlay says the same, kv_idx > q_idx - sliding_window (Mistral, Phi-3).
    m.sliding_mask = (at::ones({seq_len, seq_len}, bools).triu(1) | at::ones({seq_len, seq_len}, bools).tril(-m.spec.sliding_window))
                         .to(m.options.device);
  }
  if (m.cp) {  // context parallelism: this chunk's rows (global positions; keys of the whole sequence)
    for (at::Tensor* t : {&m.rope_cos, &m.rope_sin, &m.rope_cos_local, &m.rope_sin_local, &m.causal_mask, &m.sliding_mask})
      if (t->defined()) *t = cp_chunk(*m.cp, t->unsqueeze(0)).squeeze(0);
  }
  m.cached_seq_len = seq_len;
}

bool sliding_layer(const ftplan::ModelSpec& s, int64_t layer) {
  return s.sliding_window > 0 && layer < static_cast<int64_t>(s.sliding_layers.size()) && s.sliding_layers[size_t(layer)];
}

at::Tensor attention(LlamaModel& m, const LlamaBlock& blk, const at::Tensor& x, int64_t layer) {
  const auto& s = m.spec;
  const int64_t B = x.size(0), S = x.size(1), H = s.num_heads, KV = s.num_kv_heads, d = s.head_dim;
  // Gemma2Attention / Gemma3Attention: scaling = query_pre_attn_scalar**-0.5; the others head_dim**-0.5.
  const double scale = 1.0 / std::sqrt(s.query_pre_attn_scalar > 0 ? s.query_pre_attn_scalar : static_cast<double>(d));
  // Phi3Attention: qkv = qkv_proj(x), then q | k | v along the features (views of the one output).
  at::Tensor qkv = s.fused_qkv ? linear(blk.qkv_proj, x, m.training) : at::Tensor();
  auto project = [&](const Linear& l, int64_t offset, int64_t features) {
    return qkv.defined() ? qkv.narrow(-1, offset, features) : linear(l, x, m.training);
  };
  at::Tensor q = project(blk.q_proj, 0, H * d);
  at::Tensor k = project(blk.k_proj, H * d, KV * d);
  if (s.qk_norm == ftplan::QkNorm::whole_projection) {  // Olmo2Attention: q_norm(q_proj(x)) before the head split
    q = spec_norm(s, q, blk.q_norm);
    k = spec_norm(s, k, blk.k_norm);
  }
  q = q.view({B, S, H, d});
  k = k.view({B, S, KV, d});
  // Qwen3Attention, Gemma3Attention: q_norm / k_norm, RMSNorms over head_dim, on the heads before RoPE.
  if (s.qk_norm == ftplan::QkNorm::per_head) {
    q = spec_norm(s, q, blk.q_norm);
    k = spec_norm(s, k, blk.k_norm);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  at::Tensor v = project(blk.v_proj, (H + KV) * d, KV * d).view({B, S, KV, d}).transpose(1, 2);
  qkv.reset();
  const at::Tensor& cos = layer_rope_cos(m, layer);
  const at::Tensor& sin = layer_rope_sin(m, layer);
  q = apply_rope(q, cos, sin);
  k = apply_rope(k, cos, sin);
  const at::Tensor& mask = layer_attention_mask(m, layer);
  at::Tensor out;
  if (m.cp) {
    out = cp_attention(*m.cp, q, k, v, mask, scale);  // K and V exchanged over the cp group
  } else if (m.options.use_sdpa) {
    if (!compat::kSdpaHasGqa) {
      k = repeat_kv(k, H / KV);
      v = repeat_kv(v, H / KV);
    }
    out = compat::sdpa_causal(q, k, v, scale);
  } else {
    k = repeat_kv(k, H / KV);
    v = repeat_kv(v, H / KV);
    at::Tensor probs;
    {
      // The scores are scaled and masked in place: bmm's backward needs its inputs, not its output,
      // so only the fp32 softmax (and its copy in the compute dtype) is kept.
      at::Tensor scores = at::matmul(q, k.transpose(2, 3));
      scores.mul_(scale);
      // Gemma 2 eager_attention_forward: scores / cap, tanh, * cap, before the mask (tanh keeps its output).
      if (s.attn_logit_softcapping > 0) scores = soft_cap(scores, s.attn_logit_softcapping);
      scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
      if (blk.sinks.defined()) {
        // gpt-oss eager_attention_forward: cat([scores, sinks], -1), softmax in the scores' dtype, the sink
        // column dropped (HF also subtracts the row max first, which softmax does itself).
        const at::Tensor sink = blk.sinks.to(scores.scalar_type()).view({1, H, 1, 1}).expand({B, H, S, 1});
        probs = at::softmax(at::cat({scores, sink}, -1), -1).narrow(-1, 0, S);
      } else {
        probs = at::softmax(scores, -1, at::kFloat);
      }
    }
    probs = probs.to(x.scalar_type());
    out = at::matmul(probs, v);
  }
  q.reset(), k.reset(), v.reset();
  out = out.transpose(1, 2).reshape({B, S, H * d});  // the copy o_proj keeps
  return linear(blk.o_proj, out, m.training);
}

// ---- DeepSeek's multi-head latent attention ---------------------------------------------------
// DeepseekV2Attention (transformers models/deepseek_v2/modeling_deepseek_v2.py @
// 03eac6f6d2af7e8562113f0b78d3d2d59a7d843d) and DeepseekV3Attention (models/deepseek_v3/modeling_deepseek_v3.py @
// f5a9ec512fa9fe69e51ea0c6388c68d50de567b3):
//   q = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)));  [B, S, H, nope + rope] -> q_nope | q_pe
//   k_lat | k_pe = kv_a_proj_with_mqa(x);  k_nope | v = kv_b_proj(kv_a_layernorm(k_lat)) per head
//   RoPE on q_pe and on the one shared k_pe only; q = cat(q_nope, q_pe), k = cat(k_nope, k_pe broadcast to every head)
//   eager attention with scale (nope + rope)^-0.5, fp32 softmax; o_proj(heads x v_head_dim).
// The latent norms are DeepseekV2RMSNorm(rank) with their default eps 1e-6 (not the config's rms_norm_eps).
// RoPE: V2 rotates interleaved pairs (x0, x1), (x2, x3), ... as complex numbers (apply_rotary_emb,
// view_as_complex); V3 with rope_interleave de-interleaves (x0, x2, ..., x1, x3, ...) and applies rotate-half
// (apply_rotary_pos_emb_interleave), without it rotate-half directly. Both interleaved forms rotate the same pairs
// by the same angles and differ only in where each output lands, the same for q_pe and k_pe, so the scores are
// equal: ftexec de-interleaves (the V3 form) for both.
constexpr double kMlaLatentNormEps = 1e-6;

// [..., d] interleaved pairs -> the evens then the odds (V3's view(d / 2, 2).transpose(4, 3).reshape(d)).
at::Tensor deinterleave(const at::Tensor& x) {
  std::vector<int64_t> pairs(x.sizes().begin(), x.sizes().end());
  const int64_t d = pairs.back();
  pairs.back() = d / 2;
  pairs.push_back(2);
  return x.reshape(pairs).transpose(-1, -2).reshape(x.sizes());
}

at::Tensor mla_attention(LlamaModel& m, const LlamaBlock& blk, const at::Tensor& x, int64_t layer) {
  const auto& s = m.spec;
  const int64_t B = x.size(0), S = x.size(1), H = s.num_heads;
  const int64_t nope = s.mla.qk_nope_head_dim, rope = s.mla.qk_rope_head_dim, vd = s.value_head_dim();
  const int64_t r = s.mla.kv_lora_rank;
  double scale = 1.0 / std::sqrt(static_cast<double>(nope + rope));
  // DeepseekV3Attention: with rope_scaling and a non-zero mscale_all_dim, scaling *= yarn_get_mscale(factor,
  // mscale_all_dim)^2 (transformers @ f5a9ec51; V2's attention @ 03eac6f6 leaves qk_head_dim^-0.5).
  if (s.mla.yarn_softmax_mscale && !s.rope_scaling.type.empty() && s.rope_scaling.mscale_all_dim > 0) {
    const double ms = yarn_get_mscale(s.rope_scaling.factor, s.rope_scaling.mscale_all_dim);
    scale *= ms * ms;
  }
  at::Tensor q = s.mla.q_lora_rank > 0
                     ? linear(blk.q_b_proj, rms_norm(linear(blk.q_a_proj, x, m.training), blk.q_a_layernorm, kMlaLatentNormEps),
                              m.training)
                     : linear(blk.q_proj, x, m.training);
  q = q.view({B, S, H, nope + rope}).transpose(1, 2);  // [B, H, S, nope + rope]
  const at::Tensor ckv = linear(blk.kv_a_proj_with_mqa, x, m.training);  // [B, S, r + rope]
  const at::Tensor kv = linear(blk.kv_b_proj, rms_norm(ckv.narrow(-1, 0, r), blk.kv_a_layernorm, kMlaLatentNormEps), m.training)
                            .view({B, S, H, nope + vd})
                            .transpose(1, 2);  // [B, H, S, nope + v]
  at::Tensor q_pe = q.narrow(-1, nope, rope);
  at::Tensor k_pe = ckv.narrow(-1, r, rope).view({B, 1, S, rope});
  if (s.mla.rope_interleave) q_pe = deinterleave(q_pe), k_pe = deinterleave(k_pe);
  const at::Tensor& cos = layer_rope_cos(m, layer);  // [S, rope]
  const at::Tensor& sin = layer_rope_sin(m, layer);
  q_pe = apply_rope(q_pe, cos, sin);
  k_pe = apply_rope(k_pe, cos, sin);
  q = at::cat({q.narrow(-1, 0, nope), q_pe}, -1);
  const at::Tensor k = at::cat({kv.narrow(-1, 0, nope), k_pe.expand({B, H, S, rope})}, -1);
  const at::Tensor v = kv.narrow(-1, nope, vd);
  at::Tensor probs;
  {
    at::Tensor scores = at::matmul(q, k.transpose(2, 3));
    scores.mul_(scale);
    scores.masked_fill_(layer_attention_mask(m, layer), -std::numeric_limits<double>::infinity());
    probs = at::softmax(scores, -1, at::kFloat);
  }
  at::Tensor out = at::matmul(probs.to(x.scalar_type()), v);
  out = out.transpose(1, 2).reshape({B, S, H * vd});
  return linear(blk.o_proj, out, m.training);
}

// The dense gated MLP (LlamaMLP, Gemma's GeGLU, Phi3MLP's fused gate_up_proj); in a MoE layer the shared expert.
at::Tensor gated_mlp(LlamaModel& m, const LlamaBlock& blk, const at::Tensor& x) {
  at::Tensor gate, up;
  if (m.spec.fused_gate_up) {  // Phi3MLP: gate, up_states = gate_up_proj(x).chunk(2, dim=-1)
    const at::Tensor gate_up = linear(blk.gate_up_proj, x, m.training);
    const int64_t I = gate_up.size(-1) / 2;
    gate = gate_up.narrow(-1, 0, I);
    up = gate_up.narrow(-1, I, I);
  } else {
    gate = linear(blk.gate_proj, x, m.training);
    up = linear(blk.up_proj, x, m.training);
  }
  return linear(blk.down_proj, activation(m.spec, gate) * up, m.training);
}

at::Tensor mlp(LlamaModel& m, const LlamaBlock& blk, const at::Tensor& x, int64_t layer) {
  if (!blk.moe) return gated_mlp(m, blk, x);
  const at::Tensor routed = moe_forward(*blk.moe, m.spec, x, m.moe_aux, layer);
  // Qwen2-MoE's shared expert: the block's gate/up/down Linears (mlp.shared_expert.*), added to the routed output.
  if (m.spec.moe.shared_intermediate_size == 0) return routed;
  return moe_add_shared(*blk.moe, x, routed, gated_mlp(m, blk, x));
}

std::vector<at::Tensor> block_trainable_tensors(const LlamaBlock& blk) {
  std::vector<at::Tensor> out;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && t.requires_grad()) out.push_back(t);
  };
  add(blk.attn_norm);
  add(blk.attn_out_norm);
  add(blk.mlp_norm);
  add(blk.mlp_out_norm);
  add(blk.q_norm);
  add(blk.k_norm);
  add(blk.q_a_layernorm);
  add(blk.kv_a_layernorm);
  add(blk.sinks);
  if (blk.moe) {
    const MoeBlock& e = *blk.moe;
    for (const at::Tensor* t : {&e.gate, &e.gate_proj, &e.up_proj, &e.down_proj, &e.shared_expert_gate, &e.router_bias,
                                &e.gate_up_proj, &e.gate_up_proj_bias, &e.down_proj_bias})
      add(*t);
  }
  for (const char* name : kLinearNames) {
    const Linear& l = block_linear(blk, name);
    add(l.weight);
    add(l.bias);
    if (l.lora) add(l.lora->a), add(l.lora->b);
  }
  return out;
}

bool block_has_dropout(const LlamaBlock& blk) {
  for (const char* name : kLinearNames) {
    const Linear& l = block_linear(blk, name);
    if (l.lora && l.lora->dropout > 0.0) return true;
  }
  return false;
}

// Gradient checkpointing of one block (LibTorch has no checkpoint utility): forward runs without a
// graph and saves only the block input; backward restores the RNG state of the forward (LoRA
// dropout), recomputes the block under grad mode and differentiates it. The block's trainable
// tensors are inputs, so the output requires grad even when x does not (frozen embedding).
struct BlockCheckpoint : public torch::autograd::Function<BlockCheckpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t model_address,
                            int64_t layer, at::TensorList trainable) {
    auto* model = reinterpret_cast<LlamaModel*>(model_address);
    ctx->save_for_backward({x});
    ctx->saved_data["model"] = model_address;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["trainable"] = static_cast<int64_t>(trainable.size());
    if (model->training && block_has_dropout(model->layers[layer])) {
      auto gen = at::globalContext().defaultGenerator(model->options.device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    return llama_block_forward(*model, layer, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* model = reinterpret_cast<LlamaModel*>(ctx->saved_data["model"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor xd = x.detach();
    xd.set_requires_grad(x.requires_grad());

    at::Tensor rng_now;
    auto gen = at::globalContext().defaultGenerator(model->options.device);
    if (ctx->saved_data.count("rng")) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng_now = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    at::Tensor out;
    {
      at::AutoGradMode grad_mode(true);
      out = llama_block_forward(*model, layer, xd);
    }
    if (rng_now.defined()) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng_now);
    }
    std::vector<at::Tensor> inputs;
    if (xd.requires_grad()) inputs.push_back(xd);
    for (const auto& t : block_trainable_tensors(model->layers[layer])) inputs.push_back(t);
    auto grads = torch::autograd::grad({out}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    torch::autograd::variable_list result;
    size_t g = 0;
    result.push_back(xd.requires_grad() ? grads[g++] : at::Tensor());
    result.push_back(at::Tensor());  // model_address
    result.push_back(at::Tensor());  // layer
    for (; g < grads.size(); ++g) result.push_back(grads[g]);
    return result;
  }
};

// The token embeddings; Gemma's scaled by sqrt(hidden_size) held in the compute dtype, as Gemma2Model's
// normalizer = torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype) (55.4256 is 55.5 in bf16).
at::Tensor embed(const LlamaModel& m, const at::Tensor& ids) {
  at::Tensor e = at::embedding(m.embed_tokens, ids);
  if (m.spec.scaled_embedding) e = e * at::scalar_tensor(std::sqrt(static_cast<double>(m.spec.hidden_size)), e.options());
  return e;
}

// The head on the final norm's output; Gemma2ForCausalLM: logits / cap, tanh, * cap in the compute dtype,
// before the loss's fp32 cast.
at::Tensor head_logits(const LlamaModel& m, const at::Tensor& normed) {
  at::Tensor logits = at::linear(normed, m.head_weight());
  if (m.spec.final_logit_softcapping > 0) logits = soft_cap(logits, m.spec.final_logit_softcapping);
  return logits;
}

at::Tensor run_blocks(LlamaModel& m, at::Tensor h) {
  for (int64_t i = 0; i < static_cast<int64_t>(m.layers.size()); ++i) h = llama_block_apply(m, i, h);
  return h;
}

}  // namespace

std::string shape_to_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Linear& block_linear(LlamaBlock& b, const std::string& module) {
  return const_cast<Linear&>(block_linear(static_cast<const LlamaBlock&>(b), module));
}

const Linear& block_linear(const LlamaBlock& b, const std::string& module) {
  if (module == "q_proj") return b.q_proj;
  if (module == "k_proj") return b.k_proj;
  if (module == "v_proj") return b.v_proj;
  if (module == "o_proj") return b.o_proj;
  if (module == "gate_proj") return b.gate_proj;
  if (module == "up_proj") return b.up_proj;
  if (module == "down_proj") return b.down_proj;
  if (module == "qkv_proj") return b.qkv_proj;
  if (module == "gate_up_proj") return b.gate_up_proj;
  if (module == "q_a_proj") return b.q_a_proj;
  if (module == "q_b_proj") return b.q_b_proj;
  if (module == "kv_a_proj_with_mqa") return b.kv_a_proj_with_mqa;
  if (module == "kv_b_proj") return b.kv_b_proj;
  ftplan::fail_input("unknown linear module \"" + module +
                     "\" (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; Phi-3: qkv_proj, gate_up_proj; "
                     "DeepSeek: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj)");
}

std::string block_linear_prefix(const std::string& module) {
  return (module == "gate_proj" || module == "up_proj" || module == "down_proj" || module == "gate_up_proj") ? "mlp."
                                                                                                              : "self_attn.";
}

namespace {

// The hidden-size norms the spec's block has: the Hugging Face name and the member holding it.
// LlamaDecoderLayer names its pre-MLP norm post_attention_layernorm; Gemma2DecoderLayer, which norms
// attention's output under that name, calls its pre-MLP norm pre_feedforward_layernorm; Olmo2DecoderLayer
// has post_attention_layernorm and post_feedforward_layernorm only.
struct NormSlot {
  std::string name;
  at::Tensor LlamaBlock::*member;
  bool leading;  // listed before the linears (input_layernorm)
};
std::vector<NormSlot> norm_slots(const ftplan::ModelSpec& s) {
  std::vector<NormSlot> out;
  if (s.norm_pre_attention) out.push_back({"input_layernorm", &LlamaBlock::attn_norm, true});
  if (s.norm_post_attention) out.push_back({"post_attention_layernorm", &LlamaBlock::attn_out_norm, false});
  if (s.norm_pre_mlp)
    out.push_back({s.norm_post_attention ? "pre_feedforward_layernorm" : "post_attention_layernorm", &LlamaBlock::mlp_norm, false});
  if (s.norm_post_mlp) out.push_back({"post_feedforward_layernorm", &LlamaBlock::mlp_out_norm, false});
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor*>> block_norms(LlamaBlock& b, const ftplan::ModelSpec& spec, bool leading) {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  for (const auto& n : norm_slots(spec))
    if (n.leading == leading) out.emplace_back(n.name + ".weight", &(b.*n.member));
  return out;
}

std::vector<std::string> block_norm_names(const ftplan::ModelSpec& spec, bool leading) {
  std::vector<std::string> out;
  for (const auto& n : norm_slots(spec))
    if (n.leading == leading) out.push_back(n.name + ".weight");
  return out;
}

const at::Tensor& layer_rope_cos(const LlamaModel& m, int64_t layer) {
  return m.rope_cos_local.defined() && sliding_layer(m.spec, layer) ? m.rope_cos_local : m.rope_cos;
}
const at::Tensor& layer_rope_sin(const LlamaModel& m, int64_t layer) {
  return m.rope_sin_local.defined() && sliding_layer(m.spec, layer) ? m.rope_sin_local : m.rope_sin;
}
const at::Tensor& layer_attention_mask(const LlamaModel& m, int64_t layer) {
  return m.sliding_mask.defined() && sliding_layer(m.spec, layer) ? m.sliding_mask : m.causal_mask;
}

std::string block_linear_prefix(const ftplan::ModelSpec& spec, int64_t layer, const std::string& module) {
  const std::string prefix = block_linear_prefix(module);
  // A MoE layer's MLP Linears are its shared expert (Qwen2-MoE: mlp.shared_expert.gate_proj).
  if (prefix == "mlp." && moe_layer(spec, layer)) return spec.moe.module + "." + spec.moe.shared_module + ".";
  return prefix;
}

std::vector<ftplan::LinearShape> layer_dense_linears(const ftplan::ModelSpec& spec, int64_t layer) {
  std::vector<ftplan::LinearShape> out;
  for (const auto& lin : ftplan::layer_linears(spec, moe_layer(spec, layer)))
    if (lin.role != ftplan::LinearRole::router && !ftplan::is_expert_role(lin.role)) out.push_back(lin);
  return out;
}

std::vector<std::pair<std::string, at::Tensor*>> block_extra_tensors(LlamaBlock& b, const ftplan::ModelSpec& spec) {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  if (b.q_norm.defined()) out.emplace_back("self_attn.q_norm.weight", &b.q_norm);
  if (b.k_norm.defined()) out.emplace_back("self_attn.k_norm.weight", &b.k_norm);
  if (b.q_a_layernorm.defined()) out.emplace_back("self_attn.q_a_layernorm.weight", &b.q_a_layernorm);
  if (b.kv_a_layernorm.defined()) out.emplace_back("self_attn.kv_a_layernorm.weight", &b.kv_a_layernorm);
  if (b.sinks.defined()) out.emplace_back("self_attn.sinks", &b.sinks);
  if (b.moe)
    for (const auto& t : moe_named_tensors(*b.moe, spec)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> block_extra_shapes(const ftplan::ModelSpec& spec, int64_t layer) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (spec.qk_norm == ftplan::QkNorm::per_head) {
    out.push_back({"self_attn.q_norm.weight", {spec.head_dim}});
    out.push_back({"self_attn.k_norm.weight", {spec.head_dim}});
  } else if (spec.qk_norm == ftplan::QkNorm::whole_projection) {  // Olmo2Attention: RMSNorm(heads·head_dim), (kv_heads·head_dim)
    out.push_back({"self_attn.q_norm.weight", {spec.q_dim()}});
    out.push_back({"self_attn.k_norm.weight", {spec.kv_dim()}});
  }
  if (spec.mla.q_lora_rank > 0) out.push_back({"self_attn.q_a_layernorm.weight", {spec.mla.q_lora_rank}});
  if (spec.mla.active()) out.push_back({"self_attn.kv_a_layernorm.weight", {spec.mla.kv_lora_rank}});
  if (spec.attention_sinks) out.push_back({"self_attn.sinks", {spec.num_heads}});  // GptOssAttention.sinks
  if (moe_layer(spec, layer))
    for (const auto& t : moe_tensor_shapes(spec)) out.push_back(t);
  return out;
}

std::string checkpoint_name(const ftplan::ModelSpec& spec, const std::string& name) {
  return spec.text_checkpoint_prefix + name;
}

std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : named)
    for (auto& e : moe_checkpoint_tensors(name, t)) out.push_back(std::move(e));
  return out;
}

std::vector<double> rope_inv_freq(const ftplan::ModelSpec& s, int64_t seq_len) {
  // MLA rotates the qk_rope_head_dim part only (DeepseekV2Config / DeepseekV3Config set head_dim to it for RoPE).
  const int64_t d = s.mla.active() ? s.mla.qk_rope_head_dim : s.head_dim;
  const auto& rs = s.rope_scaling;
  double base = s.rope_theta;
  if (rs.type == "dynamic" && s.max_position_embeddings > 0 && seq_len > s.max_position_embeddings) {
    // HF _compute_dynamic_ntk_parameters
    base *= std::pow(rs.factor * seq_len / s.max_position_embeddings - (rs.factor - 1), double(d) / (d - 2));
  }
  std::vector<double> inv(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) inv[i] = 1.0 / std::pow(base, double(2 * i) / d);
  if (rs.type == "linear") {
    for (auto& f : inv) f /= rs.factor;
  } else if (rs.type == "llama3") {
    // HF _compute_llama3_parameters: long wavelengths divided by factor, short ones kept, smooth between.
    const double old_len = rs.original_max_position > 0 ? double(rs.original_max_position) : 8192.0;
    const double low_wavelen = old_len / rs.low_freq_factor;
    const double high_wavelen = old_len / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= rs.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
  } else if (rs.type == "yarn") {
    // transformers modeling_rope_utils.py _compute_yarn_parameters (the version with `truncate`, as gpt-oss reads
    // it): dimensions rotating more than beta_fast times over original_max_position_embeddings keep their
    // frequency, fewer than beta_slow times are divided by factor, a linear ramp between (floor/ceil of the
    // correction range when truncate). Some transformers versions (the DeepSeek-V3 note in the same function)
    // replace factor by max_position_embeddings / original_max_position_embeddings when the latter is given;
    // gpt-oss's published config (131072 / 4096 = 32 = factor) and tests/data/models/tiny-gpt-oss.json (8192 / 2048
    // = 4 = factor) agree under both readings.
    const double original = rs.original_max_position > 0 ? double(rs.original_max_position) : double(s.max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return double(d) * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(s.rope_theta));
    };
    double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
    if (rs.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(d - 1));
    if (low == high) high += 0.001;  // linear_ramp_factor: "Prevent singularity"
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // inv_freq_extrapolation_factor
      inv[size_t(i)] = inv[size_t(i)] / rs.factor * (1 - extrapolation) + inv[size_t(i)] * extrapolation;
    }
  } else if (!rs.type.empty() && rs.type != "default" && rs.type != "dynamic") {
    ftplan::fail_input(s.name + ": rope_scaling type \"" + rs.type + "\" is not supported by ftexec (llama3, linear, dynamic, yarn)");
  }
  return inv;
}

namespace {

// What ftexec runs of DeepSeek-V2/V3 (transformers' DeepseekV2Attention / DeepseekV2MoEGate and DeepseekV3Attention /
// DeepseekV3TopkRouter at the commits cited above mla_attention and in moe.h); anything else is refused by name.
void deepseek_check(const ftplan::ModelSpec& s, const ModelOptions& options) {
  const std::string where = s.name + ": model_type " + s.model_type + ": ";
  if (options.use_sdpa)
    ftplan::fail_input(where + "attention fused: ftexec runs multi-head latent attention eager only (use --attention eager)");
  if (s.num_kv_heads != s.num_heads)
    ftplan::fail_input(where + "num_key_value_heads " + std::to_string(s.num_kv_heads) +
                       ": latent attention decompresses a key and value per query head");
  if (!s.moe.active()) return;
  const auto& e = s.moe;
  // DeepseekV2DecoderLayer / DeepseekV3DecoderLayer: the MoE on every layer >= first_k_dense_replace (moe_layer_freq
  // is not read there).
  bool seen_moe = false;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (seen_moe && !moe_layer(s, l))
      ftplan::fail_input(where + "moe_layer_freq: a dense layer (" + std::to_string(l) + ") after a MoE layer; transformers "
                         "puts the MoE on every layer from first_k_dense_replace on (moe_layer_freq 1)");
    seen_moe |= moe_layer(s, l);
  }
  if (options.moe_aux_loss.value_or(false))
    ftplan::fail_input(where + "moe.aux_loss: transformers' DeepSeek MoE computes no load-balancing loss (aux_loss_alpha "
                       "is not read in training); leave it off");
  if (e.router_score_bias) {  // DeepseekV3TopkRouter: sigmoid scores, noaux_tc always
    if (e.scoring_func != "sigmoid" || e.topk_method != "noaux_tc")
      ftplan::fail_input(where + "scoring_func " + e.scoring_func + ", topk_method " + e.topk_method +
                         ": DeepseekV3TopkRouter routes by sigmoid scores with noaux_tc only");
  } else {  // DeepseekV2MoEGate: softmax scores, greedy or group_limited_greedy, no renormalisation
    if (e.scoring_func != "softmax" || e.topk_method == "noaux_tc")
      ftplan::fail_input(where + "scoring_func " + e.scoring_func + ", topk_method " + e.topk_method +
                         ": DeepseekV2MoEGate routes by softmax scores with greedy or group_limited_greedy only");
    if (e.norm_topk_prob)
      ftplan::fail_input(where + "norm_topk_prob: true is not applied by transformers' DeepseekV2MoEGate (the hub's "
                         "modeling_deepseek.py applies it): ambiguous, refused (published V2 configs set false)");
  }
}

}  // namespace

// transformers modeling_rope_utils.py _compute_yarn_parameters: get_mscale(scale, mscale) = 0.1·mscale·ln(scale) + 1
// (1 when scale <= 1).
double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double rope_attention_scaling(const ftplan::ModelSpec& s) {
  const auto& rs = s.rope_scaling;
  if (rs.type != "yarn") return 1.0;
  if (rs.attention_factor > 0) return rs.attention_factor;
  // DeepSeek's configs give mscale and mscale_all_dim: their ratio (1 for DeepSeek-V2-Lite's 0.707 / 0.707 and V3's
  // 1 / 1); else get_mscale(factor). (The versions with mscale read factor as max_position_embeddings /
  // original_max_position_embeddings when the latter is given: 163840 / 4096 = 40 = factor for DeepSeek-V2-Lite and V3.)
  if (rs.mscale > 0 && rs.mscale_all_dim > 0) return yarn_get_mscale(rs.factor, rs.mscale) / yarn_get_mscale(rs.factor, rs.mscale_all_dim);
  return yarn_get_mscale(rs.factor, 1.0);
}

LlamaModel llama_create(const ftplan::ModelSpec& spec, const ModelOptions& options, uint64_t seed, bool random_init) {
  if (options.use_sdpa && !compat::kHasSdpa)
    ftplan::fail_input("attention fused: this libtorch (" + std::string(compat::torch_version()) +
                       ") has no scaled_dot_product_attention; use eager");
  if (spec.num_heads % spec.num_kv_heads != 0)
    ftplan::fail_input(spec.name + ": num_attention_heads (" + std::to_string(spec.num_heads) +
                       ") is not a multiple of num_key_value_heads (" + std::to_string(spec.num_kv_heads) + ")");
  // DeepSeek's router is a bare weight (MoEGate) and its score bias a buffer: built where its routing is read.
  const bool deepseek_router = spec.moe.active() && !spec.moe.topk_method.empty();
  // gpt-oss's pieces come together: fused experts with biases, a bare router with a bias, softmax after top-k.
  const bool gpt_oss_moe = spec.moe.fused_expert_params && spec.moe.expert_bias && spec.moe.router_bias &&
                           spec.moe.softmax_after_topk && spec.moe.expert_names.size() == 2;
  if (spec.moe.active() && ((spec.moe.shared_intermediate_size > 0 && spec.moe.shared_module.empty()) ||
                            (!gpt_oss_moe && (spec.moe.fused_expert_params || spec.moe.expert_bias || spec.moe.router_bias ||
                                              (!spec.moe.router_module && !deepseek_router))) ||
                            (spec.moe.router_score_bias && !deepseek_router)))
    ftplan::fail_input(spec.name + ": model_type " + spec.model_type + ": ftexec does not build this family's block (it "
                       "trains " + ftplan::executor_family_list() + ")");
  if (spec.attention_sinks && options.use_sdpa)  // GptOssPreTrainedModel._supports_sdpa = False
    ftplan::fail_input(spec.name + ": attention fused: the attention sinks of " + spec.model_type + " need eager attention");
  if (spec.hidden_act != "silu" && spec.hidden_act != "gelu_pytorch_tanh")
    ftplan::fail_input(spec.name + ": hidden_act " + spec.hidden_act + ": ftexec's gated MLP runs silu and gelu_pytorch_tanh");
  if (spec.partial_rotary_factor != 1.0)
    ftplan::fail_input(spec.name + ": partial_rotary_factor " + std::to_string(spec.partial_rotary_factor) +
                       ": ftexec applies RoPE to the whole head_dim");
  if (spec.sliding_window > 0 && static_cast<int64_t>(spec.sliding_layers.size()) != spec.num_layers)
    ftplan::fail_input(spec.name + ": sliding_layers: " + std::to_string(spec.sliding_layers.size()) + " entries for " +
                       std::to_string(spec.num_layers) + " layers");
  if (spec.mla.active() || deepseek_router) deepseek_check(spec, options);
  LlamaModel m;
  m.spec = spec;
  m.options = options;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto cpu32 = at::TensorOptions().dtype(at::kFloat);
  const auto target = at::TensorOptions().dtype(options.dtype).device(options.device);
  auto normal = [&](std::vector<int64_t> shape) {
    if (!random_init) return at::empty(shape, target);
    return at::empty(shape, cpu32).normal_(0.0, kInitStd, gen).to(target);
  };
  auto fill = [&](std::vector<int64_t> shape, double value) {
    return random_init ? at::full(shape, value, target) : at::empty(shape, target);
  };
  const int64_t h = spec.hidden_size;
  // Norm weights start at 1, Gemma's at 0 (its scale is 1 + w: Gemma3PreTrainedModel._init_weights zeroes RMSNorms).
  const double norm_init = spec.norm_scale_fp32 ? 0.0 : 1.0;
  m.embed_tokens = normal({spec.vocab_size, h});
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    LlamaBlock b;
    for (const auto& n : norm_slots(spec)) b.*n.member = fill({h}, norm_init);
    for (const auto& shape : layer_dense_linears(spec, l)) {
      Linear& lin = block_linear(b, shape.name);
      lin.weight = normal({shape.out_features, shape.in_features});
      if (shape.bias) lin.bias = fill({shape.out_features}, 0.0);
    }
    if (moe_layer(spec, l)) b.moe = std::make_shared<MoeBlock>();
    // q/k norms start at 1, the router and the experts N(0, 0.02) as every linear (HF _init_weights).
    // gpt-oss (GptOssPreTrainedModel._init_weights): sinks and the router's weight and bias N(0, 0.02), the experts'
    // biases zero.
    for (const auto& [name, shape] : block_extra_shapes(spec, l)) {
      at::Tensor t = name.find("norm") != std::string::npos ? fill(shape, norm_init)
                     : ends_with(name, "_bias")            ? fill(shape, 0.0)
                                                           : normal(shape);
      if (name == "self_attn.q_norm.weight") b.q_norm = t;
      else if (name == "self_attn.k_norm.weight") b.k_norm = t;
      else if (name == "self_attn.q_a_layernorm.weight") b.q_a_layernorm = t;
      else if (name == "self_attn.kv_a_layernorm.weight") b.kv_a_layernorm = t;
      else if (name == "self_attn.sinks") b.sinks = t;
      else
        for (auto& [n, slot] : moe_named_tensors(*b.moe, spec))
          if (n == name) *slot = t;
    }
    // DeepseekV3TopkRouter: register_buffer("e_score_correction_bias", torch.zeros(n_routed_experts)).
    if (b.moe)
      for (auto& [name, slot] : moe_named_buffers(*b.moe, spec)) *slot = fill({spec.moe.num_experts}, 0.0);
    m.layers.push_back(std::move(b));
  }
  // (DeepSeek's MoE computes no load-balancing loss in transformers: deepseek_check refuses moe.aux_loss true.)
  m.moe_aux.enabled = spec.moe.active() && !deepseek_router && options.moe_aux_loss.value_or(spec.moe.output_router_logits);
  m.moe_aux.coef = spec.moe.aux_loss_coef;
  m.moe_aux.top_k = std::max<int64_t>(1, spec.moe.top_k);
  m.norm = fill({h}, norm_init);
  if (!spec.tie_word_embeddings) m.lm_head = normal({spec.vocab_size, h});
  return m;
}

std::vector<std::pair<std::string, at::Tensor>> llama_named_parameters(const LlamaModel& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", m.embed_tokens);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto& b = m.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const auto& [name, slot] : block_norms(const_cast<LlamaBlock&>(b), m.spec, true)) out.emplace_back(p + name, *slot);
    for (const char* name : kLinearNames) {
      const Linear& lin = block_linear(b, name);
      const std::string q = p + block_linear_prefix(m.spec, int64_t(l), name) + name;
      if (lin.weight.defined()) out.emplace_back(q + ".weight", lin.weight);
      if (lin.bias.defined()) out.emplace_back(q + ".bias", lin.bias);
    }
    for (const auto& [name, slot] : block_extra_tensors(const_cast<LlamaBlock&>(b), m.spec)) out.emplace_back(p + name, *slot);
    for (const auto& [name, slot] : block_norms(const_cast<LlamaBlock&>(b), m.spec, false)) out.emplace_back(p + name, *slot);
  }
  out.emplace_back("model.norm.weight", m.norm);
  if (m.lm_head.defined()) out.emplace_back("lm_head.weight", m.lm_head);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> llama_named_buffers(const LlamaModel& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t l = 0; l < m.layers.size(); ++l)
    if (m.layers[l].moe)
      for (const auto& [name, slot] : moe_named_buffers(*m.layers[l].moe, m.spec))
        out.emplace_back("model.layers." + std::to_string(l) + "." + name, *slot);
  return out;
}

void llama_quantize_nf4(LlamaModel& m) {
  for (auto& b : m.layers)
    for (const char* name : kLinearNames) {
      Linear& lin = block_linear(b, name);
      if (lin.nf4 || !lin.weight.defined()) continue;
      lin.nf4 = std::make_shared<Nf4Tensor>(nf4_quantize(lin.weight));
      lin.weight = at::Tensor();
    }
}

int64_t llama_nf4_bytes(const LlamaModel& m) {
  int64_t bytes = 0;
  for (const auto& b : m.layers)
    for (const char* name : kLinearNames)
      if (const auto& q = block_linear(b, name).nf4) bytes += q->storage_bytes();
  return bytes;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_expected_tensors(const ftplan::ModelSpec& s) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t h = s.hidden_size;
  out.push_back({"model.embed_tokens.weight", {s.vocab_size, h}});
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const auto& name : block_norm_names(s, true)) out.push_back({p + name, {h}});
    for (const auto& lin : layer_dense_linears(s, l)) {
      const std::string q = p + block_linear_prefix(s, l, lin.name) + lin.name;
      out.push_back({q + ".weight", {lin.out_features, lin.in_features}});
      if (lin.bias) out.push_back({q + ".bias", {lin.out_features}});
    }
    for (const auto& [name, shape] : block_extra_shapes(s, l))
      for (auto& e : moe_checkpoint_shapes(p + name, shape)) out.push_back(std::move(e));
    if (moe_layer(s, l))
      for (const auto& [name, shape] : moe_buffer_shapes(s)) out.push_back({p + name, shape});
    for (const auto& name : block_norm_names(s, false)) out.push_back({p + name, {h}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!s.tie_word_embeddings) out.push_back({"lm_head.weight", {s.vocab_size, h}});
  for (auto& e : out) e.first = checkpoint_name(s, e.first);
  return out;
}

std::string safetensors_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    default: throw std::runtime_error(std::string("no safetensors dtype for ") + c10::toString(t));
  }
}

at::ScalarType scalar_type_of_safetensors(const std::string& dtype, const std::string& where) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "F64") return at::kDouble;
  if (dtype == "I64") return at::kLong;
  if (dtype == "I32") return at::kInt;
  if (dtype == "U8") return at::kByte;  // mxfp4 blocks and scales (gpt-oss)
  ftplan::fail_input(where + ": dtype " + dtype + " cannot be loaded (F32, BF16, F16, F64, I64, I32, U8)");
}

SafetensorsEntry safetensors_entry(const std::string& name, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "safetensors_entry needs a contiguous CPU tensor: ", name);
  SafetensorsEntry e;
  e.name = name;
  e.dtype = safetensors_dtype_of(t.scalar_type());
  e.shape.assign(t.sizes().begin(), t.sizes().end());
  e.data = t.data_ptr();
  e.nbytes = t.numel() * t.element_size();
  return e;
}

at::Tensor tensor_view_of(const SafetensorsEntry& e) {
  const auto type = scalar_type_of_safetensors(e.dtype, e.name);
  return at::from_blob(const_cast<void*>(e.data), e.shape, at::TensorOptions().dtype(type));
}

void llama_load_weights(LlamaModel& m, const std::string& path_in) {
  fs::path path(path_in);
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors.index.json")) path /= "model.safetensors.index.json";
    else path /= "model.safetensors";
  }
  if (!fs::exists(path)) ftplan::fail_input("--load-weights: " + path.string() + " does not exist");

  // name -> the file holding it
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsEntry*> found;
  std::map<std::string, std::string> found_in;
  if (ends_with(path.string(), ".index.json")) {
    const nlohmann::json index = ftplan::read_json_file(path.string());
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      ftplan::fail_input(path.string() + ": no \"weight_map\" object");
    std::map<std::string, SafetensorsFile*> by_shard;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) ftplan::fail_input(path.string() + ": weight_map." + name + " is not a file name");
      const std::string shard_name = shard.get<std::string>();
      if (!by_shard.count(shard_name)) {
        files.push_back(std::make_unique<SafetensorsFile>((path.parent_path() / shard_name).string()));
        by_shard[shard_name] = files.back().get();
      }
      const SafetensorsEntry* e = by_shard[shard_name]->find(name);
      if (!e) ftplan::fail_input(path.string() + ": the index puts " + name + " in " + shard_name + ", which does not hold it");
      found[name] = e;
      found_in[name] = by_shard[shard_name]->path();
    }
  } else {
    files.push_back(std::make_unique<SafetensorsFile>(path.string()));
    for (const auto& e : files.back()->entries()) {
      found[e.name] = &e;
      found_in[e.name] = files.back()->path();
    }
  }

  // Check every name and shape before touching the model; collect all problems.
  std::vector<std::string> problems;
  std::set<std::string> expected_names;
  std::map<std::string, at::Tensor> dequantized;  // gpt-oss: experts stored in mxfp4, by their bf16 name
  for (const auto& [name, shape] : llama_expected_tensors(m.spec)) {
    expected_names.insert(name);
    auto it = found.find(name);
    if (it == found.end() && m.spec.moe.fused_expert_params && found.count(name + "_blocks")) {
      // The hub's gpt-oss checkpoints: <name>_blocks [E, out, in/32, 16] + <name>_scales [E, out, in/32], uint8
      // (executor/mxfp4.h), dequantised into the model's dtype as transformers' Mxfp4Config(dequantize=True).
      const SafetensorsEntry* blocks = found.at(name + "_blocks");
      auto sc = found.find(name + "_scales");
      expected_names.insert(name + "_blocks");
      expected_names.insert(name + "_scales");
      const std::vector<int64_t> want_blocks{shape[0], shape[2], shape[1] / 32, 16}, want_scales{shape[0], shape[2], shape[1] / 32};
      if (sc == found.end()) {
        problems.push_back(name + "_scales is missing (" + name + "_blocks is there)");
      } else if (shape[1] % 32 != 0 || blocks->dtype != "U8" || sc->second->dtype != "U8" || blocks->shape != want_blocks ||
                 sc->second->shape != want_scales) {
        problems.push_back(name + "_blocks / _scales: " + blocks->dtype + " " + shape_string(blocks->shape) + " / " +
                           sc->second->dtype + " " + shape_string(sc->second->shape) + ", the config (" + m.spec.name +
                           ") expects U8 " + shape_string(want_blocks) + " / U8 " + shape_string(want_scales) + " (mxfp4)");
      } else {
        dequantized[name] = mxfp4_dequantize(tensor_view_of(*blocks), tensor_view_of(*sc->second), m.options.dtype);
      }
      continue;
    }
    if (it == found.end()) {
      problems.push_back(name + " is missing");
    } else if (it->second->shape != shape) {
      problems.push_back(name + " has shape " + shape_string(it->second->shape) + ", the config (" + m.spec.name +
                         ") expects " + shape_string(shape));
    } else {
      (void)scalar_type_of_safetensors(it->second->dtype, found_in[name] + ": " + name);
    }
  }
  const std::string& prefix = m.spec.text_checkpoint_prefix;
  for (const auto& [name, entry] : found) {
    if (expected_names.count(name) || ends_with(name, ".rotary_emb.inv_freq")) continue;
    if (name == checkpoint_name(m.spec, "lm_head.weight") && m.spec.tie_word_embeddings) continue;  // some tied checkpoints store it
    if (!prefix.empty() && name.compare(0, prefix.size(), prefix) != 0) continue;  // a wrapper's vision tower, projector
    problems.push_back(name + " is not a tensor of this config (" + m.spec.name + ")");
  }
  if (!problems.empty()) {
    std::string msg = path.string() + ": " + std::to_string(problems.size()) + " tensor(s) do not match the config: ";
    for (size_t i = 0; i < problems.size() && i < 6; ++i) msg += (i ? "; " : "") + problems[i];
    if (problems.size() > 6) msg += "; and " + std::to_string(problems.size() - 6) + " more";
    ftplan::fail_input(msg);
  }
  at::NoGradGuard no_grad;
  auto named = checkpoint_tensors(llama_named_parameters(m));
  for (auto& b : llama_named_buffers(m)) named.push_back(std::move(b));
  for (auto& [name, param] : named) {
    at::Tensor p = param;
    const std::string stored = checkpoint_name(m.spec, name);
    auto dq = dequantized.find(stored);
    p.copy_(dq != dequantized.end() ? dq->second : tensor_view_of(*found.at(stored)));
  }
}

void llama_save_weights(const LlamaModel& m, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("--save " + dir + ": cannot create the folder (" + ec.message() + ")");
  std::vector<at::Tensor> keep;
  std::vector<SafetensorsEntry> entries;
  auto named = checkpoint_tensors(llama_named_parameters(m));
  for (auto& b : llama_named_buffers(m)) named.push_back(std::move(b));
  for (const auto& [name, t] : named) {
    keep.push_back(t.detach().to(at::kCPU).contiguous());
    entries.push_back(safetensors_entry(checkpoint_name(m.spec, name), keep.back()));
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), entries, {{"format", "pt"}});
}

at::Tensor llama_block_forward(LlamaModel& m, int64_t layer, const at::Tensor& x) {
  ensure_caches(m, x.size(1) * m.seq_shards);
  if (m.tp) return tp_block_forward(m, layer, x);
  const LlamaBlock& blk = m.layers[layer];
  const auto& s = m.spec;
  // LlamaDecoderLayer: x + attn(norm(x)), then h + mlp(norm(h)); Gemma2DecoderLayer and Olmo2DecoderLayer also
  // norm each sublayer's output before the residual add, and OLMo 2 has no norm before them.
  at::Tensor h = x + optional_norm(s,
                                   s.mla.active() ? mla_attention(m, blk, optional_norm(s, x, blk.attn_norm), layer)
                                                  : attention(m, blk, optional_norm(s, x, blk.attn_norm), layer),
                                   blk.attn_out_norm);
  return h + optional_norm(s, mlp(m, blk, optional_norm(s, h, blk.mlp_norm), layer), blk.mlp_out_norm);
}

at::Tensor llama_block_apply(LlamaModel& m, int64_t layer, const at::Tensor& x) {
  if (m.options.checkpointing && at::GradMode::is_enabled()) {
    ensure_caches(m, x.size(1) * m.seq_shards);
    std::vector<at::Tensor> trainable = block_trainable_tensors(m.layers[layer]);
    return BlockCheckpoint::apply(x, reinterpret_cast<int64_t>(&m), layer, at::TensorList(trainable));
  }
  return llama_block_forward(m, layer, x);
}

at::Tensor llama_embed(LlamaModel& m, const at::Tensor& ids) {
  ensure_caches(m, ids.size(1));
  const at::Tensor input_ids = m.cp ? cp_chunk(*m.cp, ids) : ids;
  if (m.tp) return tp_embed(m, input_ids);
  return embed(m, input_ids);
}

at::Tensor llama_head_loss(LlamaModel& m, const at::Tensor& h, const at::Tensor& all_labels) {
  // Context parallelism: this chunk's labels; its loss scaled so that the mean over cp is the
  // micro-batch's mean over all its tokens (cp_loss_scale).
  const at::Tensor labels = m.cp ? cp_chunk(*m.cp, all_labels) : all_labels;
  if (m.tp) {
    at::Tensor loss = tp_head_loss(m, h, labels);
    return m.cp ? loss * cp_loss_scale(*m.cp, all_labels, labels, true) : loss;
  }
  at::Tensor logprobs;
  {
    // The logits die at the end of this scope: log_softmax keeps its fp32 output, not its input.
    const at::Tensor logits = head_logits(m, spec_norm(m.spec, h, m.norm));
    logprobs = at::log_softmax(logits.to(at::kFloat), -1);
  }
  if (m.cp)  // summed, so a chunk without labels adds 0 (cp refuses mixtures of experts)
    return at::nll_loss(logprobs.view({-1, m.spec.vocab_size}), labels.reshape({-1}), {}, at::Reduction::Sum, -100) *
           cp_loss_scale(*m.cp, all_labels, labels, false);
  at::Tensor loss = at::nll_loss(logprobs.view({-1, m.spec.vocab_size}), labels.reshape({-1}), {}, at::Reduction::Mean, -100);
  // transformers' MoE ForCausalLM: loss += router_aux_loss_coef * load_balancing_loss_func(router_logits, ...).
  if (m.moe_aux.enabled) loss = loss + moe_aux_loss(m.moe_aux, h);
  return loss;
}

at::Tensor llama_hidden(LlamaModel& m, const at::Tensor& input_ids) {
  ensure_caches(m, input_ids.size(1));
  at::Tensor h = run_blocks(m, embed(m, input_ids));
  return spec_norm(m.spec, h, m.norm);
}

at::Tensor llama_logits(LlamaModel& m, const at::Tensor& input_ids) { return head_logits(m, llama_hidden(m, input_ids)); }

at::Tensor llama_loss(LlamaModel& m, const at::Tensor& input_ids, const at::Tensor& labels) {
  return llama_head_loss(m, run_blocks(m, llama_embed(m, input_ids)), labels);
}

}  // namespace ftexec
