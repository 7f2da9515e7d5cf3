// mxfp4 (OCP Microscaling FP4): how gpt-oss's Hugging Face checkpoints store the routed experts, and its
// dequantisation to a training dtype as transformers does it (src/transformers/integrations/mxfp4.py @
// 93a1c400417fd8e89db9f42f8b2265e97265d75a, convert_moe_packed_tensors and FP4_VALUES).
// A weight W [E, out, in] is stored as
//   <name>_blocks uint8 [E, out, in / 32, 16]: two e2m1 codes per byte, the low nibble first (element 2j is
//                 byte j's low 4 bits, element 2j + 1 its high 4 bits); code c is FP4_VALUES[c] =
//                 +0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6
//   <name>_scales uint8 [E, out, in / 32]: one e8m0 exponent per 32 weights, the block's scale 2^(s - 127)
// and dequantised W = FP4_VALUES[code] * 2^(s - 127), returned transposed to GptOssExperts' input-major layout
// [E, in, out] (convert_moe_packed_tensors ends with out.transpose(1, 2)). Every value is a power of two times a
// code with two significant bits, exact in bf16 and fp32 alike.
#pragma once

#include <ATen/ATen.h>

namespace ftexec {

// blocks uint8 [E, out, G, 16], scales uint8 [E, out, G] -> [E, G * 32, out] in `dtype` (contiguous, CPU).
at::Tensor mxfp4_dequantize(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype);

}  // namespace ftexec
