#!/usr/bin/env python3
"""An independent reference for ftexec: a small Llama (Qwen3, Qwen3-MoE, Mixtral, Qwen2-MoE, Gemma 2/3, Phi-3, OLMo 2, gpt-oss,
DeepSeek-V2/V3) and PEFT-style LoRA in plain PyTorch.

Written from the Hugging Face description of the architecture, never from ftexec's C++ model code,
so that the test in tests/executor/test_reference.cpp compares two implementations, not one with
itself. What each piece follows (files read, commit):

  transformers  src/transformers/models/llama/modeling_llama.py  @ 5dd4a63548857797727ae73eeb6a6e886ea02a3e
                LlamaRMSNorm (fp32 variance, cast back, then * weight), LlamaRotaryEmbedding (fp32
                inv_freq @ positions, cat(freqs, freqs), cos/sin cast to the compute dtype),
                rotate_half / apply_rotary_pos_emb, repeat_kv, eager_attention_forward (scaling
                head_dim**-0.5, additive causal mask of finfo.min, fp32 softmax), LlamaAttention
                (q/k/v/o biases = attention_bias), LlamaMLP (down(silu(gate(x)) * up(x)), mlp_bias),
                LlamaDecoderLayer (pre-norm residuals), LlamaForCausalLM (lm_head, tied or not).
  transformers  src/transformers/models/qwen3/modeling_qwen3.py  @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015
                Qwen3Attention: q_norm / k_norm = Qwen3RMSNorm(head_dim) on q_proj(x).view(..., -1, head_dim)
                and k_proj's, before the transpose and RoPE ("unlike olmo, only on the head dim").
  transformers  src/transformers/models/qwen3_moe/modeling_qwen3_moe.py  @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015
                Qwen3MoeSparseMoeBlock (gate = Linear(hidden, num_experts); softmax in fp32, topk,
                routing_weights /= sum when norm_topk_prob, cast back; a loop over the experts hit,
                each a Qwen3MoeMLP(moe_intermediate_size) on its tokens times their weight, index_add_),
                Qwen3MoeDecoderLayer (MoE when layer_idx not in mlp_only_layers and (layer_idx + 1) %
                decoder_sparse_step == 0, else Qwen3MoeMLP(intermediate_size)), load_balancing_loss_func
                (attention_mask None) and Qwen3MoeForCausalLM (loss += router_aux_loss_coef * aux_loss
                when output_router_logits).
  transformers  src/transformers/models/mixtral/modeling_mixtral.py  @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015
                MixtralDecoderLayer (the MoE block is `block_sparse_moe`), MixtralSparseMoeBlock (gate =
                Linear(hidden, num_local_experts); softmax in fp32, topk, routing_weights /= sum always, cast
                back; router_jitter_noise only when > 0, which the test's configs leave at 0), experts
                MixtralBlockSparseTop2MLP (w2(act(w1(x)) * w3(x)), width intermediate_size, no biases),
                MixtralAttention (no biases), load_balancing_loss_func and MixtralForCausalLM (loss +=
                router_aux_loss_coef * aux_loss when output_router_logits).
  transformers  src/transformers/models/qwen2_moe/modeling_qwen2_moe.py  @ 00a3f9386614dde0dc41cf4e9b8d0abd3af0671d
                Qwen2MoeAttention (q, k, v with bias=config.qkv_bias, True by default; o_proj without),
                Qwen2MoeSparseMoeBlock (Qwen3-MoE's routing with norm_topk_prob, default False; then
                shared_expert = Qwen2MoeMLP(shared_expert_intermediate_size) on every token, scaled by
                F.sigmoid(shared_expert_gate(x)), shared_expert_gate = Linear(hidden, 1, bias=False), added to
                the routed output), Qwen2MoeDecoderLayer (MoE when layer_idx not in mlp_only_layers and
                (layer_idx + 1) % decoder_sparse_step == 0, else Qwen2MoeMLP(intermediate_size)),
                load_balancing_loss_func ("Copied from ... mixtral"); configuration_qwen2_moe.py for defaults.
  transformers  src/transformers/modeling_rope_utils.py  @ 0044e3b3facff1a1ad60b235c69d5b45beae75a4
                _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
                _compute_llama3_parameters (wavelen bands, smooth interpolation).
  transformers  src/transformers/loss/loss_utils.py  @ 0114da07ec0e101b420a923dedeb6032b6ac3a44
                ForCausalLMLoss: logits.float(); `labels` are padded with -100 and shifted left by
                one, or `shift_labels` are used as given; mean cross-entropy, ignore_index -100.
  peft          src/peft/tuners/lora/layer.py  @ b28a09c44695163806dc2d560ec2faa1ce2949c5
                LoraLayer.update_layer (scaling = lora_alpha / r, or / sqrt(r) with use_rslora;
                dropout Identity when p = 0), Linear.forward
                (result = base(x) + lora_B(lora_A(dropout(x))) * scaling); saved adapter names are
                base_model.model.<module>.lora_A.weight ([r, in]) and .lora_B.weight ([out, r]).

The dense families beyond Llama (Gemma 2, Gemma 3 text, Phi-3/Phi-4, OLMo 2) have their own section,
FamilyConfig / FamilyForCausalLM, written from modeling_gemma2.py, modeling_gemma3.py, modeling_phi3.py and
modeling_olmo2.py; its header names the commits read. gpt-oss has its own too (GptOssForCausalLM, from
models/gpt_oss/modeling_gpt_oss.py @ 6edf5b311854175ff83c59179b3360beca1ceffc and _compute_yarn_parameters).
DeepSeek-V2/V3 too (DeepseekConfig / DeepseekForCausalLM, from modeling_deepseek_v2.py and modeling_deepseek_v3.py
at the commits its header names).

The optimizer is PyTorch's own torch.optim.AdamW and clipping torch.nn.utils.clip_grad_norm_.

Label convention: ftexec's data loader cuts windows of seq_len + 1 tokens and hands over labels
already shifted (labels[t] = the token after input_ids[t]); those are what HF's ForCausalLMLoss
calls `shift_labels`. A case file says `"labels_shifted": true` and the reference passes them as
shift_labels; with false it pads and shifts them as HF does for `labels` (the last position then
predicts nothing).

Commands (Debian 12: `apt-get install python3-torch`, torch 1.13):
  llama_reference.py compare CASE_DIR...   one forward, backward and AdamW step per case; see
                                           run_case() for the files read and written
  llama_reference.py bench --config C ...  the training loop timed the way ftexec times it
  llama_reference.py self-test             checks of the pieces that need no ftexec
Exit code 3: PyTorch is missing (the C++ test turns it into a failure naming the package).
"""

import argparse
import copy
import json
import math
import os
import resource
import statistics
import struct
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the test reports this, with the package to install
    print(f"llama_reference.py: PyTorch is missing ({e}); on Debian 12: apt-get install python3-torch",
          file=sys.stderr)
    sys.exit(3)


# ----------------------------------------------------------------------------------------------
# Safetensors, hand-written: Debian 12 packages no python3-safetensors, and the format is small
# (https://github.com/huggingface/safetensors#format): an 8-byte little-endian header length N,
# N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
# then the raw little-endian bytes, offsets relative to the end of the header.

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def safetensors_load(path):
    """Returns {name: tensor} (CPU, own memory) and the metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(data)} bytes)")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = bytearray(data[8 + n:])
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: {name}: dtype {info['dtype']} not handled")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        count = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != count * itemsize or end > len(body):
            raise ValueError(f"{path}: {name}: byte range [{begin}, {end}) does not hold shape {shape}")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(body, dtype=dtype, count=count, offset=begin).reshape(shape).clone()
    return tensors, metadata


def safetensors_save(path, tensors, metadata=None):
    """Writes {name: tensor} in the given order, atomically (temporary file, then rename)."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # pad so the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# The model, as LlamaConfig describes it.

