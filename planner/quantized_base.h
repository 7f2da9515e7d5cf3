// A base model whose weights the checkpoint stores quantised (config.json's quantization_config):
// bitsandbytes 4- or 8-bit, GPTQ, AWQ. LoRA on such a base is planned like QLoRA: the block linears
// stay frozen in the stored format, each dequantised to the compute dtype where it is used.
// The bytes of one quantised linear are what the checkpoint holds for it, tensor by tensor:
//   bitsandbytes 4-bit (NF4 or FP4): two codes per byte + absmax per block of 64 (nf4_storage_bytes,
//               precision.h: 4.127 bits per weight with double quantisation, 4.5 without)
//   bitsandbytes 8-bit (LLM.int8): int8 CB [out, in] + fp32 SCB [out] (one scale per output row)
//   GPTQ (AutoGPTQ / GPTQModel "gptq" checkpoint format; AutoGPTQ
//               auto_gptq/nn_modules/qlinear/qlinear_triton.py at 4b7393cd, register_buffer):
//               qweight int32 [in·bits/32, out], qzeros int32 [ceil(in/g), out·bits/32],
//               scales fp16 [ceil(in/g), out], g_idx int32 [in]; g = in when group_size is -1
//   AWQ (AutoAWQ WQLinear_GEMM, awq/modules/linear/gemm.py at 030fe2a1): qweight int32
//               [in, out·bits/32], qzeros int32 [in/g, out·bits/32], scales fp16 [in/g, out]
//   mxfp4 (gpt-oss; transformers integrations/mxfp4.py, Mxfp4HfQuantizer): the routed experts only, each
//               weight as *_blocks uint8 [out, in/32, 16] (two e2m1 codes per byte) + *_scales uint8
//               [out, in/32] (one e8m0 exponent per 32 weights): 4.25 bits per weight; the expert biases,
//               attention, router, embedding and head stay bf16 (modules_to_not_convert)
// A bias stays in the model's dtype (it is counted with the frozen weights).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ftplan {

struct QuantizedBase {
  std::string method;         // quantization_config.quant_method: "bitsandbytes", "gptq", "awq"; "" = not quantised
  int bits = 16;              // bits per weight code, e.g. 4 (GPTQ/AWQ 4-bit, bnb 4-bit) or 8 (LLM.int8)
  int64_t group_size = 0;     // weights per scale along the input: GPTQ/AWQ e.g. 128 (-1: the whole input
                              // row), bitsandbytes 4-bit 64 (its block), 8-bit 0 (one scale per output row)
  bool double_quant = false;  // bitsandbytes 4-bit: bnb_4bit_use_double_quant (absmaxes quantised to 8 bits)
  std::string format;         // "nf4"/"fp4" (bnb 4-bit), "int8" (bnb 8-bit), "gptq"/"gptq_v2", "gemm" (AWQ)
  double bytes_per_weight = 2;  // the stored bytes of a 4096×4096 linear divided by its weights, e.g. 0.5625
                                // (GPTQ 4-bit, group 128); for display, the estimates use the exact bytes
  bool experts_only = false;  // mxfp4: only the routed experts are stored quantised
  std::vector<std::string> modules;  // the block linears stored quantised (all of them; mxfp4: the experts')

  bool active() const { return !method.empty(); }
  std::string describe() const;  // e.g. "gptq 4-bit, group 128 (4.53 bits per weight as stored)"
};

// Reads a config.json's quantization_config; InputError naming "<where>.quantization_config.<key>" for a
// method, format or key this model does not describe (never silently counted as bf16). `has_experts`:
// the model is a mixture of experts (mxfp4 quantises experts only, so a dense model's mxfp4 is refused).
QuantizedBase quantized_base_from_json(const nlohmann::json& q, const std::string& where, bool has_experts = false);

// Exact bytes the checkpoint stores for one quantised linear of in × out weights (no bias).
int64_t quantized_linear_bytes(const QuantizedBase& q, int64_t in_features, int64_t out_features);

}  // namespace ftplan