class Config:
    """The config.json fields a Llama uses (transformers' LlamaConfig defaults where absent)."""

    def __init__(self, c):
        self.model_type = c.get("model_type", "llama")
        if self.model_type not in ("llama", "mistral", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe"):
            raise ValueError(f"model_type {self.model_type}: the reference covers llama, mistral, qwen3, qwen3_moe, "
                             "mixtral and qwen2_moe")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {c['hidden_act']}: the reference covers silu")
        self.vocab_size = c["vocab_size"]
        self.hidden_size = c["hidden_size"]
        self.intermediate_size = c["intermediate_size"]
        self.num_hidden_layers = c["num_hidden_layers"]
        self.num_attention_heads = c["num_attention_heads"]
        self.num_key_value_heads = c.get("num_key_value_heads") or self.num_attention_heads
        self.head_dim = c.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.rms_norm_eps = c.get("rms_norm_eps", 1e-6)
        self.rope_theta = c.get("rope_theta", 10000.0)
        self.rope_scaling = c.get("rope_scaling")
        self.attention_bias = c.get("attention_bias", False)
        self.mlp_bias = c.get("mlp_bias", False)
        self.tie_word_embeddings = c.get("tie_word_embeddings", False)  # LlamaConfig's default
        self.qk_norm = self.model_type in ("qwen3", "qwen3_moe")         # Qwen3Attention.q_norm / k_norm
        # Qwen3MoeConfig (configuration_qwen3_moe.py) defaults where absent.
        self.num_experts = c.get("num_experts", 0) if self.model_type == "qwen3_moe" else 0
        self.num_experts_per_tok = c.get("num_experts_per_tok", 8)
        self.moe_intermediate_size = c.get("moe_intermediate_size", 768)
        self.norm_topk_prob = c.get("norm_topk_prob", False)
        self.decoder_sparse_step = c.get("decoder_sparse_step", 1)
        self.mlp_only_layers = c.get("mlp_only_layers", [])
        self.router_aux_loss_coef = c.get("router_aux_loss_coef", 0.001)
        self.output_router_logits = c.get("output_router_logits", False)

        if self.model_type in ("mixtral", "qwen2_moe"):
            read_mixtral_or_qwen2_moe(self, c)

    def is_moe_layer(self, layer_idx):
        """Qwen3MoeDecoderLayer's rule."""
        return (layer_idx not in self.mlp_only_layers and self.num_experts > 0
                and (layer_idx + 1) % self.decoder_sparse_step == 0)


def merge_heads(x):
    """[b, heads, s, d] attention output -> [b, s, heads * d], the input of o_proj."""
    b, _, s, _ = x.shape
    return x.transpose(1, 2).contiguous().reshape(b, s, -1)


def acc_dtype(dtype):
    """HF upcasts RMSNorm, RoPE angles, softmax and the loss to fp32; the fp64 evaluation (the
    test's yardstick for rounding) keeps fp64 there too."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rope_inv_freq(cfg, dtype=torch.float32):
    """modeling_rope_utils: the inverse frequencies (head_dim / 2 values, in `dtype`: HF's fp32, or
    fp64 for the yardstick) after the scaling."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))
    scaling = cfg.rope_scaling
    rope_type = "default" if not scaling else scaling.get("rope_type", scaling.get("type"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor = scaling["factor"]                        # 8 in Llama 3.1
        low_freq_factor = scaling["low_freq_factor"]      # 1
        high_freq_factor = scaling["high_freq_factor"]    # 4
        old_context_len = scaling["original_max_position_embeddings"]  # 8192
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths are divided by factor, short ones kept, the band between interpolated
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)
    raise ValueError(f"rope_type {rope_type}: the reference covers default, linear and llama3")


def rotary_cos_sin(inv_freq, seq_len, dtype):
    """LlamaRotaryEmbedding.forward for positions 0..seq_len-1: angles in inv_freq's dtype (fp32 in
    HF), cos and sin cast to the compute `dtype`."""
    positions = torch.arange(seq_len, dtype=inv_freq.dtype)
    freqs = torch.outer(positions, inv_freq)              # [S, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)               # [S, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    """[B, kv_heads, S, D] -> [B, kv_heads * n_rep, S, D], each kv head repeated n_rep times in a row."""
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        input_dtype = x.dtype
        h = x.to(acc_dtype(x.dtype))
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(input_dtype)


class LoraLinear(nn.Module):
    """nn.Linear's parameters (weight [out, in], optional bias) plus, when r > 0, PEFT's adapter:
    y = x W^T + b + lora_B(lora_A(dropout(x))) * scaling."""

    def __init__(self, in_features, out_features, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.lora_A = None
        self.lora_B = None
        self.scaling = 0.0
        self.lora_dropout = nn.Identity()

    def add_lora(self, r, alpha, dropout, use_rslora):
        self.lora_A = nn.Linear(self.weight.shape[1], r, bias=False)
        self.lora_B = nn.Linear(r, self.weight.shape[0], bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / math.sqrt(r) if use_rslora else alpha / r
        self.lora_dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()

    def forward(self, x):
        result = F.linear(x, self.weight, self.bias)
        if self.lora_A is not None:
            result_dtype = result.dtype
            x = x.to(self.lora_A.weight.dtype)
            result = result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
            result = result.to(result_dtype)
        return result


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = d
        self.q_proj = LoraLinear(h, self.num_heads * d, cfg.attention_bias)
        self.k_proj = LoraLinear(h, self.num_kv_heads * d, cfg.attention_bias)
        self.v_proj = LoraLinear(h, self.num_kv_heads * d, cfg.attention_bias)
        self.o_proj = LoraLinear(self.num_heads * d, h, cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim)
        k = self.k_proj(x).view(b, s, -1, self.head_dim)
        if hasattr(self, "q_norm"):  # Qwen3: RMSNorm over head_dim, per head, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)  # [B, heads, S, D]
        k = k.transpose(1, 2)  # [B, kv_heads, S, D]
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos[None, None], sin[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5 + mask
        probs = F.softmax(scores, dim=-1, dtype=acc_dtype(q.dtype)).to(q.dtype)
        return self.o_proj(merge_heads(torch.matmul(probs, v)))


class MLP(nn.Module):
    def __init__(self, cfg, intermediate_size=None):
        super().__init__()
        h, i = cfg.hidden_size, intermediate_size or cfg.intermediate_size
        self.gate_proj = LoraLinear(h, i, cfg.mlp_bias)
        self.up_proj = LoraLinear(h, i, cfg.mlp_bias)
        self.down_proj = LoraLinear(i, h, cfg.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """Qwen3MoeSparseMoeBlock: a router over num_experts MLPs, each token run by its top-k; returns the
    output and the router logits."""

    def __init__(self, cfg):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))

    def forward(self, x):
        b, s, h = x.shape
        x = x.view(-1, h)
        router_logits = self.gate(x)
        routing_weights = F.softmax(router_logits, dim=1, dtype=acc_dtype(x.dtype))
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(x.dtype)
        out = torch.zeros((b * s, h), dtype=x.dtype)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)  # [E, k, T]
        for e in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[e])
            if top_x.numel() == 0:
                continue
            y = self.experts[e](x[top_x]) * routing_weights[top_x, idx, None]
            out = out.index_add(0, top_x, y.to(x.dtype))
        return out.view(b, s, h), router_logits


def load_balancing_loss(router_logits, num_experts, top_k):
    """load_balancing_loss_func with attention_mask None: over every MoE layer's logits together,
    num_experts * sum(fraction of (token, slot) pairs per expert * mean router probability)."""
    logits = torch.cat(router_logits, dim=0)
    routing_weights = F.softmax(logits, dim=-1)
    _, selected = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected, num_experts)
    tokens_per_expert = torch.mean(expert_mask.to(logits.dtype), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx=0):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = SparseMoeBlock(cfg) if cfg.is_moe_layer(layer_idx) else MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, router_logits):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        y = self.mlp(self.post_attention_layernorm(x))
        if isinstance(y, tuple):
            y, logits = y
            router_logits.append(logits)
        return x + y


# ----------------------------------------------------------------------------------------------
# Mixtral and Qwen2-MoE (modeling_mixtral.py, modeling_qwen2_moe.py): what differs from Qwen3-MoE.

def read_mixtral_or_qwen2_moe(cfg, c):
    """MixtralConfig / Qwen2MoeConfig keys and defaults (configuration_mixtral.py, configuration_qwen2_moe.py)."""
    if cfg.model_type == "mixtral":
        if c.get("router_jitter_noise", 0.0) or c.get("sliding_window") is not None:
            raise ValueError("mixtral: the reference covers router_jitter_noise 0 and sliding_window null")
        cfg.num_experts = c.get("num_local_experts", 8)
        cfg.num_experts_per_tok = c.get("num_experts_per_tok", 2)
        cfg.moe_intermediate_size = cfg.intermediate_size  # each expert is a MixtralBlockSparseTop2MLP(intermediate_size)
        cfg.norm_topk_prob = True                          # MixtralSparseMoeBlock renormalises always
        cfg.decoder_sparse_step, cfg.mlp_only_layers = 1, []
        cfg.attention_bias = False
    else:
        cfg.num_experts = c.get("num_experts", 60)
        cfg.num_experts_per_tok = c.get("num_experts_per_tok", 4)
        cfg.moe_intermediate_size = c.get("moe_intermediate_size", 1408)
        cfg.shared_expert_intermediate_size = c.get("shared_expert_intermediate_size", 5632)
        cfg.qkv_bias = c.get("qkv_bias", True)
        cfg.attention_bias = False  # o_proj has no bias; q, k, v are given theirs by Qwen2MoeDecoderLayer
    cfg.router_aux_loss_coef = c.get("router_aux_loss_coef", 0.001)


class MixtralExpert(nn.Module):
    """MixtralBlockSparseTop2MLP: w2(silu(w1(x)) * w3(x)), no biases."""

    def __init__(self, cfg):
        super().__init__()
        self.w1 = LoraLinear(cfg.hidden_size, cfg.moe_intermediate_size, False)
        self.w2 = LoraLinear(cfg.moe_intermediate_size, cfg.hidden_size, False)
        self.w3 = LoraLinear(cfg.hidden_size, cfg.moe_intermediate_size, False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(SparseMoeBlock):
    """MixtralSparseMoeBlock: the routing of SparseMoeBlock.forward (softmax in fp32, topk, renormalised since
    norm_topk_prob is True for Mixtral, cast back, each expert on its tokens, index_add), experts of w1/w3/w2."""

    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = True
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MixtralExpert(cfg) for _ in range(cfg.num_experts))


class MixtralDecoderLayer(DecoderLayer):
    """MixtralDecoderLayer: the same residual block, its MoE module named block_sparse_moe."""

    def __init__(self, cfg, layer_idx=0):
        nn.Module.__init__(self)
        self.self_attn = Attention(cfg)
        self.block_sparse_moe = MixtralSparseMoeBlock(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, router_logits):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        y, logits = self.block_sparse_moe(self.post_attention_layernorm(x))
        router_logits.append(logits)
        return x + y


class Qwen2MoeSparseMoeBlock(SparseMoeBlock):
    """Qwen2MoeSparseMoeBlock: the routed experts as Qwen3-MoE's, plus the shared expert on every token,
    scaled by sigmoid(shared_expert_gate(x)) and added."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.shared_expert = MLP(cfg, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        routed, router_logits = super().forward(x)
        flat = x.view(-1, h)
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return (routed.view(-1, h) + shared).view(b, s, h), router_logits


class Qwen2MoeDecoderLayer(DecoderLayer):
    """Qwen2MoeDecoderLayer: Qwen2MoeAttention (q, k, v biased by qkv_bias, o_proj not) and the sparse block on
    the layers Config.is_moe_layer picks, Qwen2MoeMLP(intermediate_size) elsewhere."""

    def __init__(self, cfg, layer_idx=0):
        nn.Module.__init__(self)
        self.self_attn = Attention(cfg)
        h, d = cfg.hidden_size, cfg.head_dim
        self.self_attn.q_proj = LoraLinear(h, cfg.num_attention_heads * d, cfg.qkv_bias)
        self.self_attn.k_proj = LoraLinear(h, cfg.num_key_value_heads * d, cfg.qkv_bias)
        self.self_attn.v_proj = LoraLinear(h, cfg.num_key_value_heads * d, cfg.qkv_bias)
        self.mlp = Qwen2MoeSparseMoeBlock(cfg) if cfg.is_moe_layer(layer_idx) else MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


DECODER_LAYERS = {"mixtral": MixtralDecoderLayer, "qwen2_moe": Qwen2MoeDecoderLayer}


class Backbone(nn.Module):
    """LlamaModel and every family's *Model: embed_tokens, layers, norm (the names the checkpoints carry)."""

    def __init__(self, cfg, layer=None, norm=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layer = layer or DECODER_LAYERS.get(cfg.model_type, DecoderLayer)
        self.layers = nn.ModuleList(layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = norm(cfg) if norm else RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Every family's *ForCausalLM: the backbone and lm_head, tied to embed_tokens when tie_word_embeddings."""

    def __init__(self, cfg, backbone):
        super().__init__()
        self.cfg = cfg
        self.model = backbone
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # one Parameter, two uses


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg):
        super().__init__(cfg, Backbone(cfg))

    def init_weights(self, seed):
        """HF's _init_weights: linears and the embedding N(0, 0.02), biases 0, norms 1."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "lora_" in name:
                    continue
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    def forward(self, input_ids):
        """Logits [B, S, vocab] in the compute dtype."""
        s = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(rope_inv_freq(self.cfg, acc_dtype(x.dtype)), s, x.dtype)
        mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        self.router_logits = []
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, self.router_logits)
        return self.lm_head(self.model.norm(x))

    def aux_loss(self):
        """Qwen3MoeForCausalLM: router_aux_loss_coef * load_balancing_loss_func(...) when
        output_router_logits, else 0 (after a forward)."""
        if not (self.cfg.output_router_logits and self.router_logits):
            return 0.0
        return self.cfg.router_aux_loss_coef * load_balancing_loss(self.router_logits, self.cfg.num_experts,
                                                                   self.cfg.num_experts_per_tok)


def causal_lm_loss(logits, labels=None, shift_labels=None, ignore_index=-100):
    """ForCausalLMLoss: mean cross-entropy in fp32 over the labels that are not ignore_index."""
    logits = logits.to(acc_dtype(logits.dtype))
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), shift_labels.reshape(-1), ignore_index=ignore_index)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED_TARGETS = ("qkv_proj", "gate_up_proj")  # Phi-3's fused projections, PEFT targets as whole modules
MLA_TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")  # DeepSeek's latent attention


def lora_modules(model, targets):
    for i, layer in enumerate(model.model.layers):
        for name in targets:
            parent = layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj") + MLA_TARGETS else layer.mlp
            if not hasattr(parent, name):  # a MoE layer has no dense gate/up/down_proj
                raise ValueError(f"target {name}: layer {i} has no such linear (the reference puts LoRA on no expert)")
            prefix = "self_attn" if parent is layer.self_attn else "mlp"
            yield f"model.layers.{i}.{prefix}.{name}", getattr(parent, name)


def attach_lora(model, adapter_config):
    """PEFT's LoraModel on the named targets; returns {PEFT save name: Parameter}."""
    targets = adapter_config["target_modules"]
    if isinstance(targets, str):
        targets = LORA_TARGETS if targets == "all-linear" else [targets]
    unknown = set(targets) - set(LORA_TARGETS) - set(FUSED_TARGETS) - set(MLA_TARGETS)
    if unknown:
        raise ValueError(f"target_modules {sorted(unknown)}: not a Llama block linear")
    named = {}
    for module_name, module in lora_modules(model, targets):
        module.add_lora(adapter_config["r"], adapter_config["lora_alpha"], adapter_config.get("lora_dropout", 0.0),
                        adapter_config.get("use_rslora", False))
        named[f"base_model.model.{module_name}.lora_A.weight"] = module.lora_A.weight
        named[f"base_model.model.{module_name}.lora_B.weight"] = module.lora_B.weight
    return named


def load_weights(model, tensors):
    """HF checkpoint names onto the model; every name and shape must match (lm_head.weight may be
    absent, or equal to embed_tokens, when tied)."""
    params = dict(model.named_parameters())  # tied: lm_head.weight appears once, as embed_tokens
    problems = []
    for name, p in params.items():
        if "lora_" in name:
            continue
        if name not in tensors:
            problems.append(f"{name}: missing")
        elif tuple(tensors[name].shape) != tuple(p.shape):
            problems.append(f"{name}: shape {list(tensors[name].shape)}, expected {list(p.shape)}")
    for name in tensors:
        if name not in params and not (name == "lm_head.weight" and model.cfg.tie_word_embeddings):
            problems.append(f"{name}: not a parameter of this config")
    if problems:
        raise ValueError("weights do not match the config: " + "; ".join(problems))
    with torch.no_grad():
        for name, p in params.items():
            if "lora_" not in name:
                p.copy_(tensors[name])
        if model.cfg.tie_word_embeddings and "lm_head.weight" in tensors:
            if not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
                raise ValueError("tie_word_embeddings is true but lm_head.weight differs from embed_tokens")


def load_adapter(named, tensors):
    problems = [f"{n}: missing" for n in named if n not in tensors]
    problems += [f"{n}: not an adapter of this config" for n in tensors if n not in named]
    problems += [f"{n}: shape {list(tensors[n].shape)}, expected {list(p.shape)}"
                 for n, p in named.items() if n in tensors and tensors[n].shape != p.shape]
    if problems:
        raise ValueError("adapter does not match its config: " + "; ".join(problems))
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(tensors[n])


def trainable_parameters(model, lora_named):
    """Full fine-tuning: every base parameter (tied head once); LoRA: the adapters only. By the
    name a checkpoint (HF) or adapter file (PEFT) gives it."""
    if lora_named:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in lora_named.values():
            p.requires_grad_(True)
        return dict(lora_named)
    return {n: p for n, p in model.named_parameters() if "lora_" not in n}


# ----------------------------------------------------------------------------------------------
# The dense families beyond Llama: Gemma 2, Gemma 3 (text), Phi-3/Phi-4 and OLMo 2, each written from
# its transformers modeling file (read at the commits below; never from ftexec's C++):
#
#   models/gemma2/modeling_gemma2.py  @ 006e86931247d7bacf94ad00ada1fb6baf11e94b
#       Gemma2RMSNorm (x.float() * rsqrt(mean(x^2) + eps) * (1 + weight.float()), then type_as(x)),
#       Gemma2MLP (down(act(gate(x)) * up(x)), act = hidden_activation), eager_attention_forward
#       (scores * query_pre_attn_scalar**-0.5; / softcap, tanh, * softcap; + mask; fp32 softmax),
#       Gemma2DecoderLayer (is_sliding = not bool(layer_idx % 2); the sliding mask
#       tril(ones, diagonal=-sliding_window) on top of the causal one; x + post_attention_layernorm(
#       attn(input_layernorm(x))), then x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))),
#       Gemma2Model (hidden * torch.tensor(hidden_size**0.5, dtype=hidden.dtype)), Gemma2ForCausalLM
#       (logits / final_logit_softcapping, tanh, * final_logit_softcapping).
#   models/gemma3/modeling_gemma3.py  @ 0018aa647bb13801f061e2d1027c326f531b59fb
#       Gemma3Attention: Gemma2's, plus q_norm / k_norm = Gemma3RMSNorm(head_dim) on the heads before
#       RoPE; Gemma3RotaryEmbedding per layer type (sliding_attention: rope_local_base_freq, default
#       RoPE; full_attention: rope_theta with rope_scaling); Gemma3TextScaledWordEmbedding
#       (embed * embed_scale.to(weight.dtype)). configuration_gemma3.py: layer i slides when
#       (i + 1) % sliding_window_pattern != 0.
#   models/phi3/modeling_phi3.py  @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015
#       Phi3Attention (qkv = qkv_proj(x); q | k | v along the features), Phi3MLP (gate, up =
#       gate_up_proj(x).chunk(2, dim=-1); down(up * act(gate))), Phi3RMSNorm (Llama's), the Llama
#       decoder layer (resid_pdrop 0), sliding_window on every layer.
#   models/olmo2/modeling_olmo2.py  @ 000c33fdfde12e1ffafbfcdb3c926df5727a00b6
#       Olmo2RMSNorm ((weight * x_fp32 * rsqrt(...)).to(input_dtype)), Olmo2Attention (q_norm(q_proj(x))
#       over heads * head_dim and k_norm over kv_heads * head_dim, before the head split),
#       Olmo2DecoderLayer (x + post_attention_layernorm(attn(x)), x + post_feedforward_layernorm(mlp(x))).
#   masking_utils.py sliding_window_overlay: a key is visible when kv_idx > q_idx - sliding_window
#       (the same window as Gemma 2's tril mask).

DENSE_FAMILIES = ("gemma2", "gemma3_text", "phi3", "olmo2")


class FamilyConfig:
    """The config.json fields of a dense family beyond Llama, with its config class's defaults where absent
    (Gemma2Config, Gemma3TextConfig, Phi3Config, Olmo2Config)."""

    def __init__(self, c):
        t = c["model_type"]
        if t not in DENSE_FAMILIES:
            raise ValueError(f"model_type {t}: not one of {DENSE_FAMILIES}")
        self.model_type = t
        self.gemma = t in ("gemma2", "gemma3_text")
        self.vocab_size = c["vocab_size"]
        self.hidden_size = c["hidden_size"]
        self.intermediate_size = c["intermediate_size"]
        self.num_hidden_layers = c["num_hidden_layers"]
        self.num_attention_heads = c["num_attention_heads"]
        self.num_key_value_heads = c.get("num_key_value_heads") or self.num_attention_heads
        self.head_dim = c.get("head_dim") or (256 if self.gemma else self.hidden_size // self.num_attention_heads)
        self.rms_norm_eps = c.get("rms_norm_eps", 1e-6)
        self.rope_theta = c.get("rope_theta", 1000000.0 if t == "gemma3_text" else 10000.0)
        self.rope_scaling = c.get("rope_scaling")
        self.attention_bias = c.get("attention_bias", False)
        self.tie_word_embeddings = c.get("tie_word_embeddings", self.gemma)
        act = c.get("hidden_activation") if self.gemma else None
        self.hidden_act = act or c.get("hidden_act", "gelu_pytorch_tanh" if self.gemma else "silu")
        if self.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"hidden_act {self.hidden_act}: the reference covers silu and gelu_pytorch_tanh")
        if c.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor: the reference rotates the whole head_dim")
        self.query_pre_attn_scalar = c.get("query_pre_attn_scalar", 256) if self.gemma else None
        soft = {"gemma2": (50.0, 30.0)}.get(t, (None, None))
        self.attn_logit_softcapping = c.get("attn_logit_softcapping", soft[0])
        self.final_logit_softcapping = c.get("final_logit_softcapping", soft[1])
        self.sliding_window = c.get("sliding_window", 4096 if self.gemma else None)
        n = self.num_hidden_layers
        if t == "gemma2":
            self.sliding = [not bool(i % 2) for i in range(n)]
        elif t == "gemma3_text":
            pattern = c.get("sliding_window_pattern", 6)
            self.sliding = c.get("layer_types") and [x == "sliding_attention" for x in c["layer_types"]] or \
                [bool((i + 1) % pattern) for i in range(n)]
        elif t == "phi3":
            self.sliding = [self.sliding_window is not None] * n
        else:
            self.sliding = [False] * n
        self.rope_local_base_freq = c.get("rope_local_base_freq", 10000.0) if t == "gemma3_text" else None


class GemmaRMSNorm(RMSNorm):
    """Gemma2RMSNorm / Gemma3RMSNorm: the scale is 1 + weight, applied in fp32 before the cast back."""

    def forward(self, x):
        acc = acc_dtype(x.dtype)
        h = x.to(acc)
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.to(acc))).type_as(x)


class Olmo2RMSNorm(RMSNorm):
    """Olmo2RMSNorm: weight times the fp32 normalised input, then the cast back."""

    def forward(self, x):
        h = x.to(acc_dtype(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


def family_norm(cfg, size):
    if cfg.gemma:
        return GemmaRMSNorm(size, cfg.rms_norm_eps)
    if cfg.model_type == "olmo2":
        return Olmo2RMSNorm(size, cfg.rms_norm_eps)
    return RMSNorm(size, cfg.rms_norm_eps)  # Phi3RMSNorm is Llama's


def family_act(cfg, x):
    return F.gelu(x, approximate="tanh") if cfg.hidden_act == "gelu_pytorch_tanh" else F.silu(x)


class FamilyAttention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        if cfg.model_type == "phi3":  # Phi3Attention: one projection, bias=False
            self.qkv_proj = LoraLinear(h, (self.num_heads + 2 * self.num_kv_heads) * d, False)
        else:
            self.q_proj = LoraLinear(h, self.num_heads * d, cfg.attention_bias)
            self.k_proj = LoraLinear(h, self.num_kv_heads * d, cfg.attention_bias)
            self.v_proj = LoraLinear(h, self.num_kv_heads * d, cfg.attention_bias)
        self.o_proj = LoraLinear(self.num_heads * d, h, cfg.attention_bias and cfg.model_type != "phi3")
        if cfg.model_type == "gemma3_text":
            self.q_norm, self.k_norm = GemmaRMSNorm(d, cfg.rms_norm_eps), GemmaRMSNorm(d, cfg.rms_norm_eps)
        elif cfg.model_type == "olmo2":
            self.q_norm = Olmo2RMSNorm(self.num_heads * d, cfg.rms_norm_eps)
            self.k_norm = Olmo2RMSNorm(self.num_kv_heads * d, cfg.rms_norm_eps)
        self.scaling = (cfg.query_pre_attn_scalar if cfg.gemma else d) ** -0.5
        self.softcap = cfg.attn_logit_softcapping

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        d = self.head_dim
        if hasattr(self, "qkv_proj"):
            qkv = self.qkv_proj(x)
            qp, kvp = self.num_heads * d, self.num_kv_heads * d
            q, k, v = qkv[..., :qp], qkv[..., qp:qp + kvp], qkv[..., qp + kvp:]
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.cfg.model_type == "olmo2":  # over the whole projection, before the head split
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, -1, d).transpose(1, 2)
        k = k.view(b, s, -1, d).transpose(1, 2)
        v = v.reshape(b, s, -1, d).transpose(1, 2)
        if self.cfg.model_type == "gemma3_text":  # per head, after the transpose, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos[None, None], sin[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if self.softcap is not None:
            scores = scores / self.softcap
            scores = torch.tanh(scores)
            scores = scores * self.softcap
        scores = scores + mask
        probs = F.softmax(scores, dim=-1, dtype=acc_dtype(q.dtype)).to(q.dtype)
        return self.o_proj(merge_heads(torch.matmul(probs, v)))


class FamilyMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.cfg = cfg
        if cfg.model_type == "phi3":
            self.gate_up_proj = LoraLinear(h, 2 * i, False)
        else:
            self.gate_proj = LoraLinear(h, i, False)
            self.up_proj = LoraLinear(h, i, False)
        self.down_proj = LoraLinear(i, h, False)

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(up * family_act(self.cfg, gate))
        return self.down_proj(family_act(self.cfg, self.gate_proj(x)) * self.up_proj(x))


class FamilyDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.cfg = cfg
        self.is_sliding = cfg.sliding[layer_idx] and cfg.sliding_window is not None
        self.self_attn = FamilyAttention(cfg, layer_idx)
        self.mlp = FamilyMLP(cfg)
        h = cfg.hidden_size
        if cfg.model_type != "olmo2":
            self.input_layernorm = family_norm(cfg, h)
        self.post_attention_layernorm = family_norm(cfg, h)
        if cfg.gemma:
            self.pre_feedforward_layernorm = family_norm(cfg, h)
        if cfg.gemma or cfg.model_type == "olmo2":
            self.post_feedforward_layernorm = family_norm(cfg, h)

    def forward(self, x, ropes, masks):
        cos, sin = ropes["sliding" if self.is_sliding else "full"]
        mask = masks["sliding" if self.is_sliding else "full"]
        t = self.cfg.model_type
        if t == "phi3":  # Llama's layer
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
            return x + self.mlp(self.post_attention_layernorm(x))
        if t == "olmo2":
            x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin, mask))
            return x + self.post_feedforward_layernorm(self.mlp(x))
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class FamilyForCausalLM(CausalLM):
    def __init__(self, cfg):
        super().__init__(cfg, Backbone(cfg, FamilyDecoderLayer, lambda c: family_norm(c, c.hidden_size)))

    def forward(self, input_ids):
        cfg = self.cfg
        s = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        if cfg.gemma:
            x = x * torch.tensor(cfg.hidden_size ** 0.5, dtype=x.dtype)
        full = rotary_cos_sin(rope_inv_freq(cfg, acc_dtype(x.dtype)), s, x.dtype)
        ropes = {"full": full, "sliding": full}
        if cfg.rope_local_base_freq is not None:
            local = copy.copy(cfg)
            local.rope_theta, local.rope_scaling = cfg.rope_local_base_freq, None
            ropes["sliding"] = rotary_cos_sin(rope_inv_freq(local, acc_dtype(x.dtype)), s, x.dtype)
        q_idx = torch.arange(s)[:, None]
        kv_idx = torch.arange(s)[None, :]
        minimum = torch.finfo(x.dtype).min
        causal = kv_idx <= q_idx
        window = cfg.sliding_window if cfg.sliding_window is not None else s + 1
        visible = {"full": causal, "sliding": causal & (kv_idx > q_idx - window)}
        masks = {k: torch.zeros((s, s), dtype=x.dtype).masked_fill(~v, minimum) for k, v in visible.items()}
        for layer in self.model.layers:
            x = layer(x, ropes, masks)
        logits = self.lm_head(self.model.norm(x))
        if cfg.final_logit_softcapping is not None:
            logits = logits / cfg.final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * cfg.final_logit_softcapping
        return logits

    def aux_loss(self):
        return 0.0


# ----------------------------------------------------------------------------------------------
# gpt-oss, written from transformers' files (read at these commits; never from ftexec's C++):
#
#   models/gpt_oss/modeling_gpt_oss.py  @ 6edf5b311854175ff83c59179b3360beca1ceffc
#       GptOssRMSNorm ((weight * x_fp32 * rsqrt(mean(x^2) + eps)).to(input_dtype)), GptOssExperts.forward (the
#       CPU / training branch: a loop over the experts hit; gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e];
#       gate, up = gate_up[..., ::2], gate_up[..., 1::2]; gate.clamp(max=limit), up.clamp(-limit, limit);
#       glu = gate * sigmoid(gate * 1.702); (up + 1) * glu @ down_proj[e] + down_proj_bias[e]; times the
#       routing weight; index_add_), GptOssTopKRouter (F.linear(x, weight, bias); topk; softmax over the k
#       values in their dtype; router_scores = zeros.scatter_(1, indices, values)), GptOssMLP (returns
#       router_scores, which the model records as its "router_logits"), GptOssRotaryEmbedding (cos/sin of
#       inv_freq @ positions in fp32, times attention_scaling, cast), _apply_rotary_emb (chunk in halves:
#       first * cos - second * sin, second * cos + first * sin), eager_attention_forward (scores * head_dim**-0.5
#       + mask; cat with sinks.reshape(1, -1, 1, 1) as a last column; minus the row max; softmax in the logits'
#       dtype; drop the sink column), GptOssAttention (q/k/v/o bias=attention_bias; sliding_window on
#       layer_types[i] == "sliding_attention"), GptOssDecoderLayer, load_balancing_loss_func,
#       GptOssForCausalLM (loss += router_aux_loss_coef * aux_loss when output_router_logits).
#       The expert clamp: GptOssExperts hard-codes limit 7.0 at this commit, integrations/mxfp4.py
#       (@ 93a1c400417fd8e89db9f42f8b2265e97265d75a) reads getattr(config, "swiglu_limit", 7.0): config's, as here.
#   modeling_rope_utils.py _compute_yarn_parameters (the version that reads rope_scaling["truncate"], as
#       gpt-oss's config has it): attention_factor = get_mscale(factor) = 0.1 ln(factor) + 1 when absent;
#       beta_fast / beta_slow 32 / 1; find_correction_range over original_max_position_embeddings (floor /
#       ceil only when truncate); inv_freq = inv_freq_interpolation * (1 - extrapolation_factor) +
#       inv_freq_extrapolation * extrapolation_factor, extrapolation_factor = 1 - linear_ramp_factor.

def yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow, truncate, acc):
    """YaRN's inverse frequencies (transformers' _compute_yarn_parameters; DeepSeek's yarn_find_correction_range):
    interpolated by `factor` below the correction range, extrapolated above it, a linear ramp between."""
    def find_correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=acc) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(acc) / dim)
    extrapolation_factor = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor


def gpt_oss_rope(cfg, seq_len, dtype):
    """GptOssRotaryEmbedding for positions 0..seq_len-1: (cos, sin) [S, head_dim / 2] in the compute dtype."""
    acc = acc_dtype(dtype)
    base, dim = cfg.rope_theta, cfg.head_dim
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type", "default")) != "yarn":
        raise ValueError("gpt_oss: the reference covers rope_type yarn")
    factor = rs["factor"]
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1
    original = rs.get("original_max_position_embeddings") or cfg.max_position_embeddings

    inv_freq = yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow, rs.get("truncate", True), acc)
    freqs = torch.outer(torch.arange(seq_len, dtype=acc), inv_freq)
    return (freqs.cos() * attention_factor).to(dtype), (freqs.sin() * attention_factor).to(dtype)


def gpt_oss_apply_rotary(x, cos, sin):
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class GptOssConfig:
    """GptOssConfig's fields (configuration_gpt_oss.py defaults where absent)."""

    def __init__(self, c):
        self.model_type = "gpt_oss"
        self.vocab_size = c["vocab_size"]
        self.hidden_size = c["hidden_size"]
        self.intermediate_size = c["intermediate_size"]
        self.num_hidden_layers = c["num_hidden_layers"]
        self.num_attention_heads = c["num_attention_heads"]
        self.num_key_value_heads = c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.max_position_embeddings = c["max_position_embeddings"]
        self.rms_norm_eps = c.get("rms_norm_eps", 1e-5)
        self.rope_theta = c.get("rope_theta", 150000.0)
        self.rope_scaling = c.get("rope_scaling")
        self.attention_bias = c.get("attention_bias", True)
        self.sliding_window = c.get("sliding_window", 128)
        self.layer_types = c.get("layer_types") or [
            "sliding_attention" if bool((i + 1) % 2) else "full_attention" for i in range(self.num_hidden_layers)]
        self.num_local_experts = c["num_local_experts"]
        self.num_experts_per_tok = c["num_experts_per_tok"]
        self.swiglu_limit = c.get("swiglu_limit", 7.0)
        self.router_aux_loss_coef = c.get("router_aux_loss_coef", 0.9)
        self.output_router_logits = c.get("output_router_logits", False)
        self.tie_word_embeddings = c.get("tie_word_embeddings", False)


class GptOssRMSNorm(RMSNorm):
    def forward(self, x):
        h = x.to(acc_dtype(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


class GptOssAttention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = LoraLinear(h, self.num_heads * d, cfg.attention_bias)
        self.k_proj = LoraLinear(h, self.num_kv_heads * d, cfg.attention_bias)
        self.v_proj = LoraLinear(h, self.num_kv_heads * d, cfg.attention_bias)
        self.o_proj = LoraLinear(self.num_heads * d, h, cfg.attention_bias)
        self.sinks = nn.Parameter(torch.empty(self.num_heads))

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = gpt_oss_apply_rotary(q, cos[None, None], sin[None, None]), gpt_oss_apply_rotary(k, cos[None, None], sin[None, None])
        n_rep = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5 + mask
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(b, -1, s, -1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = F.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
        return self.o_proj(merge_heads(torch.matmul(probs, v)))


class GptOssTopKRouter(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(cfg.num_local_experts, cfg.hidden_size))
        self.bias = nn.Parameter(torch.empty(cfg.num_local_experts))

    def forward(self, x):
        logits = F.linear(x, self.weight, self.bias)
        top_value, top_index = torch.topk(logits, self.top_k, dim=-1)
        top_value = F.softmax(top_value, dim=1, dtype=top_value.dtype)
        return torch.zeros_like(logits).scatter_(1, top_index, top_value), top_index


class GptOssExperts(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.down_proj = nn.Parameter(torch.empty(e, i, h))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))
        self.alpha, self.limit = 1.702, cfg.swiglu_limit

    def forward(self, x, router_indices, routing_weights):
        num_experts = routing_weights.shape[1]
        out = torch.zeros_like(x)
        expert_mask = F.one_hot(router_indices, num_classes=num_experts + 1).permute(2, 1, 0)
        for e in range(num_experts):
            _, token_idx = torch.where(expert_mask[e])
            if token_idx.numel() == 0:
                continue
            gate_up = x[token_idx] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            glu = gate * torch.sigmoid(gate * self.alpha)
            y = ((up + 1) * glu) @ self.down_proj[e] + self.down_proj_bias[e]
            out = out.index_add(0, token_idx, (y * routing_weights[token_idx, e, None]).to(x.dtype))
        return out


class GptOssMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.router = GptOssTopKRouter(cfg)
        self.experts = GptOssExperts(cfg)

    def forward(self, x):
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        scores, indices = self.router(flat)
        return self.experts(flat, indices, scores).view(b, s, h), scores


class GptOssDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.self_attn = GptOssAttention(cfg, layer_idx)
        self.mlp = GptOssMLP(cfg)
        self.input_layernorm = GptOssRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GptOssRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention_type = cfg.layer_types[layer_idx]

    def forward(self, x, cos, sin, masks, router_logits):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, masks[self.attention_type])
        y, scores = self.mlp(self.post_attention_layernorm(x))
        router_logits.append(scores)
        return x + y


class GptOssForCausalLM(CausalLM):
    def __init__(self, cfg):
        super().__init__(cfg, Backbone(cfg, GptOssDecoderLayer, lambda c: GptOssRMSNorm(c.hidden_size, c.rms_norm_eps)))

    def forward(self, input_ids):
        s = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        cos, sin = gpt_oss_rope(self.cfg, s, x.dtype)
        q_idx, kv_idx = torch.arange(s)[:, None], torch.arange(s)[None, :]
        causal = kv_idx <= q_idx
        visible = {"full_attention": causal, "sliding_attention": causal & (kv_idx > q_idx - self.cfg.sliding_window)}
        minimum = torch.finfo(x.dtype).min
        masks = {k: torch.zeros((s, s), dtype=x.dtype).masked_fill(~v, minimum) for k, v in visible.items()}
        self.router_logits = []
        for layer in self.model.layers:
            x = layer(x, cos, sin, masks, self.router_logits)
        return self.lm_head(self.model.norm(x))

    def aux_loss(self):
        if not (self.cfg.output_router_logits and self.router_logits):
            return 0.0
        return self.cfg.router_aux_loss_coef * load_balancing_loss(self.router_logits, self.cfg.num_local_experts,
                                                                   self.cfg.num_experts_per_tok)


# ----------------------------------------------------------------------------------------------
# DeepSeek-V2 and DeepSeek-V3, each written from its transformers modeling file (read at the commits below;
# never from ftexec's C++):
#
#   models/deepseek_v2/modeling_deepseek_v2.py  @ 03eac6f6d2af7e8562113f0b78d3d2d59a7d843d
#       DeepseekV2Attention (q_proj, or q_b_proj(q_a_layernorm(q_a_proj(x))); kv_a_proj_with_mqa split into the
#       latent and k_pe; kv_b_proj(kv_a_layernorm(latent)) split per head into k_nope and v; apply_rotary_emb on
#       q_pe and the one k_pe as complex numbers (view_as_complex of interleaved pairs, freqs_cis = polar(1, freqs),
#       in fp32, then type_as); q = cat(q_nope, q_pe), k = cat(k_nope, k_pe.expand); scaling qk_head_dim**-0.5;
#       o_proj), DeepseekV2RMSNorm (default eps 1e-6 for q_a_layernorm / kv_a_layernorm), DeepseekV2MoEGate
#       (fp32 logits F.linear(x.float(), weight.float()), softmax; "greedy" topk or "group_limited_greedy": groups
#       ranked by their max score, topk_group kept, the rest masked to 0; topk_weight * routed_scaling_factor; no
#       aux loss returned), DeepseekV2MoE (experts on their tokens, weights in fp32, .sum(1), cast back; + the
#       shared_experts MLP of moe_intermediate_size * n_shared_experts on every token), DeepseekV2DecoderLayer (MoE
#       when layer_idx >= first_k_dense_replace, else DeepseekV2MLP(intermediate_size)).
#   models/deepseek_v3/modeling_deepseek_v3.py  @ f5a9ec512fa9fe69e51ea0c6388c68d50de567b3
#       DeepseekV3RotaryEmbedding (cat(freqs, freqs) cos/sin cast to the compute dtype), apply_rotary_pos_emb_interleave
#       (q.view(d // 2, 2).transpose(4, 3).reshape(d), then rotate-half) when rope_interleave, else
#       apply_rotary_pos_emb; DeepseekV3Attention (as V2; q_a_proj path); DeepseekV3TopkRouter (sigmoid of fp32
#       logits; get_topk_indices under no_grad: scores + e_score_correction_bias (a buffer), groups ranked by the
#       sum of their top-2, topk_group kept, the rest masked to 0, topk; weights gathered from the unbiased
#       scores, / (sum + 1e-20) when norm_topk_prob, * routed_scaling_factor); DeepseekV3MoE (fp32
#       final_hidden_states, index_add of expert_output * weight, cast back; + shared_experts).
#   configuration_deepseek_v3.py @ 001f85b38fb432858ace93f18622f07cec46d874: the defaults (n_group 8, topk_group 4,
#       norm_topk_prob True, routed_scaling_factor 2.5, rope_interleave True).

DEEPSEEK = ("deepseek_v2", "deepseek_v3")


def yarn_get_mscale(scale=1, mscale=1):
    # modeling_deepseek_v3.py @ f5a9ec51 (and modeling_rope_utils.py's get_mscale)
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def deepseek_yarn(cfg, acc):
    """DeepseekV2/V3RotaryEmbedding with rope_type yarn: ROPE_INIT_FUNCTIONS["yarn"], i.e. modeling_rope_utils.py
    _compute_yarn_parameters in the version that reads mscale / mscale_all_dim (it carries the note "DeekSeek-V3 (and
    potentially other models) modify max_position_embeddings ..."): factor = max_position_embeddings /
    original_max_position_embeddings when the latter is given; attention_factor = get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim) when both are set, else get_mscale(factor); beta_fast / beta_slow 32 / 1;
    floor / ceil of the correction range over original_max_position_embeddings. dim = head_dim = qk_rope_head_dim.
    Returns (inv_freq [dim / 2], attention_factor)."""
    rs, base, dim = cfg.yarn, cfg.rope_theta, cfg.qk_rope_head_dim
    factor = rs["factor"]
    if "original_max_position_embeddings" in rs:
        original = rs["original_max_position_embeddings"]
        factor = cfg.max_position_embeddings / original
    else:
        original = cfg.max_position_embeddings
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = yarn_get_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    return yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow, True, acc), attention_factor


class DeepseekConfig:
    def __init__(self, c):
        t = c["model_type"]
        if t not in DEEPSEEK:
            raise ValueError(f"model_type {t}: not one of {DEEPSEEK}")
        self.model_type = t
        v3 = t == "deepseek_v3"
        rs = c.get("rope_scaling")
        if rs is not None and rs.get("rope_type", rs.get("type")) != "yarn":
            raise ValueError("deepseek: the reference covers rope_scaling null or yarn")
        self.vocab_size, self.hidden_size = c["vocab_size"], c["hidden_size"]
        self.intermediate_size, self.moe_intermediate_size = c["intermediate_size"], c["moe_intermediate_size"]
        self.num_hidden_layers, self.num_attention_heads = c["num_hidden_layers"], c["num_attention_heads"]
        self.q_lora_rank, self.kv_lora_rank = c.get("q_lora_rank"), c["kv_lora_rank"]
        self.qk_nope_head_dim, self.qk_rope_head_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        self.v_head_dim = c["v_head_dim"]
        self.head_dim = self.qk_rope_head_dim  # the config classes' head_dim: what RoPE rotates
        self.n_routed_experts, self.n_shared_experts = c["n_routed_experts"], c.get("n_shared_experts")
        self.num_experts_per_tok = c["num_experts_per_tok"]
        self.first_k_dense_replace = c.get("first_k_dense_replace", 3 if v3 else 0)
        self.rms_norm_eps = c.get("rms_norm_eps", 1e-6)
        self.rope_theta, self.rope_scaling = c.get("rope_theta", 10000.0), None
        self.max_position_embeddings = c.get("max_position_embeddings", 2048)
        self.yarn = rs  # None, or the rope_scaling dict of a yarn config (deepseek_yarn)
        # DeepseekV3Attention.__init__ (@ f5a9ec51): with rope_scaling and a non-zero mscale_all_dim,
        # scaling = qk_head_dim**-0.5 * yarn_get_mscale(rope_scaling["factor"], mscale_all_dim)**2; DeepseekV2Attention
        # (@ 03eac6f6) keeps qk_head_dim**-0.5.
        self.softmax_mult = 1.0
        if v3 and rs is not None and rs.get("mscale_all_dim", 0):
            m = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
            self.softmax_mult = m * m
        self.tie_word_embeddings = c.get("tie_word_embeddings", False)
        self.routed_scaling_factor = c.get("routed_scaling_factor", 2.5 if v3 else 1.0)
        self.topk_method = c.get("topk_method", "noaux_tc" if v3 else "greedy")
        self.n_group = c.get("n_group", 8 if v3 else None)
        self.topk_group = c.get("topk_group", 4 if v3 else None)
        self.norm_topk_prob = c.get("norm_topk_prob", True if v3 else False)
        self.rope_interleave = c.get("rope_interleave", True)
        self.mlp_bias = c.get("mlp_bias", False) if not v3 else False  # DeepseekV2MLP: config.mlp_bias; V3: none


class DeepseekAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, H = cfg.hidden_size, cfg.num_attention_heads
        self.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = LoraLinear(h, H * self.qk_head_dim, False)
        else:
            self.q_a_proj = LoraLinear(h, cfg.q_lora_rank, False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
            self.q_b_proj = LoraLinear(cfg.q_lora_rank, H * self.qk_head_dim, False)
        self.kv_a_proj_with_mqa = LoraLinear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim, False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)
        self.kv_b_proj = LoraLinear(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), False)
        self.o_proj = LoraLinear(H * cfg.v_head_dim, h, False)

    def rope(self, q_pe, k_pe, freqs):
        """V2: complex rotation of interleaved pairs in fp32; V3: (interleave then) rotate-half with cos/sin in the
        compute dtype."""
        if self.cfg.model_type == "deepseek_v2":
            freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * self.cfg.attention_factor  # [S, rope / 2], complex
            acc = acc_dtype(q_pe.dtype)

            def rot(x):
                xc = torch.view_as_complex(x.to(acc).reshape(*x.shape[:-1], -1, 2))
                return torch.view_as_real(xc * freqs_cis[None, None]).flatten(3).type_as(x)
            return rot(q_pe), rot(k_pe)
        emb = torch.cat((freqs, freqs), dim=-1)
        af = self.cfg.attention_factor  # DeepseekV3RotaryEmbedding: cos and sin * attention_scaling, then cast
        cos, sin = (emb.cos() * af).to(q_pe.dtype)[None, None], (emb.sin() * af).to(q_pe.dtype)[None, None]
        if self.cfg.rope_interleave:
            def inter(x):
                b, hh, s, d = x.shape
                return x.view(b, hh, s, d // 2, 2).transpose(4, 3).reshape(b, hh, s, d)
            q_pe, k_pe = inter(q_pe), inter(k_pe)
        return q_pe * cos + rotate_half(q_pe) * sin, k_pe * cos + rotate_half(k_pe) * sin

    def forward(self, x, freqs, mask):
        cfg = self.cfg
        b, s, _ = x.shape
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, s, -1, self.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        compressed = self.kv_a_proj_with_mqa(x)
        k_lat, k_pe = torch.split(compressed, [cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(k_lat)).view(b, s, -1, cfg.qk_nope_head_dim + cfg.v_head_dim)
        k_nope, v = torch.split(kv.transpose(1, 2), [cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k_pe = k_pe.view(b, 1, s, cfg.qk_rope_head_dim)
        q_pe, k_pe = self.rope(q_pe, k_pe, freqs)
        k_pe = k_pe.expand(*k_nope.shape[:-1], -1)
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe), dim=-1)
        scores = torch.matmul(q, k.transpose(2, 3)) * (self.qk_head_dim ** -0.5 * cfg.softmax_mult) + mask
        probs = F.softmax(scores, dim=-1, dtype=acc_dtype(q.dtype)).to(q.dtype)
        return self.o_proj(merge_heads(torch.matmul(probs, v)))


class DeepseekGate(nn.Module):
    """DeepseekV2MoEGate / DeepseekV3TopkRouter: returns (indices [T, k], weights [T, k] fp32)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        if cfg.model_type == "deepseek_v3":
            self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))

    def forward(self, x):
        cfg = self.cfg
        E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        acc = acc_dtype(x.dtype)
        logits = F.linear(x.type(acc), self.weight.type(acc), None)
        if cfg.model_type == "deepseek_v2":
            scores = logits.softmax(dim=-1, dtype=acc)
            if cfg.topk_method == "greedy":
                weight, idx = torch.topk(scores, k=k, dim=-1, sorted=False)
            elif cfg.topk_method == "group_limited_greedy":
                group_scores = scores.view(x.shape[0], cfg.n_group, -1).max(dim=-1).values
                group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
                group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
                score_mask = group_mask.unsqueeze(-1).expand(x.shape[0], cfg.n_group, E // cfg.n_group).reshape(x.shape[0], -1)
                weight, idx = torch.topk(scores.masked_fill(~score_mask.bool(), 0.0), k=k, dim=-1, sorted=False)
            else:
                raise ValueError(f"deepseek_v2: topk_method {cfg.topk_method}")
            return idx, weight * cfg.routed_scaling_factor
        scores = logits.sigmoid()
        with torch.no_grad():
            choice = scores.view(-1, E) + self.e_score_correction_bias.to(acc).unsqueeze(0)
            group_scores = choice.view(-1, cfg.n_group, E // cfg.n_group).topk(2, dim=-1)[0].sum(dim=-1)
            group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(-1, cfg.n_group, E // cfg.n_group).reshape(-1, E)
            idx = torch.topk(choice.masked_fill(~score_mask.bool(), 0.0), k=k, dim=-1, sorted=False)[1]
        weight = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, weight * cfg.routed_scaling_factor


class DeepseekMoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.experts = nn.ModuleList(MLP(cfg, cfg.moe_intermediate_size) for _ in range(cfg.n_routed_experts))
        self.gate = DeepseekGate(cfg)
        if cfg.n_shared_experts is not None:
            self.shared_experts = MLP(cfg, cfg.moe_intermediate_size * cfg.n_shared_experts)

    def forward(self, x):
        b, s, h = x.shape
        flat = x.view(-1, h)
        idx, weight = self.gate(flat)
        out = torch.zeros((b * s, h), dtype=weight.dtype)  # DeepseekV3MoE: fp32 final_hidden_states
        for e in range(self.cfg.n_routed_experts):
            token, slot = torch.where(idx == e)
            if token.numel() == 0:
                continue
            out.index_add_(0, token, self.experts[e](flat[token]) * weight[token, slot, None])
        y = out.type(x.dtype).view(b, s, h)
        if hasattr(self, "shared_experts"):
            y = y + self.shared_experts(x)
        return y


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.self_attn = DeepseekAttention(cfg)
        self.mlp = DeepseekMoE(cfg) if layer_idx >= cfg.first_k_dense_replace else MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, freqs, mask):
        x = x + self.self_attn(self.input_layernorm(x), freqs, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekForCausalLM(CausalLM):
    def __init__(self, cfg):
        super().__init__(cfg, Backbone(cfg, DeepseekDecoderLayer))

    def forward(self, input_ids):
        s = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        if self.cfg.yarn is not None:
            inv_freq, self.cfg.attention_factor = deepseek_yarn(self.cfg, acc_dtype(x.dtype))
        else:
            inv_freq, self.cfg.attention_factor = rope_inv_freq(self.cfg, acc_dtype(x.dtype)), 1.0  # head_dim = rope
        freqs = torch.outer(torch.arange(s, dtype=inv_freq.dtype), inv_freq)  # [S, rope / 2]
        mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        for layer in self.model.layers:
            x = layer(x, freqs, mask)
        return self.lm_head(self.model.norm(x))

    def aux_loss(self):
        return 0.0  # neither DeepSeek MoE computes a load-balancing loss in transformers


def load_deepseek_weights(model, tensors):
    """load_weights, and the buffers (e_score_correction_bias) by name."""
    tensors = dict(tensors)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name not in tensors:
                raise ValueError(f"weights do not match the config: {name}: missing")
            buf.copy_(tensors.pop(name))
    load_weights(model, tensors)


# ----------------------------------------------------------------------------------------------
# compare: one case of the C++ test.

def hf_decay_parameter_names(model, names):
    """Hugging Face Trainer.get_decay_parameter_names: get_parameter_names(model, ALL_LAYERNORM_LAYERS,
    ["bias", "layernorm", "rmsnorm"]) -- every parameter except those of normalisation modules and
    those whose name holds one of the forbidden words (transformers trainer.py and
    trainer_pt_utils.get_parameter_names). Adapters (PEFT names) are decayed."""
    in_norms = set()
    for module_name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            for param_name, _ in module.named_parameters(recurse=False):
                in_norms.add(f"{module_name}.{param_name}" if module_name else param_name)
    forbidden = ("bias", "layernorm", "rmsnorm")
    return {n for n in names if n not in in_norms and not any(f in n.lower() for f in forbidden)}


def adamw_step(named_params, decayed, case):
    """clip_grad_norm_ (when max_grad_norm > 0), then one torch.optim.AdamW step over Hugging Face
    Trainer's two parameter groups: weight decay on `decayed`, none on the rest."""
    params = [p for _, p in named_params]
    if case.get("max_grad_norm", 0.0) > 0:
        torch.nn.utils.clip_grad_norm_(params, case["max_grad_norm"])
    a = case["adamw"]
    groups = [{"params": [p for n, p in named_params if n in decayed], "weight_decay": a["weight_decay"]},
              {"params": [p for n, p in named_params if n not in decayed], "weight_decay": 0.0}]
    torch.optim.AdamW([g for g in groups if g["params"]], lr=a["lr"], betas=(a["beta1"], a["beta2"]),
                      eps=a["eps"]).step()


def forward_backward(model, trainable, input_ids, labels, labels_shifted):
    logits = model(input_ids)
    if labels_shifted:
        loss = causal_lm_loss(logits, shift_labels=labels)
    else:
        loss = causal_lm_loss(logits, labels=labels)
    loss = loss + model.aux_loss()
    loss.backward()
    return logits.detach(), loss.item(), {n: p.grad.detach().clone() for n, p in trainable.items()}


def build(case, path, dtype):
    with open(path("config")) as f:
        config = json.load(f)
    if config.get("model_type") in DENSE_FAMILIES:
        model = FamilyForCausalLM(FamilyConfig(config))
    elif config.get("model_type") == "gpt_oss":
        model = GptOssForCausalLM(GptOssConfig(config))
    elif config.get("model_type") in DEEPSEEK:
        model = DeepseekForCausalLM(DeepseekConfig(config))
    else:
        model = LlamaForCausalLM(Config(config))
    if config.get("model_type") in DEEPSEEK:
        load_deepseek_weights(model, safetensors_load(path("weights"))[0])
    else:
        load_weights(model, safetensors_load(path("weights"))[0])
    lora_named = {}
    if case.get("adapter_dir"):
        with open(os.path.join(path("adapter_dir"), "adapter_config.json")) as f:
            adapter_config = json.load(f)
        lora_named = attach_lora(model, adapter_config)
        load_adapter(lora_named, safetensors_load(os.path.join(path("adapter_dir"), "adapter_model.safetensors"))[0])
    model.to(dtype)
    model.train()
    return model, trainable_parameters(model, lora_named)


def run_case(case_dir):
    """Reads <case_dir>/case.json:
         {"config": "config.json", "weights": "model.safetensors", "adapter_dir": "adapter" | null,
          "batch": "batch.safetensors" (input_ids, labels: int64 [B, S]), "labels_shifted": true,
          "adamw": {"lr", "beta1", "beta2", "eps", "weight_decay"}, "max_grad_norm": 1.0 (0: off),
          "given_grads": "ftexec_grads.safetensors" (optional), "threads": 1,
          "out": "reference.safetensors", "out_json": "reference.json"}
       Writes <out>, per trainable parameter by its HF / PEFT name:
         "logits" [B, S, vocab] (fp32); "grad.<name>" the gradient (before clipping) and
         "after.<name>" the value after clipping and one AdamW step, both in fp32;
         "grad64.<name>" and "logits64": the same forward and backward in fp64 (a yardstick for
         the rounding of both fp32 implementations);
         "after_given.<name>": one step from the same start with the gradients of <given_grads>
         instead (the optimizer alone, on identical inputs);
       and <out_json>: {"loss", "loss64", "grad_norm" (before clipping), "trainable": [names]}."""
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    path = lambda key: os.path.join(case_dir, case[key])  # noqa: E731
    torch.set_num_threads(case.get("threads", 1))
    batch = safetensors_load(path("batch"))[0]
    input_ids, labels = batch["input_ids"].long(), batch["labels"].long()
    shifted = case.get("labels_shifted", True)

    model, trainable = build(case, path, torch.float32)
    before = {n: p.detach().clone() for n, p in trainable.items()}
    logits, loss, grads = forward_backward(model, trainable, input_ids, labels, shifted)
    grad_norm = torch.norm(torch.stack([g.norm(2) for g in grads.values()]), 2).item()
    decayed = hf_decay_parameter_names(model, trainable)
    adamw_step(list(trainable.items()), decayed, case)
    out = {"logits": logits.float()}
    out.update({f"grad.{n}": g for n, g in grads.items()})
    out.update({f"after.{n}": p.detach().clone() for n, p in trainable.items()})

    model64, trainable64 = build(case, path, torch.float64)
    logits64, loss64, grads64 = forward_backward(model64, trainable64, input_ids, labels, shifted)
    out["logits64"] = logits64
    out.update({f"grad64.{n}": g for n, g in grads64.items()})

    if case.get("given_grads"):
        given = safetensors_load(path("given_grads"))[0]
        params = []
        for n, value in before.items():
            p = value.clone().requires_grad_(True)
            p.grad = given[n].to(p.dtype)
            params.append((n, p))
        adamw_step(params, decayed, case)
        out.update({f"after_given.{n}": p.detach() for n, p in params})

    safetensors_save(path("out"), out)
    with open(path("out_json"), "w") as f:
        json.dump({"loss": loss, "loss64": loss64, "grad_norm": grad_norm, "trainable": list(trainable),
                   "decayed": sorted(decayed)}, f, indent=1)


# ----------------------------------------------------------------------------------------------
# bench: the training loop on synthetic tokens, timed like ftexec (median step after warm-up).

def live_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def profiled_step_peak(step):
    """Peak of the bytes allocated during one step, over what was live when it began: PyTorch's
    profiler records every CPU allocation and free ("[memory]" events with their byte counts, in
    the kineto results; prof.events() folds most into the ops). LIBTORCH-NOTES.md: a counting
    allocator and this hook agreed to the byte on a Linear + GELU step."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_us()):
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def bench(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    with open(args.config) as f:
        cfg = Config(json.load(f))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]
    model = LlamaForCausalLM(cfg)
    model.init_weights(args.seed)
    lora_named = {}
    if args.method == "lora":
        targets = LORA_TARGETS if args.lora_targets == "all-linear" else args.lora_targets.split(",")
        lora_named = attach_lora(model, {"target_modules": list(targets), "r": args.lora_rank,
                                         "lora_alpha": args.lora_alpha, "lora_dropout": 0.0})
    model.to(dtype)
    trainable = list(trainable_parameters(model, lora_named).values())
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)

    def step():
        tokens = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len + 1), generator=g)
        logits = model(tokens[:, :-1])
        loss = causal_lm_loss(logits, shift_labels=tokens[:, 1:])
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=False)  # as ftexec: gradients stay allocated
        return loss.item()

    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    timed = times[args.warmup:] or times
    step_time_s = statistics.median(timed)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    start_bytes = live_bytes(list(model.parameters()) + [p.grad for p in trainable] + state)
    peak_step_bytes = profiled_step_peak(step) if args.tensor_peak else 0
    result = {
        "implementation": "reference (PyTorch %s, tests/reference/llama_reference.py)" % torch.__version__,
        "method": args.method, "precision": args.precision, "threads": torch.get_num_threads(),
        "micro_batch": args.micro_batch, "seq_len": args.seq_len, "steps": args.steps, "warmup": args.warmup,
        "step_time_s": step_time_s, "step_times_s": timed,
        "tokens_per_s": args.micro_batch * args.seq_len / step_time_s,
        "loss": losses,
        "tensor_peak_bytes": start_bytes + peak_step_bytes if args.tensor_peak else None,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


# ----------------------------------------------------------------------------------------------
# self-test: pieces checked against hand-computed values.

def self_test():
    # llama3 rope: with head_dim 16, theta 10000, original 512, low 1, high 4, factor 8 the eight
    # wavelengths 2*pi*10000^(2i/16) are 6.3, 19.9, 62.8 (< 128: kept), 198.7 (between 128 and 512:
    # smoothed), 628 ... 19869 (> 512: divided by 8).
    cfg = Config({"vocab_size": 8, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
                  "num_attention_heads": 4, "rope_theta": 10000.0,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 512}})
    base = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).double() / 16))
    got = rope_inv_freq(cfg).double()
    assert torch.allclose(got[:3], base[:3], rtol=1e-6), got
    assert torch.allclose(got[4:], base[4:] / 8, rtol=1e-6), got
    s = (512 / (2 * math.pi / base[3]) - 1) / 3
    assert abs(got[3] - ((1 - s) * base[3] / 8 + s * base[3])) < 1e-6 * base[3], got
    # labels: HF's unshifted `labels` equal `shift_labels` = labels[1:] + [-100]
    logits = torch.randn(2, 5, 7)
    labels = torch.randint(0, 7, (2, 5))
    shifted = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1)
    assert torch.allclose(causal_lm_loss(logits, labels=labels), causal_lm_loss(logits, shift_labels=shifted))
    # safetensors round trip
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        t = {"a": torch.randn(3, 4), "b": torch.randn(5).bfloat16(), "c": torch.arange(6).reshape(2, 3)}
        safetensors_save(os.path.join(d, "t.safetensors"), t)
        back, _ = safetensors_load(os.path.join(d, "t.safetensors"))
        assert all(torch.equal(t[k], back[k]) for k in t)
    print("llama_reference.py self-test: ok")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="run the test's cases (folders holding case.json)")
    c.add_argument("cases", nargs="+")
    b = sub.add_parser("bench", help="time the reference's training loop")
    b.add_argument("--config", required=True, help="HF config.json")
    b.add_argument("--method", choices=["full", "lora"], default="full")
    b.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: everything bf16")
    b.add_argument("--lora-rank", type=int, default=16)
    b.add_argument("--lora-alpha", type=float, default=32)
    b.add_argument("--lora-targets", default="q_proj,v_proj", help="a comma list or all-linear")
    b.add_argument("--seq-len", type=int, default=256)
    b.add_argument("--micro-batch", type=int, default=1)
    b.add_argument("--steps", type=int, default=4)
    b.add_argument("--warmup", type=int, default=1, help="steps left out of the timings (ftexec's default)")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--lr", type=float, default=1e-4)
    b.add_argument("--max-grad-norm", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--tensor-peak", action="store_true", help="one more, profiled step for the tensor-level peak")
    b.add_argument("--out", help="write the result JSON here (else stdout)")
    sub.add_parser("self-test")
    args = p.parse_args()
    if args.command == "compare":
        for case in args.cases:
            run_case(case)
    elif args.command == "bench":
        bench(args)
    else:
        self_test()


if __name__ == "__main__":
    main()
